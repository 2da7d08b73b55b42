"""A whole tandem cluster on the simulated clock: tandem's real admission gate, KVRouter
(prefix index, pipeline, decider, cost models, load ledger) and autoscaling policy, around
simulated engines, network and control plane. The request's plumbing follows router/pd/path.py
and hops.py call for call (route → dispatch the prefill hop → dispatch the decode hop, its
first token → `first_token`, a remote one's → `observe_handoff`), with none of their failure
handling: the simulated engines do not fail.

`run_tandem(...)` and `run_colocated(...)` take a seeded trace (loadtest/bench/workload.py) and
return the client's records (loadtest/measure/record.py), as the goodput benchmark's load
generator would have recorded them, plus what the policies decided (`Trace`).
"""

from __future__ import annotations

import asyncio
import random
from typing import Optional

from cluster.config import ClusterConfig
from cluster.hashing import DEFAULT_SEED, BlockHasher
from cluster.protocol import EngineRequest, ReceivedSampling
from loadtest.bench.workload import ScheduledRequest
from loadtest.measure.record import RequestRecord
from loadtest.sim.autoscale import Autoscaler
from loadtest.sim.control_plane import ControlPlane
from loadtest.sim.engine import SimEngine, SimRequest
from loadtest.sim.pools import Hardware, Replica, SimPools
from loadtest.sim.trace import Trace
from router.admission import TierGate
from router.openai.errors import OpenAIError
from router.prefix_index.memory import MemoryPrefixIndex
from router.routing.build import kv_router_settings
from router.routing.service import KVRouter

STATS_PERIOD_S = 1.0  # cluster/app.py request_routing_stats_period_s


def _record(req: ScheduledRequest, sent: float, tokens: list[float], error: str = "") -> RequestRecord:
    if error or not tokens:
        return RequestRecord(error=error or "no tokens", index=req.index, start_s=req.at_s, workload=req.kind)
    gaps = tuple((b - a) * 1000 for a, b in zip(tokens, tokens[1:]))
    return RequestRecord(ttft_ms=(tokens[0] - sent) * 1000, token_gaps_ms=gaps, e2e_ms=(tokens[-1] - sent) * 1000,
                         usage_tokens=len(tokens), prompt_tokens=len(req.prompt), status=200, index=req.index,
                         start_s=req.at_s, workload=req.kind)


async def _until_done(engine: SimEngine, r: SimRequest) -> SimRequest:
    engine.submit(r)
    await r.done.wait()
    return r


