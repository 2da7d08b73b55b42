"""The Engine interface: what an engine replica (cluster/engine/replica.py) asks of the
engine it owns. VLLMEngine (vllm.py) is the real one; FakeEngine (fake.py) the deterministic
stand-in that lets the Ray Serve graph run without vLLM (tests/serve/).

Lifecycle and call order (every call in the replica's process):

1. `Engine(spec)`: keeps the spec; starts nothing, allocates nothing.
2. `start() -> EngineInfo`: once, from the replica's constructor. Blocks until the engine
   can take requests (VLLMEngine: the EngineCore child is up, KV-event sockets are bound).
   It returns who the engine is: its worker id, model, KV layout and KV-event endpoints,
   which the replica reports to the gateway's router (routing stats) and the prefill side
   stamps into each Handoff (kv_transfer/handoff.py). A start that raises leaves nothing
   running.
3. After `start()`, concurrently and any number of times:
   - `prefill(request, first_token=...) -> PrefillResult` (the producer role): compute the
     prompt's KV, keep it for a remote decode, return vLLM's kv_transfer_params.
   - `generate(request, kv_transfer_params)`: an async generator of vLLM RequestOutput
     DELTAs (the consumer role, or a plain engine with params None). With params the
     prompt's KV is pulled from the producer they name; without, computed here. Closing
     the generator early aborts the request inside the engine.
   - `merge_outputs(outputs)`: consecutive DELTAs of one stream as one (the replica coalesces
     what piles up while the gateway reads, cluster/coalesce.py); pure, any thread.
   - `abort(request_id)`: at any time; an id the engine does not hold is ignored.
   - `metrics()`: the engine's counters as vLLM names them (metrics.py `Readings`); cheap,
     non-blocking, any thread: the exporter of exact sums, the autoscaling signals and the
     routing stats read it. `stats() -> EngineStats` is the typed view of the same reading.
   - `check_alive()`: raises when the engine has died (Serve's health probe).
   - `holds_kv()`: whether blocks are still in use (a producer's teardown waits on it for the
     decodes' pulls, prefill_workers/lease_drain.py).
4. `shutdown()`: once or more (idempotent), from the replica's teardown; after it no other
   call is made. An engine whose start failed may be shut down too.

The engine is role-agnostic: its role (kv_producer, kv_consumer, None) is data in the spec,
and which calls a replica makes follows from the role (prefill_workers/, decode_workers/).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator, Optional, Sequence

from cluster.config import EngineConfig, KVTransferConfig
from cluster.engine.metrics import EngineStats, engine_stats
from cluster.protocol import merge_outputs
from cluster.types import PoolId
from kv_transfer.handoff import EngineIdentity
from kv_transfer.nixl import KVRole, NixlEndpoint

if TYPE_CHECKING:
    from cluster.engine.lora_state import LoraInfo
    from cluster.protocol import EngineRequest, PrefillResult


@dataclass(frozen=True)
class KVEventsEndpoint:
    """Where this engine publishes its KV-cache events (router/kv_events.py follows them):
    the PUB and replay sockets the EngineCore bound on the node's cluster address."""

    endpoint: str
    replay_endpoint: Optional[str]


@dataclass(frozen=True)
class EngineSpec:
    """Everything an engine needs to start, made by the replica (replica.py build_engine_spec)."""

    model_path: Path
    served_name: str
    dtype: str
    max_model_len: int
    engine: EngineConfig
    kv_role: Optional[KVRole]
    kv: KVTransferConfig
    nixl: Optional[NixlEndpoint]
    cpu_binding: Optional[str]
    on_gpu: bool
    worker_id: str
    # Publish KV-cache events, bound on this address (the node's cluster address: 127.0.0.1
    # locally, the pod IP on Kubernetes); None: no events.
    kv_events_host: Optional[str] = None
    reasoning_parser: Optional[str] = None  # model.reasoning_parser: structured outputs start after reasoning
    config_key: str = "engine"  # where `engine` sits in the YAML (tiers.<tier>.<pool>.engine): errors name it
    # The pool the engine serves: its `vllm:*` metrics go out through Ray labelled with it
    # (vllm_ray_metrics.py). None outside a cluster (tests, benchmarks): vLLM's registry only.
    pool: Optional[PoolId] = None
    # observability.tracing.engine_spans: vLLM's own OTLP exporter; its request spans join the
    # replica's (trace_headers). None: vLLM traces nothing.
    tracing: Optional["EngineTracing"] = None
    # model.lora_adapters: the engine serves LoRA adapters (loaded when a request names one).
    # None: built without LoRA.
    lora: Optional["LoraLimits"] = None


