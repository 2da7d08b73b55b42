"""The simulated engines of a cluster, pool by pool, as tandem's config describes them, and what
they report: the routing stats each replica sends the gateway every second (cluster/engine/
replica.py record_routing_stats), written into the real PoolDirectory the KVRouter reads.

Engine ids are the real ones (`<tier>-<role>-<replica>`, cluster/types.py PoolId.worker_id);
KV events go straight into the real PrefixIndex (no ZMQ in between: its ~ms delay is ignored).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Optional

from cluster.config import ClusterConfig
from cluster.config.pools import PoolConfig
from cluster.hashing import DEFAULT_SEED
from cluster.types import PoolId, RoutingStats
from loadtest.sim.engine import EngineParams, SimEngine
from loadtest.sim.kv_cache import BlockPool
from loadtest.sim.network import LinkSpec, Nic
from loadtest.sim.step_time import StepTimeModel
from router.prefix_index import PrefixIndex
from router.routing.directory import PoolDirectory, ReplicaInfo

VLLM_DEFAULT_BUDGET = 2048  # vLLM's max_num_batched_tokens when unset (chunked prefill on)


@dataclass(frozen=True)
class Hardware:
    """What the config does not say: the engines' speed and memory layout, the network."""

    step_model: Callable[[str, str], StepTimeModel]  # (tier, role) → its engines' step time
    kv_bytes_per_token: int
    default_block_size: int  # vLLM's when the config sets none: 128 on CPU, 16 on GPU
    link: LinkSpec


@dataclass
class Replica:
    replica_id: str
    worker_id: str
    engine: SimEngine
    nic: Nic
    capacity: int
    queued_prompt_tokens: int = 0  # a prefill replica's prompts sent and not returned (signals.py)


class KVCacheTooSmall(ValueError):
    """An engine whose KV cache cannot hold one request of model.max_model_len tokens: vLLM
    refuses to start it (its check_enough_kv_cache_memory), so the simulator does too."""


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"  # as vLLM says it


def engine_params(pool: PoolConfig, hw: Hardware, max_model_len: int, where: str) -> EngineParams:
    """The engine a pool's config describes. `where` names it in an error (e.g. `tiers.interactive.decode`):
    a KV cache too small for one request of `max_model_len` tokens is refused here, where the
    bytes become blocks, as vLLM refuses to start such an engine."""
    e = pool.engine
    block = e.block_size or hw.default_block_size
    kv_bytes = e.kv_cache_memory_bytes
    if kv_bytes is None:
        raise ValueError("the simulator sizes KV caches from kv_cache_memory_bytes; set it in the config's engines")
    num_blocks = int(kv_bytes) // (block * hw.kv_bytes_per_token)
    if num_blocks * block < max_model_len:
        needed = -(-max_model_len // block) * block * hw.kv_bytes_per_token  # vLLM: whole blocks of max_model_len
        raise KVCacheTooSmall(
            f"{where}: its KV cache ({int(kv_bytes):,} bytes, {_gib(int(kv_bytes))}) holds {num_blocks * block:,} tokens "
            f"({num_blocks} blocks of {block}, {hw.kv_bytes_per_token:,} bytes a token), fewer than model.max_model_len "
            f"({max_model_len:,}), which needs {needed:,} bytes ({_gib(needed)}): vLLM refuses to start such an engine. "
            f"Give it at least {needed:,} bytes of KV cache (engine.kv_cache_memory_bytes), or lower model.max_model_len")
    return EngineParams(max_num_seqs=e.max_num_seqs,
                        max_num_batched_tokens=e.max_num_batched_tokens or VLLM_DEFAULT_BUDGET,
                        block_size=block, num_blocks=num_blocks)


class SimPools:
    def __init__(self, cfg: ClusterConfig, hw: Hardware, index: PrefixIndex, slowdown: Callable[[], float],
                 on_tokens: Callable[[float, int], None], on_busy: Callable[[bool], None] = lambda busy: None):
        self.cfg = cfg
        self.hw = hw
        self.index = index
        self._slowdown = slowdown
        self._on_tokens = on_tokens
        self._on_busy = on_busy
        self.directories: dict[tuple[str, str], PoolDirectory] = {}
        self.replicas: dict[tuple[str, str], list[Replica]] = {}
        self._serial = 0
        for tier, t in cfg.tiers.items():
            for role, pool in (("prefill", t.prefill), ("decode", t.decode)):
                self.directories[(tier, role)] = PoolDirectory()
                self.replicas[(tier, role)] = []
                for _ in range(pool.replicas):
                    self.add(tier, role)

    def pool_config(self, tier: str, role: str) -> PoolConfig:
        t = self.cfg.tiers[tier]
        return t.prefill if role == "prefill" else t.decode

    def add(self, tier: str, role: str) -> Replica:
        self._serial += 1
        replica_id = f"r{self._serial}"
        worker_id = PoolId(tier, role).worker_id(replica_id)  # type: ignore[arg-type]
        pool = self.pool_config(tier, role)
        params = engine_params(pool, self.hw, self.cfg.model.max_model_len, f"tiers.{tier}.{role}")
        blocks = BlockPool(worker_id, params.num_blocks, params.block_size, lambda ev: self.index.apply([ev]))
        engine = SimEngine(worker_id, params, self.hw.step_model(tier, role), blocks, self._slowdown,
                           self._on_tokens, self._on_busy)
        replica = Replica(replica_id, worker_id, engine, Nic(self.hw.link),
                          capacity=max(pool.engine.max_num_seqs * 2, 8))  # cluster/app.py's max_ongoing_requests
        self.replicas[(tier, role)].append(replica)
        return replica

    def start(self) -> None:
        for r in self.all():
            r.engine.start()

    def all(self) -> Iterator[Replica]:
        """Every replica of every pool."""
        for replicas in self.replicas.values():
            yield from replicas

    def idle(self) -> bool:
        """No engine holds a request (running, waiting, or waiting for its KV)."""
        return not any(r.engine.running or r.engine.waiting or r.engine.kv_ready or r.engine.loading for r in self.all())

    def by_replica_id(self, tier: str, role: str, replica_id: Optional[str]) -> Replica:
        replicas = self.replicas[(tier, role)]
        for r in replicas:
            if r.replica_id == replica_id:
                return r
        return replicas[0]  # no pick (no worker known yet): Serve's choice, the first

    def publish_stats(self) -> None:
        """Every replica's routing stats into its pool's directory, rounded as replicas round them."""
        for (tier, role), replicas in self.replicas.items():
            infos = []
            for r in replicas:
                e = r.engine
                step_s, step_n = e.take_gaps()
                stats = RoutingStats(worker_id=r.worker_id, block_size=e.params.block_size, hash_algo="sha256",
                                     hash_seed=DEFAULT_SEED, kv_usage=round(e.pool.usage(), 1),
                                     running_seqs=len(e.running),
                                     queued_prompt_tokens=r.queued_prompt_tokens if role == "prefill" else None,
                                     step_s=None if step_s is None else round(step_s, 3),
                                     step_n=step_n or None)
                infos.append(ReplicaInfo(r.replica_id, r.capacity, stats))
            self.directories[(tier, role)].set_replicas(infos)
