"""Warm the NIXL handshake of every prefill/decode pair before user traffic needs it.

A decode engine's first pull from a prefill engine it has not met does a NIXL handshake
(a ZMQ round trip to the prefill's side channel, remote memory registration): measured
~187 ms on the first P/D request of a fresh pair. `HandshakeWarmer` runs in the gateway and,
whenever the routing directory shows a pair of one tier that it has not warmed (cluster
start, a restarted or autoscaled replica), sends one tiny request through exactly that pair:
a prefill pinned to the prefill replica, then a decode with its handoff pinned to the decode
replica. Ray Serve LLM does the same from its decode server (`_prewarm_prefill_decode`); here
the gateway already knows every live replica of both pools and can pin to each. The calls
themselves are hops.py's (`stats`, `warm_pair`).

A failed warm-up costs nothing but the handshake on the first real request: it is logged
and retried on the next pass. Lifecycle: `start()` once on the gateway's loop, `stop()` on
teardown (idempotent).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from typing import Callable, Mapping, Optional

from cluster.protocol import EngineRequest
from cluster.types import ROLES, TierPools
from router.pd.hops import Hops
from router.routing.service import KVRouter
from router.routing.types import Pick, Worker

log = logging.getLogger(__name__)

PASS_INTERVAL_S = 2.0
HOP_TIMEOUT_S = 30.0
# A few prompt tokens: a partial block moves like a full one, and a handshake is per pair.
WARM_PROMPT = (1, 2, 3, 4, 5, 6, 7, 8)


def _warm_sampling():
    from vllm import SamplingParams

    return SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)


class HandshakeWarmer:
    def __init__(self, *, pools: Mapping[str, TierPools], router: KVRouter,
                 interval_s: float = PASS_INTERVAL_S, on_warmed: Callable[[str, str], None] = lambda p, d: None):
        self._tiers = list(pools)
        self._router = router  # a KVRouter: its directories list the replicas and pin requests
        # Hops of its own: a warm-up is no client's request and shares no abort bookkeeping
        # with theirs; `stats` and `warm_pair` take their deadline per call (HOP_TIMEOUT_S).
        # One request per pair: its own Serve stream, no channel to the replica for it.
        self._hops = Hops(pools, router, prefill_timeout_s=HOP_TIMEOUT_S, decode_streams="per_request")
        self._interval_s = interval_s
        self._on_warmed = on_warmed
        self.warmed: set[tuple[str, str]] = set()  # (prefill worker id, decode worker id)
        self._task: Optional[asyncio.Task] = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(Exception):  # never let one pass end the warmer
                await self.warm_new_pairs()
            await asyncio.sleep(self._interval_s)

    async def _discover(self) -> None:
        """Serve builds a handle's request router, which lists the replicas in the directory,
        on the handle's first call: make one (cheap) where a pool shows no replica yet."""
        for tier in self._tiers:
            for role in ROLES:
                if not self._router.workers(tier, role):
                    with contextlib.suppress(Exception):
                        await self._hops.stats(tier, role, HOP_TIMEOUT_S)

    def pending(self) -> list[tuple[str, Worker, Worker]]:
        """(tier, prefill, decode) pairs of live replicas not yet warmed."""
        pairs = []
        for tier in self._tiers:
            for prefill in self._router.workers(tier, "prefill"):
                for decode in self._router.workers(tier, "decode"):
                    if (prefill.worker_id, decode.worker_id) not in self.warmed:
                        pairs.append((tier, prefill, decode))
        return pairs

    async def warm_new_pairs(self) -> int:
        await self._discover()
        warmed = 0
        for tier, prefill, decode in self.pending():
            try:
                await self._warm(tier, prefill, decode)
            except Exception as exc:
                log.info("NIXL warm-up %s → %s failed (%s: %s); retried on the next pass",
                         prefill.worker_id, decode.worker_id, type(exc).__name__, exc)
                continue
            self.warmed.add((prefill.worker_id, decode.worker_id))
            self._on_warmed(prefill.worker_id, decode.worker_id)
            warmed += 1
        return warmed

    async def _warm(self, tier: str, prefill: Worker, decode: Worker) -> None:
        request = EngineRequest(f"warmup-{uuid.uuid4().hex}", WARM_PROMPT,
                                _warm_sampling(), tier=tier)
        await self._hops.warm_pair(request, Pick(prefill, 1.0, {}), Pick(decode, 1.0, {}), HOP_TIMEOUT_S)
