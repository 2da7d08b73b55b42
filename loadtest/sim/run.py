"""One simulated run: a system serving a seeded trace, judged as the goodput benchmark judges.

`simulate_tandem` runs tandem's real policies (harness.py); `simulate_colocated` runs the
benchmark's baseline: n engines each doing both phases, request i on engine i mod n, as
loadtest/bench/loadgen.py spreads them, with vLLM's own API server as their control plane.
Both return the client's records and what was decided; `summary` adds the benchmark's own
goodput arithmetic (loadtest/bench/workload.py `summarize`, loadtest/measure/slo.py).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Optional, Sequence

from cluster.config import ClusterConfig
from loadtest.bench.workload import ScheduledRequest, summarize
from loadtest.measure.record import RequestRecord
from loadtest.measure.slo import Objective
from loadtest.sim.clock import simulate
from loadtest.sim.control_plane import ControlPlane, ControlPlaneCost
from loadtest.sim.engine import EngineParams, SimEngine, SimRequest
from loadtest.sim.harness import TandemSim, _record, drive
from loadtest.sim.trace import Trace
from loadtest.sim.kv_cache import BlockPool
from loadtest.sim.pools import Hardware
from loadtest.sim.step_time import StepTimeModel


@dataclass
class RunResult:
    records: list[RequestRecord]
    trace: Trace
    control: dict
    engines: dict[str, dict]
    span_s: float

    def summary(self, objective: Objective, every_gap: Objective, duration_s: float, cores: int) -> dict:
        out = summarize(self.records, objective, duration_s, self.span_s, cores)
        out["goodput_rps_max_gap"] = round(sum(every_gap.met_by(r) for r in self.records) / duration_s, 4)
        out.pop("by_kind", None)
        return out


def _span(records: list[RequestRecord]) -> float:
    ends = [r.start_s + r.e2e_ms / 1000 for r in records if r.ok and r.e2e_ms is not None]
    return max(ends) - min(r.start_s for r in records) if ends else 0.0


def _engine_stats(engines: dict[str, SimEngine], span: float) -> dict[str, dict]:
    return {wid: {"steps": e.steps, "preemptions": e.preemptions,
                  "busy_share": round(e.busy_s / span, 3) if span > 0 else None,
                  "full_chunks": e.full_chunks[0],
                  "full_chunk_ms_mean": round(1000 * e.full_chunks[1] / e.full_chunks[0], 1) if e.full_chunks[0] else None}
            for wid, e in sorted(engines.items())}


def simulate_tandem(cfg: ClusterConfig, hw: Hardware, cost: ControlPlaneCost, schedule: list[ScheduledRequest], *,
                    seed: int, drain_timeout_s: float, control_cores: float,
                    shares_engine_cores: Optional[float], tier: Optional[str] = None,
                    warm_up: Sequence[ScheduledRequest] = (),
                    earlier: Sequence[list[ScheduledRequest]] = ()) -> RunResult:
    """One tandem cluster serving `schedule`. As the goodput benchmark runs it, the same cluster
    may first serve `warm_up` (one request at a time) and the `earlier` rates (each to its end):
    the router's cost models and the admission limit learn from them, and nothing of them is
    reported (records, verdicts, engine and control-plane counts are the schedule's alone)."""
    tier = tier or next(iter(cfg.tiers))
    trace = Trace()

    async def main() -> RunResult:
        control = ControlPlane(cost, control_cores, shares_engine_cores)
        sim = TandemSim(cfg, hw, control, seed, trace)
        sim.pools.start()
        sim.pools.publish_stats()
        loop = asyncio.get_running_loop()
        background = [loop.create_task(sim.stats_loop()), loop.create_task(sim.autoscaler.loop())]
        for req in warm_up:
            await sim.serve(req, tier)
        for before in earlier:
            await drive(before, lambda req: sim.serve(req, tier), drain_timeout_s)
            # The client gave up on the stragglers; vLLM aborts them, the simulated engines finish
            # them instead: wait for that, or the next rate would start behind their backlog.
            while not sim.pools.idle():
                await asyncio.sleep(1.0)
        if warm_up or earlier:
            trace.clear()
            control.reset_counts()
            for r in sim.pools.all():
                r.engine.reset_counts()
        records = await drive(schedule, lambda req: sim.serve(req, tier), drain_timeout_s)
        for task in background:
            task.cancel()
        engines = {r.worker_id: r.engine for r in sim.pools.all()}
        for e in engines.values():
            e.stop()
        span = _span(records)
        return RunResult(records, trace, control.summary(span), _engine_stats(engines, span), span)

    return simulate(main)


def simulate_colocated(n: int, params: EngineParams, step_model: StepTimeModel, cost: ControlPlaneCost,
                       schedule: list[ScheduledRequest], *, drain_timeout_s: float, control_cores: float,
                       shares_engine_cores: Optional[float]) -> RunResult:
    from cluster.hashing import DEFAULT_SEED, BlockHasher

    async def main() -> RunResult:
        loop = asyncio.get_running_loop()
        control = ControlPlane(cost, control_cores, shares_engine_cores)
        engines = [SimEngine(f"colocated-{i}", params, step_model,
                             BlockPool(f"colocated-{i}", params.num_blocks, params.block_size, lambda ev: None),
                             lambda: control.slowdown(loop.time()), lambda now, k: control.charge(now, tokens=k),
                             control.engine_busy)
                   for i in range(n)]
        for e in engines:
            e.start()
        hasher = BlockHasher(params.block_size, DEFAULT_SEED)

        async def serve(req: ScheduledRequest) -> RequestRecord:
            sent = loop.time()
            control.charge(sent, requests=1)
            r = SimRequest(f"req-{req.index}", len(req.prompt), hasher.hashes(req.prompt), req.max_tokens)
            engines[req.index % n].submit(r)
            await r.done.wait()
            return _record(req, sent, r.tokens)

        records = await drive(schedule, serve, drain_timeout_s)
        for e in engines:
            e.stop()
        span = _span(records)
        return RunResult(records, Trace(), control.summary(span), _engine_stats({e.worker_id: e for e in engines}, span),
                         span)

    return simulate(main)
