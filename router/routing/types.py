"""Plain data the routing pipeline works on (frozen: a decision never mutates its inputs)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Mapping, Optional

Path = Literal["remote", "local", "whole"]
"""The path a request takes, in one vocabulary from the decider to the metrics: `remote` (the
prompt on a prefill replica, the tokens on a decode replica, the KV between them), `local`
(all of it on the decode replica), `whole` (all of it on the prefill replica: no decode hop)."""

RouteLabel = Literal["disaggregated", "decode_only", "prefill_only", "fallback_recompute", "router_error"]
"""The `path` label of tandem_route, tandem_routing_decisions and tandem_decode_first_token_seconds:
the Path taken, or what became of it. Older than Path, and kept: dashboards, alert rules and the
recorded benchmark results (loadtest/bench/results/) read these values."""

ROUTE_LABELS: Mapping[Path, RouteLabel] = {"remote": "disaggregated", "local": "decode_only", "whole": "prefill_only"}
"""The one map from a Path to its metric label (tandem_pd_decisions counts the Path itself)."""


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
    # LoRA: the adapters the engine holds or is about to (its report: vLLM's resident, running and
    # waiting adapters; plus this gateway's requests on it now, fresher), and how many it can hold
    # (vLLM's max_loras). None: it serves no LoRA, or has not reported it yet.
    loras: frozenset[str] = frozenset()
    max_loras: Optional[int] = None


@dataclass(frozen=True)
class RouteContext:
    """What the filters and scorers know about the request."""

    tier: str
    prompt_tokens: int
    num_blocks: Mapping[str, int] = field(default_factory=dict)  # worker → full blocks of the prompt
    matches: Mapping[str, int] = field(default_factory=dict)  # worker → leading blocks it holds
    adapter: Optional[str] = None  # the LoRA adapter's name; None: the base model


@dataclass(frozen=True)
class Pick:
    worker: Worker
    score: float
    scores: Mapping[str, float]  # scorer → score in [0, 1], before weights


@dataclass(frozen=True)
class RouteDecision:
    """Where one request goes. A pick that is None means: no worker known, let Serve choose
    (`prefill` is None on path local; path whole always has one). `reason` is counted in metrics."""

    prefill: Optional[Pick]
    decode: Optional[Pick]
    path: Path
    reason: str
    predicted_hit_tokens: int = 0  # prompt tokens the chosen engine should find cached
    reuse_first_token: bool = True  # the prefill's token may be the answer's first (decider rule 9)
