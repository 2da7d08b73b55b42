"""Typed objects that cross process boundaries inside the cluster (gateway ↔ workers).

The OpenAI-shaped pydantic models live at the edge (router/openai/); once a request is
validated and tokenized it becomes an `EngineRequest`, and only these frozen dataclasses
travel between Ray Serve deployments. They are plain data so Ray can pickle them cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence


class InvalidEngineRequest(ValueError):
    """An engine refused the request itself (vLLM's own checks, e.g. a regex its structured-
    output backend cannot compile). The client's error: the gateway answers 400 with this
    message and does not retry."""


@dataclass(frozen=True)
class StructuredOutput:
    """A decoding-time constraint, applied by the decode engine from its first token.

    kind "json" (spec: a JSON schema, serialized), "json_object" (spec unused), "regex",
    "choice" (spec: a JSON list of strings) or "grammar" (EBNF/Lark). The prefill engine
    never sees it: its one sampled token is discarded and the prompt's KV does not depend
    on it.
    """

    kind: str
    spec: str = ""


@dataclass(frozen=True)
class SamplingSettings:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off (vLLM's -1/0)
    min_p: float = 0.0
    seed: Optional[int] = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    # None: no logprobs; k >= 0: the sampled token's logprob plus the k most likely.
    logprobs: Optional[int] = None
    structured: Optional[StructuredOutput] = None


@dataclass(frozen=True)
class EngineRequest:
    """A tokenized request. `prompt_token_ids` already has the chat template applied."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingSettings
    tier: Optional[str] = None  # None: the cluster's default tier
    # vLLM's prefix-cache salt (its tenant's, auth.prefix_cache isolate): prompts of different
    # salts never share cached blocks. Both hops pass it, so both engines hash alike.
    cache_salt: Optional[str] = None


@dataclass(frozen=True)
class PrefillResult:
    """What a prefill worker hands back: the opaque NIXL handoff for the decode worker, and
    with first-token reuse the answer's first token (kv_transfer/first_token.py). None
    params: the first token ended the answer, nothing to hand over."""

    request_id: str
    kv_transfer_params: Optional[dict[str, Any]]
    worker_id: str
    num_prompt_tokens: int
    first: Optional["TokenChunk"] = None
    # When the prefill engine's lease on the blocks ends (wall clock, minus a margin; see
    # kv_transfer/handoff.py); None: unknown.
    lease_deadline: Optional[float] = None


@dataclass(frozen=True)
class TopLogprob:
    token_id: int
    token: str  # the token's text as the engine decoded it
    logprob: float


@dataclass(frozen=True)
class TokenLogprob:
    """The sampled token's logprob and the `SamplingSettings.logprobs` most likely ones."""

    token_id: int
    token: str
    logprob: float
    top: tuple[TopLogprob, ...] = ()


@dataclass(frozen=True)
class TokenChunk:
    """One streamed step of a decode. Deltas, plus running totals for usage."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: Optional[str] = None  # "stop" | "length" | "abort" | "error"
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    # One entry per token in token_ids when the request asked for logprobs, else empty.
    logprobs: tuple[TokenLogprob, ...] = ()


def merge_chunks(chunks: "Sequence[TokenChunk]") -> TokenChunk:
    """Consecutive deltas of one stream as one: texts, ids and logprobs joined, the last
    chunk's finish reason and running totals."""
    last = chunks[-1]
    return TokenChunk(
        text="".join(c.text for c in chunks),
        token_ids=tuple(t for c in chunks for t in c.token_ids),
        finish_reason=last.finish_reason,
        num_prompt_tokens=last.num_prompt_tokens,
        num_output_tokens=last.num_output_tokens,
        logprobs=tuple(lp for c in chunks for lp in c.logprobs),
    )


@dataclass(frozen=True)
class RouteTrace:
    """How a request was served; counted in metrics and returned to tests."""

    path: str  # "disaggregated" | "fallback_recompute"
    prefill_worker: Optional[str] = None
    decode_worker: Optional[str] = None
    fallback_reason: Optional[str] = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TierPools:
    """The two pools of one tier, as Ray Serve handles (bound applications at build time)."""

    prefill: Any
    decode: Any
