"""Typed objects that cross process boundaries inside the cluster (gateway ↔ workers).

The OpenAI edge is vLLM's own serving code (router/openai/); it renders a request into token
ids and vLLM `SamplingParams`, which travel inside an `EngineRequest`. The engines answer with
vLLM's own `RequestOutput`s (DELTA: each carries only its new tokens), which go back to vLLM's
serving code unchanged, so responses are built exactly as `vllm serve` builds them.

Across Ray, an EngineRequest's SamplingParams travel pickled inside it (`ReceivedSampling`) and
are unpickled where an engine first reads them whole: importing vLLM costs a process ~8 s of
CPU, and a replica whose engine never needs vLLM (FakeEngine, tests/serve/) never imports it.
"""

from __future__ import annotations

import copy
import dataclasses
import pickle
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Sequence

if TYPE_CHECKING:  # the gateway and workers import vLLM; this module stays light for tests
    from vllm.outputs import RequestOutput
    from vllm.sampling_params import SamplingParams

    from kv_transfer.handoff import Handoff


class InvalidEngineRequest(ValueError):
    """An engine refused the request itself (vLLM's own checks, e.g. a regex its structured-
    output backend cannot compile). The client's error: the gateway answers 400 with this
    message and does not retry."""


class ReceivedSampling:
    """A request's vLLM SamplingParams as they arrived from another process: pickled, and
    unpickled on the first `params()`. What replica code reads without vLLM (an answer's
    length, vLLM's `extra_args`, i.e. `vllm_xargs`) is readable as on SamplingParams."""

    __slots__ = ("max_tokens", "extra_args", "_pickled", "_params")

    def __init__(self, max_tokens: Optional[int], extra_args: Optional[dict[str, Any]], pickled: bytes):
        self.max_tokens = max_tokens
        self.extra_args = extra_args
        self._pickled = pickled
        self._params: Optional["SamplingParams"] = None

    @classmethod
    def of(cls, sampling: "SamplingParams | ReceivedSampling") -> "ReceivedSampling":
        if isinstance(sampling, ReceivedSampling):
            return sampling
        return cls(sampling.max_tokens, sampling.extra_args, pickle.dumps(sampling, protocol=pickle.HIGHEST_PROTOCOL))

    def params(self) -> "SamplingParams":
        if self._params is None:
            self._params = pickle.loads(self._pickled)
        return self._params

    def __reduce__(self):
        return (ReceivedSampling, (self.max_tokens, self.extra_args, self._pickled))


@dataclass(frozen=True)
class EngineRequest:
    """A rendered request: `prompt_token_ids` has the chat template applied, `sampling` is what
    vLLM's serving code made of the body (generation_config defaults included), with n == 1:
    the gateway fans n > 1 out into one EngineRequest per sample (router/pd/samples.py).

    Made in the gateway, with SamplingParams; in the replica that receives it `sampling` is a
    ReceivedSampling (module docstring), which `sampling_params` unpickles."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: "SamplingParams | ReceivedSampling"
    tier: str  # chosen once, where the request enters (the edge: router/openai/edge.py)
    # vLLM's prefix-cache salt (its tenant's, auth.prefix_cache isolate): prompts of different
    # salts never share cached blocks. Both hops pass it, so both engines hash alike.
    cache_salt: Optional[str] = None
    # The W3C traceparent of the gateway's span for this hop, when the request is traced
    # (cluster/tracing.py): the replica's span joins the trace under it. None: not traced.
    traceparent: Optional[str] = None
    # The LoRA adapter the request names by `model` (model.lora_adapters): both hops run with
    # it, and it is part of every prompt block's hash, as in vLLM. None: the base model.
    adapter: Optional["Adapter"] = None

    def __reduce__(self):
        return (EngineRequest, (self.request_id, self.prompt_token_ids, ReceivedSampling.of(self.sampling),
                                self.tier, self.cache_salt, self.traceparent, self.adapter))


@dataclass(frozen=True)
class Adapter:
    """A LoRA adapter as vLLM's LoRARequest names it: `id` is the gateway's number for it (vLLM's
    serving code numbers the configured adapters in order), the same in every engine."""

    name: str
    id: int
    path: str

    def lora_request(self) -> Any:
        from vllm.lora.request import LoRARequest

        return LoRARequest(lora_name=self.name, lora_int_id=self.id, lora_path=self.path)


def sampling_params(request: EngineRequest) -> "SamplingParams":
    """The request's vLLM SamplingParams, wherever the request was made."""
    sampling = request.sampling
    return sampling.params() if isinstance(sampling, ReceivedSampling) else sampling


@dataclass(frozen=True)
class PrefillResult:
    """What a prefill worker hands back: the opaque NIXL handoff for the decode worker, and
    with first-token reuse the answer's first token (kv_transfer/first_token.py). None
    params: the first token ended the answer, nothing to hand over."""

    request_id: str
    kv_transfer_params: Optional[dict[str, Any]]
    worker_id: str
    num_prompt_tokens: int
    first: Optional["RequestOutput"] = None
    # The prompt's logprobs when the request asked for them: computed where the prompt is.
    prompt_logprobs: Optional[list] = None
    # kv_transfer_params in the envelope decode checks, stamped by the prefill replica with its
    # engine's identity and lease deadline (kv_transfer/handoff.py); the gateway carries it
    # unopened. None: nothing to hand over (the answer ended on its first token).
    handoff: Optional["Handoff"] = None


def new_token_ids(output: "RequestOutput") -> Sequence[int]:
    """The tokens a DELTA output adds (one sample per engine request)."""
    return output.outputs[0].token_ids if output.outputs else ()


def finish_reason(output: "RequestOutput") -> Optional[str]:
    """None while the request runs; else vLLM's reason ("stop", "length", "abort", ...), and
    "error" for a finished output without one (vLLM's failed KV load under policy fail)."""
    if not output.finished:
        return None
    reason = output.outputs[0].finish_reason if output.outputs else None
    return reason or "error"


def merge_outputs(outputs: Sequence["RequestOutput"]) -> "RequestOutput":
    """Consecutive DELTA outputs of one request as one, without touching the inputs."""
    merged = copy.copy(outputs[0])
    merged.outputs = [dataclasses.replace(c, token_ids=list(c.token_ids),
                                          logprobs=None if c.logprobs is None else list(c.logprobs))
                      for c in outputs[0].outputs]
    for later in outputs[1:]:
        merged.add(later, aggregate=True)
    return merged
