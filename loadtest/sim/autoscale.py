"""tandem's autoscaling policy (cluster/autoscaling/policy.py `decide`, rules from the pool's
config by serve_policy.py `rules_for`) ticking on the simulated clock, every pool with an
`autoscaling` section. A replica asked for starts `start_s` later (cold start: ~35-40 s for a
CPU engine replica here, RESULTS.md / DESIGN.md; pass the accelerator's). A replica removed
stops taking new requests and finishes those it has.

Signals, as the real path makes them: every `metrics_interval_s` each replica samples what
signals.py `ReplicaSignals.sample` reports (queued prompt tokens, running + waiting sequences,
KV usage, and the increments of vLLM's TTFT and inter-token-latency `_sum`/`_count`, the
first sample's increments 0); Serve averages each replica's samples over `look_back_s`
(its custom-metrics window: a mean of the step function, here of the evenly spaced samples)
and serve_policy.py `observe` totals them over the running replicas (KV usage: their mean;
latency: the ratio of the summed means, a request-weighted mean, None with no request).
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import astuple, dataclass, replace
from typing import TYPE_CHECKING, Optional

from cluster.autoscaling.policy import Observation, PolicyState, decide
from cluster.autoscaling.serve_policy import rules_for
from cluster.config import ClusterConfig

from loadtest.sim.engine import LatencyCounters
from loadtest.sim.trace import Trace

if TYPE_CHECKING:
    from loadtest.sim.pools import Replica, SimPools

DEFAULT_START_S = 37.0  # RESULTS.md: tandem's cold start on the 2-core VM, 35-38 s


@dataclass(frozen=True)
class ReplicaSample:
    """One replica's report (signals.py's names): gauges, and counter increments since its last."""

    queued_prompt_tokens: float
    running_seqs: float
    kv_usage: float
    ttft_s_sum: float
    ttft_count: float
    itl_s_sum: float
    itl_count: float


def _mean(samples: "deque[tuple[float, ReplicaSample]]") -> ReplicaSample:
    columns = zip(*(astuple(s) for _, s in samples))
    return ReplicaSample(*(sum(c) / len(samples) for c in columns))


class Autoscaler:
    def __init__(self, cfg: ClusterConfig, pools: "SimPools", trace: Trace, start_s: float = DEFAULT_START_S):
        self.pools = pools
        self.trace = trace
        self.start_s = start_s
        self.pool_keys = [(tier, role) for tier in cfg.tiers for role in ("prefill", "decode")
                          if pools.pool_config(tier, role).autoscaling is not None]
        self.targets = {k: len(pools.replicas[k]) for k in self.pool_keys}
        self.states = {k: PolicyState() for k in self.pool_keys}
        self._windows: dict[str, deque[tuple[float, ReplicaSample]]] = {}  # by worker id
        self._last_counters: dict[str, LatencyCounters] = {}

    def _sample(self, replica: "Replica", now: float, look_back_s: float) -> ReplicaSample:
        """The replica's report now, kept in its window; the window's mean."""
        e = replica.engine
        counters = replace(e.latency)  # a copy: the engine's keep counting
        last = self._last_counters.get(replica.worker_id, counters)  # the first report: increments 0
        self._last_counters[replica.worker_id] = counters
        sample = ReplicaSample(
            queued_prompt_tokens=float(replica.queued_prompt_tokens),
            running_seqs=float(len(e.running) + len(e.waiting)),
            kv_usage=e.pool.usage(),
            ttft_s_sum=counters.ttft_s_sum - last.ttft_s_sum, ttft_count=counters.ttft_count - last.ttft_count,
            itl_s_sum=counters.itl_s_sum - last.itl_s_sum, itl_count=counters.itl_count - last.itl_count)
        window = self._windows.setdefault(replica.worker_id, deque())
        window.append((now, sample))
        while window[0][0] <= now - look_back_s:
            window.popleft()
        return _mean(window)

    def observe(self, key: tuple[str, str], now: float) -> Observation:
        """The pool's Observation now. Takes each replica's report (once per tick, as the
        real replicas report once per interval) into its window."""
        replicas = self.pools.replicas[key]
        look_back_s = self.pools.pool_config(*key).autoscaling.look_back_s
        means = [self._sample(r, now, look_back_s) for r in replicas]

        def ratio(total: float, count: float) -> Optional[float]:
            return total / count if count else None

        return Observation(
            now=now, replicas=len(replicas), target=self.targets[key],
            queued_prompt_tokens=sum(m.queued_prompt_tokens for m in means),
            ttft_s=ratio(sum(m.ttft_s_sum for m in means), sum(m.ttft_count for m in means)),
            running_seqs=sum(m.running_seqs for m in means),
            kv_usage=sum(m.kv_usage for m in means) / max(len(means), 1),
            itl_s=ratio(sum(m.itl_s_sum for m in means), sum(m.itl_count for m in means)))

    def tick(self, now: float) -> None:
        for key in self.pool_keys:
            tier, role = key
            rules = rules_for(role, self.pools.pool_config(tier, role), self.pools.cfg.tiers[tier].slo)  # type: ignore[arg-type]
            obs = self.observe(key, now)
            decision, state = decide(rules, obs, self.states[key])
            self.trace.scaling.append((rules, obs, self.states[key], decision, state))
            self.states[key] = state
            if decision.target > self.targets[key]:
                for _ in range(decision.target - self.targets[key]):
                    asyncio.get_running_loop().call_later(self.start_s, self._start_one, key)
            elif decision.target < self.targets[key]:
                for _ in range(self.targets[key] - decision.target):
                    if len(self.pools.replicas[key]) > 1:
                        gone = self.pools.replicas[key].pop()  # leaves the directory at the next stats
                        self._windows.pop(gone.worker_id, None)  # Serve drops a stopped replica's metrics
                        self._last_counters.pop(gone.worker_id, None)
            self.targets[key] = decision.target

    def _start_one(self, key: tuple[str, str]) -> None:
        replica = self.pools.add(*key)
        replica.engine.start()

    async def loop(self) -> None:
        if not self.pool_keys:
            return
        interval = min(self.pools.pool_config(*k).autoscaling.metrics_interval_s for k in self.pool_keys)
        while True:
            await asyncio.sleep(interval)
            self.tick(asyncio.get_running_loop().time())
