"""Filter → score → pick, configured as data.

Filters drop workers that must not get the request; scorers rate the rest in [0, 1]; the
picker takes the highest weighted sum, ties broken at random (so equal workers share load).
Weights come from the cluster YAML (`routing.weights`); a scorer with weight 0 (or none) is skipped.
Two baseline pickers (`routing.picker`) ignore the scores, for benchmarks that compare
routing policies: `round_robin` and `random` over the workers that pass the filters.
"""

from __future__ import annotations

import random
from typing import Callable, Mapping, Optional, Sequence

from router.routing.types import Pick, RouteContext, Worker

Filter = Callable[[Worker, RouteContext], bool]
Scorer = Callable[[Worker, RouteContext], float]


def healthy(worker: Worker, ctx: RouteContext) -> bool:
    return worker.healthy


def in_tier(worker: Worker, ctx: RouteContext) -> bool:
    return worker.tier == ctx.tier


def has_capacity(worker: Worker, ctx: RouteContext) -> bool:
    return worker.in_flight < worker.capacity


# Hard filters never relax; soft ones are dropped when they would leave no worker (Serve then
# queues the request on a busy replica rather than fail it).
HARD_FILTERS: tuple[Filter, ...] = (healthy, in_tier)
SOFT_FILTERS: tuple[Filter, ...] = (has_capacity,)


def prefix_score(worker: Worker, ctx: RouteContext) -> float:
    """Share of the prompt's full blocks already cached on the worker."""
    total = ctx.num_blocks.get(worker.worker_id, 0)
    return min(ctx.matches.get(worker.worker_id, 0) / total, 1.0) if total else 0.0


def load_score(worker: Worker, ctx: RouteContext) -> float:
    """1 when idle, 0 at capacity (this gateway's in-flight requests on it)."""
    return max(0.0, 1.0 - worker.in_flight / max(worker.capacity, 1))


KV_USAGE_HEADROOM = 0.5
"""kv_usage_score counts only the cache's upper half. Below it, the usage an engine reported (up
to a second old, rounded to 0.1) says less about its load than this gateway's in-flight counts,
which are exact: a 0.1 difference weighs 0.01 at kv_usage's default weight, more than one request
in flight (0.5 / 64), so a stale reading used to send a whole burst to one replica (issue 29's
kill runs: 3 of 4 streams on the killed replica). Near full, the cache's room matters on its own:
new prompts preempt running ones and evict the prefixes we route for."""


def kv_usage_score(worker: Worker, ctx: RouteContext) -> float:
    """Free KV cache above KV_USAGE_HEADROOM: 1 up to it, 0 when full."""
    used_of_upper = (worker.kv_usage - KV_USAGE_HEADROOM) / (1.0 - KV_USAGE_HEADROOM)
    return min(max(1.0 - used_of_upper, 0.0), 1.0)


# lora_score's levels. Holding the adapter costs nothing; loading it into a free slot costs a load
# (a read from disk, weights copied in) but takes nothing from anyone; loading it into a full
# engine evicts another adapter, which the next request naming that one pays to load again.
LORA_HELD, LORA_ROOM, LORA_EVICTS = 1.0, 0.5, 0.0
LORA_DEFAULT_WEIGHT = 0.3
"""`routing.weights.lora` when the YAML leaves it out and model.lora_adapters is set (build.py).
Above kv_usage (0.1), below load (0.5) and prefix (1.0): a cached prefix of the prompt (already
adapter-specific: block hashes carry the adapter) or a clearly lighter engine wins; among engines
otherwise alike, the one holding the adapter does, and a full engine is the last choice."""


def lora_score(worker: Worker, ctx: RouteContext) -> float:
    """Adapter affinity, as llm-d's lora-affinity scorer: the engine holds (or is loading, or has
    queued) the request's adapter; else it has a free adapter slot; else it would evict one. A base
    request scores every worker alike. An engine that has not reported max_loras counts as having
    room: unknown is not worse than known-free, and it is better than known-full."""
    if ctx.adapter is None or ctx.adapter in worker.loras:
        return LORA_HELD
    if worker.max_loras is None or len(worker.loras) < worker.max_loras:
        return LORA_ROOM
    return LORA_EVICTS


SCORERS: Mapping[str, Scorer] = {"prefix": prefix_score, "load": load_score, "kv_usage": kv_usage_score,
                                 "lora": lora_score}
PICKERS = ("max_score", "round_robin", "random")


def pick(workers: Sequence[Worker], ctx: RouteContext, weights: Mapping[str, float],
         rng: random.Random, picker: str = "max_score", turn: int = 0) -> Optional[Pick]:
    """The worker for the request, or None when no worker passes the hard filters.

    `max_score`: the highest weighted sum, ties at random. `round_robin`: the candidates in
    worker-id order, the `turn`-th (the caller counts its picks per pool). `random`: any
    candidate. The baselines still report the chosen worker's scores, for metrics.
    """
    candidates = [w for w in workers if all(f(w, ctx) for f in HARD_FILTERS)]
    relaxed = [w for w in candidates if all(f(w, ctx) for f in SOFT_FILTERS)]
    candidates = relaxed or candidates
    if not candidates:
        return None
    active = [(name, SCORERS[name], weight) for name, weight in weights.items() if weight > 0]
    if picker != "max_score":
        if picker == "round_robin":
            chosen = sorted(candidates, key=lambda w: w.worker_id)[turn % len(candidates)]
        elif picker == "random":
            chosen = rng.choice(candidates)
        else:
            raise ValueError(f"unknown picker {picker!r}; pickers are {PICKERS}")
        scores = {name: scorer(chosen, ctx) for name, scorer, _ in active}
        return Pick(chosen, sum(weight * scores[name] for name, _, weight in active), scores)
    best: list[Worker] = []
    best_total = float("-inf")
    for worker in candidates:
        total = sum(weight * scorer(worker, ctx) for _, scorer, weight in active)
        if total > best_total + 1e-12:
            best, best_total = [worker], total
        elif total >= best_total - 1e-12:
            best.append(worker)
    chosen = rng.choice(best)
    return Pick(chosen, best_total, {name: scorer(chosen, ctx) for name, scorer, _ in active})
