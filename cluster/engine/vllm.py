"""VLLMEngine: the Engine (base.py) around a real vLLM AsyncLLM, the same for both pools; the
role (producer, consumer) is the spec's kv_role, nothing else differs.

What `start()` does: sets this process's engine environment (core binding, NIXL side channel,
UCX, the no-spin and niceness hooks of cluster/vllm_plugin.py), builds the AsyncLLM with its
stat loggers (its `vllm:*` metrics also go out through Ray, vllm_ray_metrics.py; it returns
once the EngineCore child is up) and reads back the KV-event sockets it bound. Closing a
`generate` stream early aborts the request inside vLLM. `shutdown()` makes the EngineCore child
exit and release its /dev/shm segments.
"""

from __future__ import annotations

import logging
import os
from typing import Any, AsyncIterator, Optional

from cluster.config import EngineConfig
from cluster.engine.base import CacheLayout, Engine, EngineInfo, EngineSpec, KVEventsEndpoint, cache_identity
from cluster.engine.engine_args import parse as parse_engine_args
from cluster.engine.metrics import Readings, read_vllm_metrics
from cluster.engine.step_log import log_path, step_log_dir, step_logger
from cluster.protocol import EngineRequest, InvalidEngineRequest, PrefillResult, merge_outputs, sampling_params
from kv_transfer.handoff import prefill_request_params
from cluster.lora_cpu_patch import ENV_FLAG as LORA_CPU_PATCH
from cluster.vllm_plugin import ENGINE_NICE
from kv_transfer.nixl import kv_transfer_config, nixl_env
from cluster.hashing import engine_hash_seed

log = logging.getLogger(__name__)


# vLLM's ZMQ publisher binds `tcp://*:0` on its node IP (VLLM_HOST_IP) with a port the OS
# picks, and reports the bound endpoints back (AsyncLLM.get_kv_event_sources). Any other tcp
# endpoint without "*" makes the PUB socket *connect*, and `tcp://*:PORT` binds all interfaces:
# BlockStored events carry every prompt's token ids, so they must stay on the cluster address.
_BIND_ON_NODE_IP = "tcp://*:0"

# observability.tracing.protocol → the OTEL_EXPORTER_OTLP_TRACES_PROTOCOL vLLM's exporter reads.
OTLP_PROTOCOLS = {"grpc": "grpc", "http": "http/protobuf"}
# The parent of an untraced request's engine spans: valid but not sampled, so vLLM's tracer
# (ParentBased, always on) drops them. Without any parent vLLM would start a trace of its own
# for every request the gateway chose not to trace.
UNSAMPLED_PARENT = {"traceparent": f"00-{1:032x}-{1:016x}-00"}


def engine_environment(spec: EngineSpec) -> dict[str, str]:
    env = {
        # The EngineCore runs in its own process; only then does vLLM apply the OMP binding.
        "VLLM_ENABLE_V1_MULTIPROCESSING": "1",
        # vLLM's children die with the replica even when it is SIGKILLed (cluster/vllm_plugin.py).
        "TANDEM_EXIT_WITH_PARENT": "1",
    }
    if spec.cpu_binding and not spec.on_gpu:
        env["VLLM_CPU_OMP_THREADS_BIND"] = spec.cpu_binding
    if not spec.on_gpu:
        # vLLM's EngineCore and worker wait on each other without spinning (cluster/no_spin.py),
        # and yield their cores to the gateway and Serve's proxy when those have work
        # (cluster/vllm_plugin.py): on a small CPU host they share the engines' cores.
        env["TANDEM_NO_SPIN"] = "1"
        env[ENGINE_NICE] = str(spec.engine.cpu_niceness)
        if spec.lora is not None:
            env[LORA_CPU_PATCH] = "1"  # vLLM's CPU LoRA ops would give base tokens an adapter's delta
    if spec.nixl is not None:
        env.update(nixl_env(spec.kv, spec.nixl, spec.on_gpu))
    if spec.kv_events_host is not None:
        # The address vLLM binds `tcp://*:0` on (its get_ip()); otherwise the default route's.
        env["VLLM_HOST_IP"] = spec.kv_events_host
    if spec.tracing is not None:
        # vLLM's exporter takes its protocol and its spans' service name from the environment
        # only (vllm/tracing/otel.py get_span_exporter; the SDK's resource detector). The
        # replica's own tracer names its service explicitly, so this does not rename it.
        env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = OTLP_PROTOCOLS[spec.tracing.protocol]
        env["OTEL_SERVICE_NAME"] = spec.tracing.service_name
    return env


