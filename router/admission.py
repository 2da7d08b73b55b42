"""Admission control per tier: a bounded queue in front of the pools, 429 beyond it.

`AdmissionControl(backend, limits)` wraps any OpenAIBackend (the gateway wraps
DisaggregatedBackend) and implements the same interface. Each tier has its own `TierGate`:
at most `max_running` of its requests in the pools, at most `max_queued` waiting (FIFO) for
a place, and a wait of at most `queue_timeout_s`. With `max_queue_wait_s` set, a request is
also refused on arrival when its expected wait exceeds it: its place in line divided by the
rate at which places freed up over the last `RATE_WINDOW_S` (Little's law), so the requests a
tier admits under overload start within its TTFT objective instead of queueing past it. With
`target_ttft_s` set, the number of running places adapts between `min_running` and
`max_running` (router/concurrency_limit.py) so that admitted requests reach their first token
within it: past the knee, more requests in the pools only queue inside the engines. Past any
bound the request gets 429 with Retry-After before any engine work. Tiers share nothing, so
batch load never takes an interactive place or queue slot.

Call order per request: `generate(request)` → the first `anext` waits for a place (or raises
429) → chunks stream (the first one reports the request's TTFT to the gate) → the place is
released when the stream ends, fails or is closed (client gone: the edge closes the iterator
and calls `abort`).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Mapping, Optional

from cluster.config import AdmissionConfig
from cluster.metrics import Counter, Gauge
from cluster.protocol import EngineRequest
from cluster.tracing import Tracing, end_span
from router.backend import Backend
from router.concurrency_limit import AdaptiveLimit
from router.openai.errors import too_many_requests

if TYPE_CHECKING:
    from vllm.outputs import RequestOutput

REJECTED = Counter("tandem_admission_rejected", "Requests refused with 429, by tier and why.", ["tier", "reason"])
RUNNING = Gauge("tandem_admission_running", "Admitted requests in the pools, by tier.", ["tier"])
QUEUED = Gauge("tandem_admission_queued", "Requests waiting for admission, by tier.", ["tier"])
LIMIT = Gauge("tandem_admission_limit", "Running places a tier offers now (adapts with target_ttft_s).", ["tier"])

RATE_WINDOW_S = 5.0  # long enough to span a few requests, short enough to follow a load change


class TierGate:
    """A FIFO gate: `limit` places (max_running, or adaptive), `max_queued` waiting spots.
    Not thread-safe: one event loop."""

    def __init__(self, tier: str, config: AdmissionConfig, clock: Callable[[], float] = time.monotonic):
        self.tier = tier
        self.max_queued = config.max_queued
        self.queue_timeout_s = config.queue_timeout_s
        self.retry_after_s = config.retry_after_s
        self.max_queue_wait_s = config.max_queue_wait_s
        self.running = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._clock = clock
        self._freed: deque[float] = deque()  # when places freed up, over the last RATE_WINDOW_S
        self._max_running = config.max_running
        self.target_ttft_s = config.target_ttft_s
        self._adaptive = None if config.target_ttft_s is None else AdaptiveLimit(
            config.target_ttft_s, config.min_running, config.max_running, clock)

    @property
    def limit(self) -> int:
        return self._max_running if self._adaptive is None else self._adaptive.limit

    def first_token(self, admitted_at: float) -> None:
        """An admitted request's first token (admitted_at: the clock when it got its place)."""
        if self._adaptive is not None:
            self._adaptive.observe(self._clock() - admitted_at, admitted_at, self.running)
            self._admit_waiters()  # the limit may have grown
            LIMIT.labels(self.tier).set(self.limit)

    def now(self) -> float:
        return self._clock()

    def expected_wait_s(self, position: int) -> Optional[float]:
        """Seconds until the `position`-th in line gets a place at the recent rate; None before
        two places have freed up in the window (nothing to go on: only max_queued applies)."""
        now = self._clock()
        self._forget_before(now - RATE_WINDOW_S)
        n = len(self._freed)
        if n < 2:
            return None
        # n departures over the span seen plus one mean gap before the first; the time since
        # the last one counts too, so a stalled pool reads as slow at once.
        span = now - self._freed[0] + (self._freed[-1] - self._freed[0]) / (n - 1)
        return position * span / n

    def _forget_before(self, cutoff: float) -> None:
        while self._freed and self._freed[0] < cutoff:
            self._freed.popleft()

    @property
    def queued(self) -> int:
        return len(self._waiters)

    def _reject(self, reason: str, message: str):
        REJECTED.labels(self.tier, reason).inc()
        return too_many_requests(message, self.retry_after_s)

    async def enter(self) -> None:
        """Take a place, waiting in line if needed; raises 429 when the line is full or too slow."""
        if self.running < self.limit and not self._waiters:
            self.running += 1
            return
        if len(self._waiters) >= self.max_queued:
            raise self._reject("queue_full", f"The {self.tier} tier is at capacity ({self.limit} running, "
                                             f"{self.max_queued} queued); retry after {self.retry_after_s} s.")
        if self.max_queue_wait_s is not None:
            wait = self.expected_wait_s(len(self._waiters) + 1)
            if wait is not None and wait > self.max_queue_wait_s:
                raise self._reject("expected_wait", f"The {self.tier} tier is at capacity: a place would take about "
                                                    f"{wait:.1f} s (bound {self.max_queue_wait_s:g} s); retry after "
                                                    f"{self.retry_after_s} s.")
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), self.queue_timeout_s)
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled():
                self.leave()  # the place was handed to us as we gave up: pass it on
            else:
                waiter.cancel()
                self._waiters.remove(waiter)
            if isinstance(exc, asyncio.TimeoutError):
                raise self._reject("queue_timeout", f"The {self.tier} tier's queue did not move within "
                                                    f"{self.queue_timeout_s:g} s; retry after {self.retry_after_s} s.") from None
            raise

    def leave(self) -> None:
        """Release a place, and hand free places to the first waiters (fewer if the limit shrank)."""
        if self.max_queue_wait_s is not None:  # only the wait bound reads the rate
            now = self._clock()
            self._freed.append(now)
            self._forget_before(now - RATE_WINDOW_S)  # bounded by the window, read or not
        self.running -= 1
        self._admit_waiters()

    def _admit_waiters(self) -> None:
        while self._waiters and self.running < self.limit:
            waiter = self._waiters.popleft()
            if not waiter.done():  # a waiter that gave up is skipped
                waiter.set_result(None)
                self.running += 1