class TandemSim:
    def __init__(self, cfg: ClusterConfig, hw: Hardware, control: ControlPlane, seed: int, trace: Trace):
        loop = asyncio.get_running_loop()
        self.cfg = cfg
        self.hw = hw
        self.control = control
        self.trace = trace
        self.index = MemoryPrefixIndex()
        self.pools = SimPools(cfg, hw, self.index, lambda: control.slowdown(loop.time()),
                              lambda now, n: control.charge(now, tokens=n), control.engine_busy)
        self.router = KVRouter(directories=self.pools.directories, index=self.index, subscribe=False,
                               rng=random.Random(seed), clock=loop.time, timer=loop.time,
                               on_verdict=lambda inputs, d: trace.verdicts.append((inputs, d)),
                               **kv_router_settings(cfg))
        self.gates = {tier: TierGate(tier, t.admission, clock=loop.time) for tier, t in cfg.tiers.items()}
        self.autoscaler = Autoscaler(cfg, self.pools, trace)
        self.reuse = cfg.kv_transfer.first_token_reuse
        # None: no progress thread, the sender serves a pull once per step (engine.next_boundary).
        self.progress_thread = cfg.kv_transfer.nixl_progress_poll_ms is not None
        self.hop_s = control.cost.hop_s

    def _hashes(self, replica: Replica, prompt: tuple[int, ...]) -> list[int]:
        return BlockHasher(replica.engine.params.block_size, DEFAULT_SEED).hashes(prompt)

    async def serve(self, req: ScheduledRequest, tier: str) -> RequestRecord:
        loop = asyncio.get_running_loop()
        sent = loop.time()
        gate = self.gates[tier]
        try:
            await gate.enter()
        except OpenAIError as exc:  # the gate's 429 (router/openai/errors.py too_many_requests)
            return _record(req, sent, [], error=f"{exc.status} {exc.message}")
        admitted = loop.time()
        self.control.charge(admitted, requests=1)
        try:
            tokens = await self._generate(req, tier, lambda: gate.first_token(admitted))
        finally:
            gate.leave()
        return _record(req, sent, tokens)

    async def _generate(self, req: ScheduledRequest, tier: str, on_first) -> list[float]:
        rid = f"req-{req.index}"
        request = EngineRequest(rid, req.prompt, ReceivedSampling(req.max_tokens, None, b""), tier)
        decision = await self.router.route(request, tier)
        self.trace.paths[decision.path] = self.trace.paths.get(decision.path, 0) + 1
        await asyncio.sleep(self.hop_s)
        if decision.path in ("local", "whole"):
            role = "decode" if decision.path == "local" else "prefill"
            pick = decision.decode if role == "decode" else decision.prefill
            replica = self.pools.by_replica_id(tier, role, pick.worker.replica_id if pick else None)
            r = SimRequest(rid, len(req.prompt), self._hashes(replica, req.prompt), req.max_tokens)
            with self.router.dispatch(pick, rid, streams=True):
                replica.engine.submit(r)
                await r.first.wait()
                self.router.first_token(rid)
                on_first()
                await r.done.wait()
            return self._delivered(r.tokens)
        reuse = self.reuse and decision.reuse_first_token
        prefill = self.pools.by_replica_id(tier, "prefill", decision.prefill.worker.replica_id if decision.prefill else None)
        p = SimRequest(rid, len(req.prompt), self._hashes(prefill, req.prompt), 1, hold_blocks=True, streamed=reuse)
        with self.router.dispatch(decision.prefill, rid):
            prefill.queued_prompt_tokens += len(req.prompt)
            try:
                await _until_done(prefill.engine, p)
            finally:
                prefill.queued_prompt_tokens -= len(req.prompt)
            await asyncio.sleep(self.hop_s)  # the prefill's answer back to the gateway
        first = [loop_time()] if reuse else []
        if first:
            on_first()
        if reuse and req.max_tokens <= 1:
            prefill.engine.release(p)
            return self._delivered(first)
        await asyncio.sleep(self.hop_s)  # the decode call
        decode = self.pools.by_replica_id(tier, "decode", decision.decode.worker.replica_id if decision.decode else None)

        async def pull(tokens: int) -> None:
            await prefill.nic.send(tokens * self.hw.kv_bytes_per_token)
            if not self.progress_thread:
                await prefill.engine.next_boundary()
            prefill.engine.release(p)

        d = SimRequest(rid, len(req.prompt), self._hashes(decode, req.prompt), req.max_tokens - len(first),
                       remote_kv=pull)
        called = loop_time() - self.hop_s  # before the call hop, as hops.py times it
        with self.router.dispatch(decision.decode, rid, streams=True):
            decode.engine.submit(d)
            await d.first.wait()
            self.router.first_token(rid)
            if decision.decode is not None:
                # The gateway sees the token one hop after the engine samples it.
                self.router.observe_handoff(decision.decode, loop_time() + self.hop_s - called)
            if not first:
                on_first()
            await d.done.wait()
        return first + self._delivered(d.tokens)

    def _delivered(self, tokens: list[float]) -> list[float]:
        """Engine times → the client's: one hop back (a constant, so gaps stay the engine's)."""
        return [t + self.hop_s for t in tokens]

    async def stats_loop(self) -> None:
        while True:
            self.pools.publish_stats()
            await asyncio.sleep(STATS_PERIOD_S)


def loop_time() -> float:
    return asyncio.get_running_loop().time()


async def drive(schedule: list[ScheduledRequest], serve, drain_timeout_s: float) -> list[RequestRecord]:
    """Open loop, as loadtest/bench/loadgen.py: each request at its arrival time; those not done
    `drain_timeout_s` after the last arrival are cut and count as errors."""
    records: dict[int, RequestRecord] = {}

    async def one(req: ScheduledRequest) -> None:
        await asyncio.sleep(req.at_s)
        records[req.index] = await serve(req)

    tasks = [asyncio.get_running_loop().create_task(one(r)) for r in schedule]
    deadline = (schedule[-1].at_s if schedule else 0.0) + drain_timeout_s
    await asyncio.wait(tasks, timeout=deadline) if tasks else None
    for t in tasks:
        t.cancel()
    return [records.get(r.index) or RequestRecord(error=f"unfinished {drain_timeout_s:.0f} s after the last arrival",
                                                  index=r.index, start_s=r.at_s, workload=r.kind) for r in schedule]