def kv_block_bytes(vllm_config: Any) -> Optional[int]:
    """Bytes of one KV block of the model: K and V of every layer and KV head (what a NIXL pull of
    a block moves, all tensor-parallel ranks together). None for layouts this does not describe:
    MLA (one latent per token) and hybrid models (state besides attention)."""
    from vllm.utils.torch_utils import kv_cache_dtype_str_to_dtype

    model, cache = vllm_config.model_config, vllm_config.cache_config
    if model.use_mla or model.is_hybrid:
        return None
    itemsize = kv_cache_dtype_str_to_dtype(cache.cache_dtype, model).itemsize
    return (2 * model.get_total_num_hidden_layers() * model.get_total_num_kv_heads() * model.get_head_size()
            * cache.block_size * itemsize)


def structured_outputs_config(eng: EngineConfig, reasoning_parser: Optional[str] = None) -> dict[str, Any]:
    """vLLM's StructuredOutputsConfig of a pool, as a mapping; the gateway checks requests against it."""
    config = dict(eng.structured_outputs_config)
    if reasoning_parser:
        config["reasoning_parser"] = reasoning_parser
    return config


def engine_args(spec: EngineSpec) -> Any:
    """The AsyncEngineArgs the engine is built with: the pool's vLLM arguments as vLLM's own
    parser reads them (engine_args.py, the one pass-through), and those tandem sets for every
    pool (SET_BY_TANDEM in cluster/config/pools.py)."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    given = parse_engine_args(spec.engine.vllm_args(), spec.config_key)
    if spec.tracing is not None and "otlp_traces_endpoint" not in given:
        given["otlp_traces_endpoint"] = spec.tracing.endpoint  # observability.tracing.engine_spans
    if step_log_dir() is not None:  # vLLM times each step only when asked; a benchmark asks (step_log.py)
        given["enable_logging_iteration_details"] = True
    if spec.lora is not None:  # model.lora_adapters
        given.update(enable_lora=True, max_loras=spec.lora.max_loras, max_lora_rank=spec.lora.max_lora_rank)
    return AsyncEngineArgs(
        **given,
        model=str(spec.model_path),
        served_model_name=[spec.served_name],
        dtype=spec.dtype,
        max_model_len=spec.max_model_len,
        # vLLM hands it on to the structured-output config, as `vllm serve --reasoning-parser`.
        reasoning_parser=spec.reasoning_parser or "",
        kv_transfer_config=kv_transfer_config(spec.kv, spec.kv_role, spec.on_gpu) if spec.kv_role else None,
        disable_log_stats=False,
        kv_events_config=_kv_events_config(spec.kv_events_host),
    )


def engine_stat_loggers(spec: EngineSpec) -> Optional[list[type]]:
    """vLLM's stat loggers for the engine: in a cluster its `vllm:*` metrics also go out
    through Ray labelled with its pool (vllm_ray_metrics.py); else vLLM's defaults."""
    if spec.pool is None:
        return None
    from cluster.engine.vllm_ray_metrics import stat_loggers

    loggers = stat_loggers(spec.pool.tier, spec.pool.role, spec.worker_id)
    if (directory := step_log_dir()) is not None:  # a benchmark's step timings (step_log.py)
        loggers.append(step_logger(log_path(directory, spec.pool.tier, spec.pool.role, spec.worker_id)))
    return loggers


def _sampling_params(request: EngineRequest, *, max_tokens: int, kv_params: Optional[dict[str, Any]],
                     prefill: bool = False):
    """The request's own SamplingParams (vLLM's serving code made them) for one hop: its
    max_tokens, DELTA outputs, the KV handoff. `prefill`: the sampled token is discarded, so
    what only shapes output (logprobs, a decoding constraint) is left out."""
    from vllm.sampling_params import RequestOutputKind

    params = sampling_params(request).clone()
    params.max_tokens = max_tokens
    params.min_tokens = min(params.min_tokens, max_tokens)
    params.output_kind = RequestOutputKind.DELTA
    params.n = 1
    if prefill:
        params.logprobs = None
        params.structured_outputs = None
    if kv_params is not None:
        params.extra_args = {**(params.extra_args or {}), "kv_transfer_params": kv_params}
    return params


