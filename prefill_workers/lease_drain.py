"""A removed prefill replica keeps its engine until the decodes have pulled what it handed out.

Serve stops a prefill replica (scale-down, redeploy) once its prefill calls have returned. Each
returned handoff is a lease: the engine keeps the prompt's KV blocks until a decode engine has
pulled them or the lease has ended (kv_transfer/handoff.py). Shutting the engine down earlier
fails every pull still to come: the decode recomputes the prompt (latency, not the request).
So the replica's teardown waits, before it shuts the engine down, until the engine holds no
block any more or the last lease it stamped can no longer be pulled, whichever is first.

The engine's own reading tells when the pulls are done: a producer with no request running
keeps blocks in use only for pulls, and vLLM's EngineCore keeps stepping while it holds them,
so its KV usage gauge stays current (measured on vLLM 0.32 + NIXL: 0.3 right after a 300-token
prefill, 0 at once when the decode had pulled, 0 again 30 s later when nobody pulled).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

POLL_S = 0.2


@dataclass(frozen=True)
class LeaseDrain:
    """How a teardown's wait ended: `released` (nothing held any more), `expired` (the last
    lease ended with blocks still held: no decode may pull them now) or `none` (no lease
    outstanding when the wait began)."""

    outcome: str
    waited_s: float


async def drain_leases(holds_kv: Callable[[], bool], last_deadline: float, *,
                       now: Callable[[], float] = time.time,
                       sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> LeaseDrain:
    """Wait while the engine `holds_kv` and the last lease (wall clock, as stamped by
    `lease_deadline()`) has not ended."""
    started = now()
    if started >= last_deadline:
        return LeaseDrain("none", 0.0)
    while holds_kv():
        if now() >= last_deadline:
            return LeaseDrain("expired", now() - started)
        await sleep(min(POLL_S, max(last_deadline - now(), 0.0)))
    return LeaseDrain("released", now() - started)
