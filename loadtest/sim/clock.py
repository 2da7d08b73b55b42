"""The discrete-event core: an asyncio event loop whose clock is simulated.

`asyncio` already is a discrete-event scheduler: a heap of timers and a FIFO of ready
callbacks. The only thing that ties it to the wall clock is `time()` and the selector's
blocking `select(timeout)`. Here `time()` returns a simulated clock, and `select` never
blocks: when nothing is ready it moves the clock to the next timer. So `await
asyncio.sleep(0.5)` costs no wall time, and tandem's own async code (the gateway's admission
gate, the KVRouter's `route`) runs unchanged on the simulated clock.

Determinism: one thread, no real I/O, timers ordered by (time, insertion) in asyncio's heap,
ready callbacks in FIFO order. The same program and seed give the same event order, so the
same JSON byte for byte (tests/unit/test_sim_core.py). Never call real I/O or threads from a
simulation: a real socket would never become ready, and `to_thread` would race.
"""

from __future__ import annotations

import asyncio
import selectors
from typing import Awaitable, Callable, TypeVar

T = TypeVar("T")


class _NonBlockingSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    """Polls the loop's own self-pipe without waiting; a wait becomes a jump of the clock."""

    def __init__(self, loop: "VirtualTimeLoop"):
        super().__init__()
        self._loop = loop

    def select(self, timeout=None):
        events = super().select(0)
        if events:
            return events
        if timeout is None:
            raise SimulationStuck(f"at t={self._loop.time():.6f} s nothing is scheduled and some task still "
                                  "waits: a coroutine awaits something no simulated event will ever set")
        self._loop.advance(timeout)
        return []


class SimulationStuck(RuntimeError):
    """Every task waits and no timer is left: a bug in the simulated program."""


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._now = 0.0
        super().__init__(selector=_NonBlockingSelector(self))
        # A timer is due when its time is within this of now; the clock jumps exactly by the
        # timeout asyncio computed, so float rounding is the only slack needed.
        self._clock_resolution = 1e-9

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds > 0:
            self._now += seconds


def simulate(main: Callable[[], Awaitable[T]]) -> T:
    """Run `main()` to completion on a fresh simulated clock starting at 0."""
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(main())
    finally:
        # What still runs (engine loops, timers' tasks) is cancelled, as asyncio.run does.
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def now() -> float:
    """The simulated time of the running loop (seconds since the simulation began)."""
    return asyncio.get_running_loop().time()