@dataclass(frozen=True)
class LoraLimits:
    """vLLM's LoRA engine arguments, the same for every pool (model.max_loras, max_lora_rank)."""

    max_loras: int
    max_lora_rank: int
    # The configured adapters in order: vLLM's serving code numbers them 1, 2, ... (their ids
    # in the engine's adapter cache, lora_state.py).
    adapters: tuple[str, ...] = ()


@dataclass(frozen=True)
class EngineTracing:
    """Where vLLM's own spans go (observability.tracing with engine_spans): vLLM reads the endpoint
    as an engine argument and the rest from the OTEL_* environment (vllm.py engine_environment)."""

    endpoint: str
    protocol: str  # "grpc" | "http", as observability.tracing.protocol
    service_name: str  # `<prefix>-engine`


@dataclass(frozen=True)
class CacheLayout:
    """How the engine hashes prefix-cache blocks: the router must hash prompts the same way."""

    block_size: int
    hash_algo: str
    hash_seed: str

    def as_stats(self) -> dict[str, Any]:
        return {"block_size": self.block_size, "hash_algo": self.hash_algo, "hash_seed": self.hash_seed}


@dataclass(frozen=True)
class EngineInfo:
    """Who a started engine is (start()'s answer)."""

    worker_id: str
    kv_role: Optional[KVRole]
    cache: CacheLayout
    # What a KV handoff between two engines must agree on (kv_transfer/handoff.py).
    identity: EngineIdentity
    kv_events: Optional[KVEventsEndpoint] = None
    # The model's KV of one block (K and V, every layer, every KV head): what pulling one block
    # moves. None where unknown (FakeEngine; vLLM's MLA and hybrid layouts).
    kv_block_bytes: Optional[int] = None


def cache_identity(spec: EngineSpec, block_size: int) -> EngineIdentity:
    """The handoff identity of an engine built from `spec` (both engines derive it alike)."""
    return EngineIdentity(model=spec.served_name, dtype=spec.dtype, kv_cache_dtype=spec.engine.kv_cache_dtype,
                          block_size=block_size)


class Engine(abc.ABC):
    """One inference engine, owned by one replica (module docstring: lifecycle, call order)."""

    def __init__(self, spec: EngineSpec):
        self.spec = spec

    @abc.abstractmethod
    def start(self) -> EngineInfo:
        """Start the engine; blocks until it takes requests."""

    @abc.abstractmethod
    async def prefill(self, request: "EngineRequest", *, first_token: bool = False) -> "PrefillResult":
        """Compute the prompt's KV and keep it for a remote decode (max_tokens=1); with
        `first_token` the sampled token is the answer's first (kv_transfer/first_token.py)."""

    @abc.abstractmethod
    def generate(self, request: "EngineRequest",
                 kv_transfer_params: Optional[dict[str, Any]]) -> AsyncIterator[Any]:
        """An async generator of vLLM RequestOutput DELTAs, prompt fields left out."""

    def merge_outputs(self, outputs: Sequence[Any]) -> Any:
        """Consecutive DELTA outputs of one request as one (vLLM's RequestOutput.add)."""
        return merge_outputs(outputs)

    @abc.abstractmethod
    async def abort(self, request_id: str) -> None:
        """Stop a request; unknown ids are ignored."""

    @abc.abstractmethod
    def metrics(self) -> dict[tuple[str, Optional[str]], float]:
        """This engine's samples now, summed by (vLLM metric name, source label)."""

    def lora_info(self) -> Optional["LoraInfo"]:
        """vLLM's vllm:lora_requests_info now (lora_state.py); None: no LoRA, or not known."""
        return None

    async def resident_loras(self) -> Optional[set[int]]:
        """The adapter ids in the engine's adapter cache (vLLM's list_loras); None: not known."""
        return None

    def stats(self) -> EngineStats:
        """This engine's counters now, typed (one mapping for every engine: metrics.py)."""
        return engine_stats(self.spec.worker_id, self.metrics())

    def holds_kv(self) -> bool:
        """Whether any KV block is in use now (vLLM's KV usage gauge above 0). With no request
        running on a producer, those are blocks kept for a remote decode's pull."""
        return self.stats().kv_cache_usage > 0

    @abc.abstractmethod
    def check_alive(self) -> None:
        """Raise if the engine has died."""

    @abc.abstractmethod
    def shutdown(self) -> None:
        """Release the engine; idempotent."""
