"""Plain data the routing pipeline works on (frozen: a decision never mutates its inputs)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional


@dataclass(frozen=True)
class Worker:
    """One engine replica as the router sees it.

    `worker_id` is the engine's own id (`<tier>-<pool>-<Serve replica id>`, cluster/types.py PoolId.worker_id),
    the name its KV events are indexed under; `replica_id` is the Serve replica's unique id,
    used to send a request to exactly this replica.
    """

    worker_id: str
    replica_id: str
    tier: str
    pool: str  # "prefill" | "decode"
    healthy: bool = True
    in_flight: int = 0  # this gateway's requests now on the replica
    capacity: int = 1  # the replica's max_ongoing_requests
    kv_usage: float = 0.0  # 0..1, reported by the engine
    block_size: Optional[int] = None  # None until the replica reported its cache layout
    hash_seed: Optional[str] = None


@dataclass(frozen=True)
class RouteContext:
    """What the filters and scorers know about the request."""

    tier: str
    prompt_tokens: int
    num_blocks: Mapping[str, int] = field(default_factory=dict)  # worker → full blocks of the prompt
    matches: Mapping[str, int] = field(default_factory=dict)  # worker → leading blocks it holds


@dataclass(frozen=True)
class Pick:
    worker: Worker
    score: float
    scores: Mapping[str, float]  # scorer → score in [0, 1], before weights


@dataclass(frozen=True)
class RouteDecision:
    """Where one request goes. `prefill` None with `skip_prefill` False means: no worker known,
    let Serve choose. `reason` is counted in metrics. `skip_prefill` and `whole_on_prefill`
    are never both set."""

    prefill: Optional[Pick]
    decode: Optional[Pick]
    skip_prefill: bool
    reason: str
    predicted_hit_tokens: int = 0  # prompt tokens the chosen engine should find cached
    whole_on_prefill: bool = False  # the whole request on `prefill` (a short answer): no decode hop
    reuse_first_token: bool = True  # the prefill's token may be the answer's first (decider rule 9)