def _prompt(request: EngineRequest) -> dict[str, Any]:
    """The request's prompt as vLLM's rendered engine input (`type: "token"`), the same in both
    hops (the cache salt too). Rendered, not a raw TokensPrompt: the gateway has tokenized and
    checked it already, and vLLM 0.32 deprecates raw prompts to its InputProcessor."""
    from vllm.inputs.engine import tokens_input

    return tokens_input(list(request.prompt_token_ids), cache_salt=request.cache_salt or None)


def _lean(output: Any) -> Any:
    """An output without its prompt, which vLLM repeats in every delta: the gateway holds the
    prompt already, and a long one would be pickled once per token across Ray."""
    output.prompt = None
    output.prompt_token_ids = None
    return output


def engine_failure(request_id: str, exc: BaseException) -> Exception:
    """What the gateway gets for a request AsyncLLM.generate failed with EngineGenerateError.
    AsyncLLM wraps every unexpected error in it with no message, and some of its own checks
    of a request still raise a plain ValueError (or TypeError) that it wraps the same way:
    those are the request's fault (a 400 at the edge, never retried). Anything else stays
    a server error, its cause in the message and the log, not vLLM's class (which Ray would
    carry to the gateway, where vLLM's serving code expects an engine of its own)."""
    cause = exc.__cause__ or exc
    if isinstance(cause, (ValueError, TypeError)):
        return InvalidEngineRequest(str(cause) or type(cause).__name__)
    log.warning("request %s failed in the engine: %s: %s", request_id, type(cause).__name__, cause)
    return RuntimeError(f"the engine failed the request: {type(cause).__name__}: {cause}")


