"""The KV transfer: a fixed cost, then the bytes at a fair share of the sending NIC.

A pull of b bytes from a prefill engine takes `fixed_s` (the handshake, descriptor exchange,
the decode engine's notification) and then its bytes at `bandwidth / k` while k transfers
share that engine's NIC (processor sharing, recomputed whenever one starts or ends). The
bandwidth is never one number in a plan: `tandem plan` sweeps a range (measured here: raw NIXL
over loopback TCP 1.3-2.6 GiB/s, DESIGN.md; NVLink / RDMA are other decades).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class LinkSpec:
    bandwidth_Bps: float
    fixed_s: float


class Nic:
    """One sender's NIC: its active transfers share its bandwidth equally."""

    def __init__(self, spec: LinkSpec):
        self.spec = spec
        self._left: dict[int, float] = {}  # transfer id → bytes left
        self._done: dict[int, asyncio.Future] = {}
        self._last = 0.0
        self._timer: Optional[asyncio.TimerHandle] = None
        self._ids = 0
        self.bytes_sent = 0.0

    async def send(self, nbytes: float) -> None:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(self.spec.fixed_s)
        if nbytes <= 0:
            return
        self._progress(loop.time())
        self._ids += 1
        fut = loop.create_future()
        self._left[self._ids], self._done[self._ids] = float(nbytes), fut
        self.bytes_sent += nbytes
        self._rearm(loop)
        await fut

    def _progress(self, now: float) -> None:
        if self._left:
            share = self.spec.bandwidth_Bps / len(self._left) * (now - self._last)
            for k in self._left:
                self._left[k] -= share
        self._last = now

    def _rearm(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._left:
            soonest = min(self._left.values())
            delay = max(soonest, 0.0) * len(self._left) / self.spec.bandwidth_Bps
            self._timer = loop.call_later(delay, self._finish, loop)

    def _finish(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        self._progress(loop.time())
        tolerance = 1e-6 * self.spec.bandwidth_Bps * 1e-6  # a micro-byte: float rounding only
        for k in [k for k, left in self._left.items() if left <= max(tolerance, 1e-9)]:
            del self._left[k]
            self._done.pop(k).set_result(None)
        self._rearm(loop)
