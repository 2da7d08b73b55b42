"""tandem's autoscaling policy (cluster/autoscaling/policy.py `decide`, rules from the pool's
config by serve_policy.py `rules_for`) ticking on the simulated clock, every pool with an
`autoscaling` section. A replica asked for starts `start_s` later (cold start: ~35-40 s for a
CPU engine replica here, RESULTS.md / DESIGN.md; pass the accelerator's). A replica removed
stops taking new requests and finishes those it has.

Signals: the pool's queued prompt tokens, running sequences (running + waiting, as
signals.py reports them), KV usage. The TTFT and ITL signals (windowed latency histograms in
the real adapter) are not fed yet: a TODO, stated in the README.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from cluster.autoscaling.policy import Observation, PolicyState, decide
from cluster.autoscaling.serve_policy import rules_for
from cluster.config import ClusterConfig

from loadtest.sim.trace import Trace

if TYPE_CHECKING:
    from loadtest.sim.pools import SimPools

DEFAULT_START_S = 37.0  # RESULTS.md: tandem's cold start on the 2-core VM, 35-38 s


class Autoscaler:
    def __init__(self, cfg: ClusterConfig, pools: "SimPools", trace: Trace, start_s: float = DEFAULT_START_S):
        self.pools = pools
        self.trace = trace
        self.start_s = start_s
        self.pool_keys = [(tier, role) for tier in cfg.tiers for role in ("prefill", "decode")
                          if pools.pool_config(tier, role).autoscaling is not None]
        self.targets = {k: len(pools.replicas[k]) for k in self.pool_keys}
        self.states = {k: PolicyState() for k in self.pool_keys}

    def observe(self, key: tuple[str, str], now: float) -> Observation:
        replicas = self.pools.replicas[key]
        engines = [r.engine for r in replicas]
        return Observation(
            now=now, replicas=len(replicas), target=self.targets[key],
            queued_prompt_tokens=float(sum(r.queued_prompt_tokens for r in replicas)),
            running_seqs=float(sum(len(e.running) + len(e.waiting) for e in engines)),
            kv_usage=sum(e.pool.usage() for e in engines) / max(len(engines), 1))

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
                        self.pools.replicas[key].pop()  # leaves the directory at the next stats
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