class VLLMEngine(Engine):
    # Trace headers of a request the gateway does not trace (set with engine spans on; vLLM warns
    # at headers it cannot use).
    _untraced: Optional[dict[str, str]] = None

    def __init__(self, spec: EngineSpec):
        super().__init__(spec)
        self._llm: Any = None
        self._closed = False
        self.info: Optional[EngineInfo] = None
        if spec.tracing is not None:
            self._untraced = UNSAMPLED_PARENT

    def start(self) -> EngineInfo:
        spec = self.spec
        os.environ.update(engine_environment(spec))
        from vllm.v1.engine.async_llm import AsyncLLM

        args = engine_args(spec)
        log.info("starting vLLM engine %s (%s) with %s", spec.worker_id, spec.kv_role, spec.model_path)
        self._llm = AsyncLLM.from_engine_args(args, stat_loggers=engine_stat_loggers(spec))
        try:
            kv_events = None
            if spec.kv_events_host is not None:
                kv_events = bound_kv_events(self._llm.get_kv_event_sources(), spec.kv_events_host)
            cache = self._cache_layout()
            self.info = EngineInfo(worker_id=spec.worker_id, kv_role=spec.kv_role, cache=cache,
                                   identity=cache_identity(spec, cache.block_size), kv_events=kv_events,
                                   kv_block_bytes=kv_block_bytes(self._llm.vllm_config))
        except Exception:
            self.shutdown()
            raise
        return self.info

    async def prefill(self, request: EngineRequest, *, first_token: bool = False) -> PrefillResult:
        """Compute the prompt's KV and keep it for a remote decode (max_tokens=1).

        With `first_token`, the one sampled token is the answer's first (the request's full
        sampling settings apply, kv_transfer/first_token.py) and comes back as
        `PrefillResult.first`; when it ends the answer (EOS, a stop, max_tokens 1) there may
        be no KV to hand over. Without, the token is discarded, so decoding-time extras
        (logprobs, constraints) are left out. Prompt logprobs, when asked for, are computed
        here and come back in `PrefillResult.prompt_logprobs`."""
        wanted = request.sampling.max_tokens or 1
        keep_kv = not first_token or wanted > 1
        params = _sampling_params(request, max_tokens=1,
                                  kv_params=prefill_request_params() if keep_kv else None,
                                  prefill=not first_token)
        outputs = [output async for output in self._generate(request, params)]
        if not outputs:
            raise RuntimeError(f"prefill of {request.request_id} returned no output")
        merged = merge_outputs(outputs)
        prompt_logprobs = outputs[0].prompt_logprobs
        first = None
        if first_token:
            first = _lean(merged)
            first.prompt_logprobs = None
            completion = first.outputs[0]
            if completion.finish_reason == "length" and wanted > 1:
                # The hop's max_tokens=1, not the answer's: the request goes on.
                completion.finish_reason = None
                first.finished = False
        kv_params = None if merged.kv_transfer_params is None else dict(merged.kv_transfer_params)
        if first is not None:
            first.kv_transfer_params = None
        if kv_params is None and (first is None or not first.finished):
            raise RuntimeError(f"prefill of {request.request_id} returned no kv_transfer_params")
        return PrefillResult(
            request_id=request.request_id,
            kv_transfer_params=kv_params,
            worker_id=self.spec.worker_id,
            num_prompt_tokens=len(request.prompt_token_ids),
            first=first,
            prompt_logprobs=prompt_logprobs,
        )

    async def generate(
        self, request: EngineRequest, kv_transfer_params: Optional[dict[str, Any]]
    ) -> AsyncIterator[Any]:
        """Generate tokens as vLLM RequestOutputs (DELTA); with kv_transfer_params the prompt's
        KV is pulled over NIXL first."""
        params = _sampling_params(request, max_tokens=request.sampling.max_tokens, kv_params=kv_transfer_params)
        async for output in self._generate(request, params):
            yield _lean(output)

    async def _generate(self, request: EngineRequest, params: Any) -> AsyncIterator[Any]:
        from vllm.exceptions import VLLMClientError
        from vllm.v1.engine.exceptions import EngineGenerateError

        try:
            # A traced request's replica span is the parent of vLLM's own spans (engine_spans).
            headers = {"traceparent": request.traceparent} if request.traceparent else self._untraced
            lora = None if request.adapter is None else request.adapter.lora_request()
            async for output in self._llm.generate(
                _prompt(request), params, request.request_id, trace_headers=headers, lora_request=lora
            ):
                yield output
        except VLLMClientError as exc:
            # vLLM's own request checks (e.g. a regex or JSON schema its structured-output
            # backend cannot compile): the client's error, a 400 at the edge, not a retry.
            raise InvalidEngineRequest(str(exc)) from None
        except EngineGenerateError as exc:
            raise engine_failure(request.request_id, exc) from None

    async def abort(self, request_id: str) -> None:
        await self._llm.abort(request_id)

    def metrics(self) -> Readings:
        return read_vllm_metrics()

    def lora_info(self):
        from cluster.engine.lora_state import read_lora_info

        return read_lora_info() if self.spec.lora is not None else None

    async def resident_loras(self) -> Optional[set[int]]:
        if self.spec.lora is None or self._llm is None:
            return None
        return set(await self._llm.list_loras())

    def _cache_layout(self) -> CacheLayout:
        cache = self._llm.vllm_config.cache_config
        return CacheLayout(block_size=cache.block_size, hash_algo=cache.prefix_caching_hash_algo,
                           hash_seed=engine_hash_seed())

    def check_alive(self) -> None:
        if self._llm.errored:
            raise RuntimeError(f"vLLM engine {self.spec.worker_id} has died: {self._llm.dead_error}")

    def shutdown(self) -> None:
        if self._closed or self._llm is None:
            return
        self._closed = True
        log.info("shutting down vLLM engine %s", self.spec.worker_id)
        self._llm.shutdown()


def _kv_events_config(host: Optional[str]):
    if host is None:
        return None
    from vllm.config import KVEventsConfig

    return KVEventsConfig(enable_kv_cache_events=True, publisher="zmq",
                          endpoint=_BIND_ON_NODE_IP, replay_endpoint=_BIND_ON_NODE_IP)


def bound_kv_events(sources: dict[int, Any], host: str) -> KVEventsEndpoint:
    """The endpoints the EngineCore bound (its KVEventsConfig, data-parallel rank 0), checked
    to be on `host`: a publisher on another address would leak prompts or be unreachable."""
    if 0 not in sources:
        raise RuntimeError("vLLM reported no KV-event publisher although events are on")
    config = sources[0]
    endpoint, replay = config.endpoint, config.replay_endpoint
    prefixes = (f"tcp://{host}:", f"tcp://[{host}]:")  # vLLM brackets an IPv6 address
    for name, value in (("endpoint", endpoint), ("replay_endpoint", replay)):
        if value is None or not value.startswith(prefixes) or value.endswith(":0"):
            raise RuntimeError(f"KV-event {name} {value!r} is not bound on {host}")
    return KVEventsEndpoint(endpoint=endpoint, replay_endpoint=replay)