class AdmissionControl:
    """An OpenAIBackend that admits each request through its tier's gate."""

    tracing: Optional[Tracing] = None  # set by the gateway when tracing is on: a span per wait

    def __init__(self, backend: Backend, limits: Mapping[str, AdmissionConfig]):
        """`limits`: tier → its AdmissionConfig."""
        self.backend = backend
        self.gates = {tier: TierGate(tier, config) for tier, config in limits.items()}
        for gate in self.gates.values():
            LIMIT.labels(gate.tier).set(gate.limit)

    async def generate(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        gate = self.gates[request.tier]
        span = self.tracing and self.tracing.child("tandem.admission", **{"tandem.tier": gate.tier})
        QUEUED.labels(gate.tier).inc()
        try:
            await gate.enter()
        except BaseException as exc:
            end_span(span, exc)  # a 429 ends the wait failed, with its status
            raise
        finally:
            QUEUED.labels(gate.tier).dec()
        end_span(span)
        RUNNING.labels(gate.tier).inc()
        admitted_at, first = gate.now(), True
        try:
            async for chunk in self.backend.generate(request):
                if first:
                    gate.first_token(admitted_at)
                    first = False
                yield chunk
        finally:
            gate.leave()
            RUNNING.labels(gate.tier).dec()

    async def abort(self, request_id: str) -> None:
        await self.backend.abort(request_id)

    async def health(self) -> dict[str, Any]:
        info = dict(await self.backend.health())
        # max_queue_wait_s / target_ttft_s null: no shedding on a predicted wait, as vLLM's server
        info["admission"] = {t: {"running": g.running, "queued": g.queued, "limit": g.limit,
                                 "max_queued": g.max_queued, "max_queue_wait_s": g.max_queue_wait_s,
                                 "target_ttft_s": g.target_ttft_s}
                             for t, g in self.gates.items()}
        return info
