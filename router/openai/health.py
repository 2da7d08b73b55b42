"""/health from a cache: at most one backend probe per interval, whatever the call rate.

A probe asks every engine for its stats (each walks its metrics registry and takes a request
slot of its replica), so an unauthenticated flood of /health must not turn into a flood of
probes. Callers within `interval_s` of the last probe get its answer; callers while a probe
runs wait for that same probe. Liveness (/livez) needs none of this: it touches no engine.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable, Mapping, Optional

log = logging.getLogger(__name__)

Probe = Callable[[], Awaitable[Mapping[str, Any]]]
_FAILED = {"ready": False, "reason": "health check failed"}


class HealthCache:
    def __init__(self, probe: Probe, interval_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._probe = probe
        self._interval_s = interval_s
        self._clock = clock
        self._answer: Optional[dict[str, Any]] = None
        self._answered_at = 0.0
        self._inflight: Optional[asyncio.Task] = None
        self.probes = 0  # how many probes ran (tests, and a sanity check on the interval)

    @property
    def interval_s(self) -> float:
        return self._interval_s

    async def get(self) -> dict[str, Any]:
        """The latest readiness answer, probing only when the cached one is older than the interval."""
        if self._answer is not None and self._clock() - self._answered_at < self._interval_s:
            return dict(self._answer)
        task = self._inflight
        # A task of another event loop (a test client's fresh loop) cannot be awaited here.
        if task is None or task.done() or task.get_loop() is not asyncio.get_running_loop():
            task = self._inflight = asyncio.ensure_future(self._run())
        # shield: one caller going away must not cancel the probe the others wait for.
        return dict(await asyncio.shield(task))

    async def _run(self) -> dict[str, Any]:
        self.probes += 1
        try:
            answer = dict(await self._probe())
        except Exception:
            log.warning("backend health check failed", exc_info=True)
            answer = dict(_FAILED)
        self._answer, self._answered_at = answer, self._clock()
        return answer
