"""PDEngineClient: vLLM's EngineClient over tandem's prefill/decode path.

vLLM's own OpenAI serving code (chat, completions, responses, tokenize, ...) renders each
request with the model's renderer, then calls `engine_client.generate(prompt, params, id)` and
builds the response from the RequestOutputs it yields. This class is that engine client: it
checks the request as vLLM's AsyncLLM would (its InputProcessor, so a bad parameter fails the
same way), turns it into an EngineRequest for the tier the edge chose (router/openai/context.py)
and streams what the backend — metrics → admission → the P/D path (router/pd/path.py), each
a router/backend.py Backend — yields.

Outputs come from the engines as DELTAs without their prompt; here they get the prompt back,
the caller's request id, and, for FINAL_ONLY or CUMULATIVE callers, are aggregated as vLLM's
output collector would.

Lifecycle: built once per gateway replica from the VllmConfig of the served model (no engine,
no weights: config, tokenizer, renderer); `generate` and `abort` any number of times,
concurrently; `shutdown` releases the renderer's thread pools.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncGenerator, Awaitable, Callable, Mapping, Optional

from vllm.engine.protocol import EngineClient
from vllm.exceptions import GenerationError
from vllm.renderers import renderer_from_config
from vllm.sampling_params import RequestOutputKind, SamplingParams
from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError
from vllm.v1.engine.input_processor import InputProcessor

from cluster.protocol import Adapter, EngineRequest, merge_outputs
from router.backend import Backend
from router.openai.context import CURRENT, RequestContext
from router.openai.errors import OpenAIError

log = logging.getLogger(__name__)


# The rate-limit hook: (the caller's tenant as the edge authenticated it, None for an open API;
# the request's token cost: prompt + max_tokens × n) → awaitable None, or an OpenAIError 429 to
# refuse (router/ratelimit.py, ratelimit_shared.py). The key is checked once, at the edge.
RateLimit = Callable[[Optional[str], int], Awaitable[None]]


class PDEngineClient(EngineClient):
    def __init__(self, vllm_config: Any, backend: Backend, default_tier: str, *,
                 rate_limit: Optional[RateLimit] = None):
        """`default_tier`: the tier of a request that did not come through the edge (no
        RequestContext: vLLM calling its engine client directly); the edge chooses every other
        request's tier, and nothing below this class defaults it again. `rate_limit`: async
        (tenant, token cost) → None, raising a 429 OpenAIError to refuse."""
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.renderer = renderer_from_config(vllm_config)
        self.input_processor = InputProcessor(vllm_config, self.renderer)
        self.backend = backend
        self.default_tier = default_tier
        self.rate_limit = rate_limit
        self._stopped = False
        self._aborts: set[asyncio.Task] = set()  # aborts in flight, kept from the GC

    async def generate(self, prompt: Any, sampling_params: SamplingParams, request_id: str, *,
                       prompt_text: Optional[str] = None, lora_request: Any = None,
                       **_: Any) -> AsyncGenerator[Any, None]:
        ctx = CURRENT.get() or RequestContext(tier=self.default_tier)
        if not isinstance(prompt, Mapping) or "prompt_token_ids" not in prompt:
            raise ValueError("tandem serves token prompts rendered by the gateway (text-only models)")
        # vLLM's own checks of the request (logprobs limits, token ids in the vocabulary,
        # structured-output specs, ...), raised here as AsyncLLM would raise them.
        checked = self.input_processor.process_inputs(request_id, prompt, sampling_params,
                                                      supported_tasks=("generate",), lora_request=lora_request)
        params = checked.sampling_params
        token_ids = tuple(prompt["prompt_token_ids"])
        salt = _salt(ctx.cache_salt, prompt.get("cache_salt"))
        # vLLM's serving code resolved `model` to one of model.lora_adapters (or None: the base).
        adapter = None if lora_request is None else Adapter(lora_request.lora_name, lora_request.lora_int_id,
                                                             lora_request.lora_path)
        request = EngineRequest(request_id, token_ids, params, tier=ctx.tier, cache_salt=salt, adapter=adapter)
        aggregate = sampling_params.output_kind != RequestOutputKind.DELTA
        text = prompt.get("prompt", prompt_text)
        # One list for every output of the request: vLLM's serving code reads it (usage, echo)
        # and never changes it, and a copy per token costs ~10 µs at an 8k-token prompt.
        prompt_ids = list(token_ids)
        merged = None
        started = finished = False
        try:
            if self.rate_limit is not None:
                await self.rate_limit(ctx.tenant, len(token_ids) + (params.max_tokens or 0) * params.n)
            async for output in self.backend.generate(request):
                started = True
                finished = finished or output.finished
                output.request_id = request_id
                output.prompt = text
                output.prompt_token_ids = prompt_ids
                if not aggregate:
                    yield output
                    continue
                # Our own copy, extended in place: re-merging the whole answer per delta would copy
                # every token so far on each step, on the event loop.
                if merged is None:
                    merged = merge_outputs([output])
                else:
                    merged.add(output, aggregate=True)
                if merged.finished:
                    yield merged
                elif sampling_params.output_kind == RequestOutputKind.CUMULATIVE:
                    yield merge_outputs([merged])  # a snapshot: the caller may keep it while we extend ours
        except OpenAIError as exc:
            if not started and ctx.refusal is None:
                ctx.refusal = exc  # the edge answers with its status and headers
            raise
        except (EngineGenerateError, EngineDeadError) as exc:
            # An engine replica's own error, carried here by Ray as its class. vLLM's handler
            # for these assumes the engine is this process's (it would stop this server when
            # it is dead); tandem's engines are remote and replaceable: this request fails.
            raise GenerationError(f"The engine failed the request: {exc}") from None
        except (asyncio.CancelledError, GeneratorExit):
            # The client went away (vLLM's serving code cancels or closes us), as AsyncLLM:
            # abort what runs for it; not awaited here, a cancelled task must not wait.
            if not finished:
                self._abort_soon(request_id)
            raise

    def _abort_soon(self, request_id: str) -> None:
        task = asyncio.ensure_future(self.backend.abort(request_id))
        self._aborts.add(task)
        task.add_done_callback(self._aborts.discard)

    async def abort(self, request_id: Any) -> None:
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        for rid in ids:
            await self.backend.abort(rid)

    # vLLM's engine-state surface: a gateway holds no engine of its own.
    @property
    def is_running(self) -> bool:
        return not self._stopped

    @property
    def is_stopped(self) -> bool:
        return self._stopped

    @property
    def errored(self) -> bool:
        return False

    @property
    def dead_error(self) -> BaseException:
        return RuntimeError("the gateway's engine client does not die; its pools report on /health")

    async def get_supported_tasks(self) -> tuple[str, ...]:
        return ("generate",)

    async def check_health(self) -> None:
        info = await self.backend.health()
        if not info.get("ready"):
            raise RuntimeError(f"pools not ready: {info}")

    def shutdown(self, timeout: Optional[float] = None) -> None:
        if not self._stopped:
            self._stopped = True
            self.renderer.shutdown()

    async def is_tracing_enabled(self) -> bool:
        return False

    async def do_log_stats(self) -> None:
        return None

    async def notify_kv_transfer_request_rejected(self, request_id: str, kv_transfer_params: dict[str, Any],
                                                  data_parallel_rank: Optional[int] = None) -> None:
        return None  # the gateway never hands kv_transfer_params to clients

    def encode(self, *args: Any, **kwargs: Any) -> Any:
        raise ValueError("tandem serves generative models; pooling (embeddings, scores) is not served")

    async def add_lora(self, lora_request: Any) -> bool:
        """vLLM's serving code checks each configured adapter here at start (model.lora_adapters).
        The engines load an adapter when a request first names it; what can be checked without an
        engine is checked now, with vLLM's own rules, so a bad adapter stops the start with its
        reason: a local folder must hold a PEFT adapter vLLM accepts (rank, features). A Hub id
        is downloaded by the engines."""
        import os

        from vllm.exceptions import LoRAAdapterNotFoundError
        from vllm.lora.peft_helper import PEFTHelper

        path = lora_request.lora_path
        looks_local = os.path.isabs(path) or path.startswith(".") or os.path.exists(path)
        if not looks_local:
            return True
        if not os.path.isfile(os.path.join(path, "adapter_config.json")):
            raise LoRAAdapterNotFoundError(lora_request.lora_name, path)
        helper = PEFTHelper.from_local_dir(path, self.model_config.max_model_len)
        helper.validate_legal(self.vllm_config.lora_config)
        return True

    async def _unsupported(self, what: str) -> Any:
        raise ValueError(f"{what} is an engine operation; tandem's engines are managed by the cluster")

    async def start_profile(self, *args: Any, **kwargs: Any) -> None:
        await self._unsupported("profiling")

    async def stop_profile(self) -> None:
        await self._unsupported("profiling")

    async def reset_mm_cache(self) -> None:
        return None

    async def reset_encoder_cache(self) -> None:
        return None

    async def reset_prefix_cache(self, *args: Any, **kwargs: Any) -> bool:
        await self._unsupported("resetting the prefix cache")
        return False

    async def sleep(self, *args: Any, **kwargs: Any) -> None:
        await self._unsupported("sleep")

    async def release_kv_cache_memory(self) -> None:
        await self._unsupported("releasing KV cache memory")

    async def wake_up(self, tags: Any = None) -> bool:
        await self._unsupported("wake_up")
        return False

    async def is_sleeping(self) -> bool:
        return False

    async def pause_generation(self, *args: Any, **kwargs: Any) -> None:
        await self._unsupported("pausing generation")

    async def resume_generation(self) -> None:
        await self._unsupported("resuming generation")

    async def is_paused(self) -> bool:
        return False


def _salt(tenant_salt: Optional[str], client_salt: Optional[str]) -> Optional[str]:
    """The prefix-cache salt both hops use: the tenant's isolates tenants; a client's own salt
    (vLLM's cache_salt field) isolates further within its tenant."""
    if tenant_salt and client_salt:
        return f"{tenant_salt}:{client_salt}"
    return tenant_salt or client_salt
