"""Hops: the only code that calls the pools' Serve deployment handles on the P/D path.

What Serve's handle API needs stays here: each call a request of its own (serve_calls.remote),
streams through `.options(stream=True)`, the routed replica pinned through the KVRouter's
`dispatch`; and so does what a call's answer means: a deadline on a stream's first token, one
retry, a refusal as a 429 or a 400. Which hops a request takes is router/pd/path.py's choice.

The hops, and what each gives back:
- `prefill(request, pick, first_token)` → PrefillAnswer: the handoff, the answer's first token,
  the prompt's logprobs, or why decode must compute the prompt itself (`failed`). A failed hop
  never raises.
- `decode(request, handoff, pick, route=...)` → the decode stream of vLLM RequestOutputs. No
  first token within the deadline, or Serve's queue full → 429; a request the engine refuses →
  400; any other failure before the first token → retried once, wherever Serve sends it.
- `whole(request, pick)` → the whole request streamed by a prefill replica; failing, refused by
  a full queue or timing out before its first token it raises WholeFailed(reason).
- `abort(request_id)` → sent to the replica of each of its hops in flight.
- `health()` → Health: every pool ready, busy, silent or down.
- `stats(...)` and `warm_pair(...)`: the NIXL warm-up's calls (prewarm.py), outside the P/D
  path's accounting (no metrics, no cost model, no abort bookkeeping).

Every hop in flight is remembered (request id → pool → _Hop: the handle and the replica it was
routed to) until it ends, so an abort is pinned where the hop went; a hop cancelled or closed
(the client left) is aborted here, on that replica. `samples(request_id, ids)` lets the abort
of an n > 1 request reach its samples' hops.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, AsyncIterator, Iterator, Mapping, Optional, Sequence

from cluster.protocol import EngineRequest, InvalidEngineRequest
from cluster.types import ROLES, PoolId, Role, TierPools
from kv_transfer.handoff import Handoff, HandoffMismatch
from router.openai.errors import too_many_requests
from router.path_metrics import (DECODE_FIRST_TOKEN_SECONDS, DECODE_REFUSED, DECODE_RETRIES, HEALTH_PROBES,
                                 PREFILL_HOP_SECONDS)
from router.pd.answers import (DecodeStreams, Health, NoFirstToken, PoolState, PrefillAnswer, WholeFailed, answer_of,
                               first_token_within, is_backpressure, refused)
from router.pd.channels import Batch, ChannelLost, DecodeChannels
from router.pd.serve_calls import remote
from router.routing.directory import pool_directory
from router.routing.types import Pick, RouteLabel

if TYPE_CHECKING:
    from ray.serve.handle import DeploymentHandle
    from vllm.outputs import RequestOutput

    from router.routing.service import KVRouter

log = logging.getLogger(__name__)

HEALTH_TIMEOUT_S = 5.0
ABORT_TIMEOUT_S = 5.0  # an abort that does not answer in this is given up (the engine frees it on finish)

@dataclass(frozen=True)
class _Hop:
    """A hop of a request now in flight: the pool's handle and the replica it was routed to
    (None: Serve picked, so we do not know which)."""

    handle: DeploymentHandle
    pick: Optional[Pick]


class Hops:
    """The P/D path's calls over Ray Serve handles to the pools of each tier."""

    def __init__(self, pools: Mapping[str, TierPools], router: Optional[KVRouter] = None, *,
                 prefill_timeout_s: float, decode_first_token_timeout_s: Optional[float] = None,
                 decode_streams: DecodeStreams = "per_step"):
        self._pools = pools
        # per_step needs a router: a channel is opened to a replica known by worker id.
        self._per_step = decode_streams == "per_step" and router is not None
        self._router = router  # None: Serve's own replica choice
        self._prefill_timeout_s = prefill_timeout_s
        self._decode_first_token_timeout_s = decode_first_token_timeout_s
        self._in_flight: dict[str, dict[str, _Hop]] = {}  # request_id → pool → the hop in flight
        self._samples: dict[str, list[str]] = {}  # request_id → its samples' ids (n > 1)
        self._aborts: set[asyncio.Task] = set()  # fire-and-forget aborts, kept from the GC
        self.gateway_id = uuid.uuid4().hex  # names this gateway's outbox on each decode replica
        self._decode_channels: dict[str, DecodeChannels] = {}  # tier → channels to its decode replicas

    # -- the hops ---------------------------------------------------------------------------------

    async def prefill(self, request: EngineRequest, pick: Optional[Pick], first_token: bool) -> PrefillAnswer:
        """The prefill hop, pinned to `pick`; with `first_token` the prefill also samples the
        answer's first token (kv_transfer/first_token.py)."""
        with self._hop(request, "prefill", pick):
            started = time.perf_counter()
            try:
                result = await asyncio.wait_for(self._call_prefill(request, first_token), self._prefill_timeout_s)
                answer = answer_of(result)
            except asyncio.TimeoutError:
                self._abort_later(request.request_id, "prefill")
                return PrefillAnswer(failed="prefill_timeout")
            except HandoffMismatch as exc:
                log.warning("request %s: %s", request.request_id, exc)
                return PrefillAnswer(failed="bad_handoff")
            except Exception as exc:  # a dead or missing replica: any Ray error lands here
                log.warning("request %s: prefill failed (%s: %s); recomputing on decode",
                            request.request_id, type(exc).__name__, exc)
                return PrefillAnswer(failed="prefill_error")
            PREFILL_HOP_SECONDS.labels(tier=request.tier).observe(time.perf_counter() - started)
            return answer

    async def decode(self, request: EngineRequest, handoff: Optional[Handoff], pick: Optional[Pick], *,
                     route: RouteLabel) -> AsyncIterator[RequestOutput]:
        """The decode hop, pinned to `pick`; `handoff` None: decode computes the prompt. `route`
        labels its time to the first token, which after a remote prefill ("disaggregated") is
        the handoff's, observed for the decider."""
        tier = request.tier
        for attempt in (1, 2):
            # The retry goes wherever Serve sends it: the chosen replica may be the broken one.
            routed = pick if attempt == 1 else None
            started = False
            stream = None
            called = time.perf_counter()
            try:
                with self._hop(request, "decode", routed, streams=True):
                    stream = self._decode_stream(request, handoff)
                    async for chunk in first_token_within(stream, self._decode_first_token_timeout_s):
                        if not started:
                            started = True
                            seconds = time.perf_counter() - called
                            DECODE_FIRST_TOKEN_SECONDS.labels(tier=tier, path=route).observe(seconds)
                            self._first_token(request)
                            if route == "disaggregated" and routed is not None and self._router is not None:
                                self._router.observe_handoff(routed, seconds)
                        yield chunk
                return
            except (asyncio.CancelledError, GeneratorExit):
                if stream is not None:  # cancelled before the decode call was made: nothing to cancel
                    stream.cancel()
                raise
            except NoFirstToken:
                stream.cancel()
                DECODE_REFUSED.labels(tier=tier, reason="no_first_token").inc()
                raise too_many_requests(f"No decode replica produced a first token within "
                                        f"{self._decode_first_token_timeout_s:g} s; retry later.") from None
            except InvalidEngineRequest as exc:  # the same request would fail again: a 400
                raise refused(exc) from None
            except Exception as exc:
                if not started and is_backpressure(exc):
                    DECODE_REFUSED.labels(tier=tier, reason="queue_full").inc()
                    raise too_many_requests("The decode pool's queue is full; retry later.") from None
                if started or attempt == 2:
                    raise
                DECODE_RETRIES.labels(tier=tier).inc()
                log.warning("request %s: decode failed before the first token; retrying", request.request_id)

    async def whole(self, request: EngineRequest, pick: Optional[Pick]) -> AsyncIterator[RequestOutput]:
        """The whole request on the chosen prefill replica, its first token within the prefill
        timeout. Before that token a failure raises WholeFailed; after it, the failure is the
        request's, as on decode."""
        stream = None
        started = False
        with self._hop(request, "prefill", pick, streams=True):
            try:
                stream = self._whole_stream(request)
                async for chunk in first_token_within(stream, self._prefill_timeout_s):
                    if not started:
                        started = True
                        self._first_token(request)
                    yield chunk
                return
            except (asyncio.CancelledError, GeneratorExit):
                if stream is not None:
                    stream.cancel()
                raise
            except NoFirstToken:
                stream.cancel()
                self._abort_later(request.request_id, "prefill")
                reason: WholeFailure = "prefill_timeout"
            except InvalidEngineRequest as exc:
                raise refused(exc) from None
            except Exception as exc:
                if started:
                    raise
                reason = "prefill_queue_full" if is_backpressure(exc) else "prefill_error"
                log.warning("request %s: whole on prefill failed (%s: %s); recomputing on decode",
                            request.request_id, type(exc).__name__, exc)
        raise WholeFailed(reason)

    # -- aborts -----------------------------------------------------------------------------------

    @contextlib.contextmanager
    def samples(self, request_id: str, sample_ids: Sequence[str]) -> Iterator[None]:
        """While inside, an abort of `request_id` goes to the hops of its samples (n > 1), or of
        its continuation (a migrated answer: router/pd/migration.py), and on to theirs."""
        self._samples[request_id] = list(sample_ids)
        try:
            yield
        finally:
            self._samples.pop(request_id, None)

    async def abort(self, request_id: str) -> None:
        """Abort the request on the replicas of its hops in flight. A finished prefill hop holds
        nothing to abort (its KV waits for decode's pull, or decode's abort frees it); an
        unknown id has nothing in flight."""
        ids, todo = [], [request_id]
        while todo:  # a sample's continuation is registered under the sample (migration.py)
            rid = todo.pop()
            ids += [rid] if rid not in self._samples else []
            todo += [s for s in self._samples.get(rid, ()) if s != rid]
        hops = []
        for rid in ids:  # taken out, so the cancel that follows sends no second abort
            in_flight = self._in_flight.get(rid, {})
            hops += [(in_flight.pop(pool), rid) for pool in list(in_flight)]
        await asyncio.gather(*(self._abort_hop(hop, rid) for hop, rid in hops), return_exceptions=True)

    async def _abort_hop(self, hop: _Hop, request_id: str) -> None:
        # Pinned like the hop itself: with several replicas in a pool, Serve's own pick would
        # often land on a replica that does not hold the request (abort of an unknown id: no-op).
        # Timed: an abort goes to a replica that may be the stuck one; nobody waits on it for long.
        with self._pinned(hop.pick, request_id):
            try:
                await asyncio.wait_for(remote(hop.handle.abort, request_id), ABORT_TIMEOUT_S)
            except asyncio.TimeoutError:
                log.warning("request %s: abort got no answer within %.0f s", request_id, ABORT_TIMEOUT_S)

    def _abort_later(self, request_id: str, pool: str) -> None:
        hop = self._in_flight.get(request_id, {}).get(pool)
        if hop is not None:
            self._abort_soon(hop, request_id)

    def _abort_soon(self, hop: _Hop, request_id: str) -> None:
        """Fire and forget: a cancelled task must not wait for the abort's answer."""
        task = asyncio.ensure_future(self._abort_hop(hop, request_id))
        self._aborts.add(task)
        task.add_done_callback(self._aborts.discard)

    # -- probes -----------------------------------------------------------------------------------

    async def health(self) -> Health:
        """Ready only when every pool of every tier can take requests: "ready" (its stats call
        answered) or "busy" (no answer in time, but Serve lists running replicas: the call waits
        behind full request slots, and Serve's controller health-checks each replica itself)."""
        HEALTH_PROBES.inc()
        pools = [PoolId(tier, role) for tier in self._pools for role in ROLES]
        states = await asyncio.gather(*(self._probe(pool) for pool in pools))
        return Health(ready=all(state in ("ready", "busy") for state in states),
                      pools={pool.deployment_name: state for pool, state in zip(pools, states)})

    async def _probe(self, pool: PoolId) -> PoolState:
        try:
            await asyncio.wait_for(self._call_stats(pool.tier, pool.role), timeout=HEALTH_TIMEOUT_S)
            return "ready"
        except Exception as exc:
            if isinstance(exc, asyncio.TimeoutError) or is_backpressure(exc):
                busy = self._router is not None and bool(self._router.workers(pool.tier, pool.role))
                return "busy" if busy else "no answer"
            log.warning("health: %s did not answer: %r", pool.deployment_name, exc)
            return "down"

    async def stats(self, tier: str, role: Role, timeout_s: float) -> Any:
        """A pool's stats, from whichever replica Serve picks (a cheap call: the handle's first
        call makes Serve build its request router, which lists the replicas)."""
        return await asyncio.wait_for(self._call_stats(tier, role), timeout_s)

    async def warm_pair(self, request: EngineRequest, prefill: Pick, decode: Pick, timeout_s: float) -> None:
        """`request` through exactly this pair of replicas, prefill then decode with its handoff,
        each within `timeout_s`; raises what fails."""
        with self._pinned(prefill, request.request_id):
            result = await asyncio.wait_for(self._call_prefill(request, False), timeout_s)

        async def drain() -> None:
            with self._pinned(decode, request.request_id):
                async for _ in self._decode_stream(request, result.handoff):
                    pass

        await asyncio.wait_for(drain(), timeout_s)

    # -- the calls themselves ---------------------------------------------------------------------

    def _call_prefill(self, request: EngineRequest, first_token: bool) -> Any:
        return remote(self._pools[request.tier].prefill.prefill, request, first_token)

    def _decode_stream(self, request: EngineRequest, handoff: Optional[Handoff]) -> Any:
        """The decode hop's transport (iterate it, or `cancel()` it): the request's own `run`
        call, its outputs through this gateway's channel to the replica it landed on, one Ray
        item per engine step for all requests there (channels.py). `per_request` (or without
        a router, which knows the replicas by id): a Serve stream of its own, an item per output."""
        decode = self._pools[request.tier].decode.options(stream=True)
        if not self._per_step:
            return remote(decode.generate, request, handoff)
        return self._channels(request.tier).stream(
            lambda stream_id: remote(decode.run, request, handoff, self.gateway_id, stream_id))

    def _channels(self, tier: str) -> DecodeChannels:
        channels = self._decode_channels.get(tier)
        if channels is None:
            channels = self._decode_channels[tier] = DecodeChannels(functools.partial(self._subscription, tier))
        return channels

    async def _subscription(self, tier: str, worker_id: str) -> AsyncIterator[Batch]:
        """This gateway's subscription to one decode replica, pinned to it by worker id until
        its first batch (the replica refuses one that Serve sent elsewhere)."""
        worker = next((w for w in self._router.workers(tier, "decode") if w.worker_id == worker_id), None)
        if worker is None:
            raise ChannelLost(f"decode replica {worker_id} is not (or no longer) in the pool's directory")
        directory = pool_directory(PoolId(tier, "decode"))
        subscription_id = f"subscribe-{uuid.uuid4().hex}"
        directory.pin(subscription_id, worker.replica_id)
        stream = remote(self._pools[tier].decode.options(stream=True).subscribe, subscription_id,
                        self.gateway_id, worker_id)
        try:
            async for batch in stream:
                directory.unpin(subscription_id)
                yield batch
        finally:
            directory.unpin(subscription_id)
            stream.cancel()

    async def close(self) -> None:
        """Stop this gateway's decode channels (teardown)."""
        await asyncio.gather(*(channels.close() for channels in self._decode_channels.values()))

    def _whole_stream(self, request: EngineRequest) -> Any:
        return remote(self._pools[request.tier].prefill.options(stream=True).generate, request)

    def _call_stats(self, tier: str, role: str) -> Any:
        return remote(self._pools[tier].of(role).stats)

    @contextlib.contextmanager
    def _hop(self, request: EngineRequest, pool: Role, pick: Optional[Pick], streams: bool = False) -> Iterator[None]:
        """Around one hop: pin it to the routed replica, and remember where it went until it ends.

        A hop cancelled (the client left during an await) or closed (it left while the stream
        waited at a yield) is aborted here, on the replica it went to: by the time the cancel
        reaches the engine client's own abort, this hop is no longer in flight."""
        hop = _Hop(self._pools[request.tier].of(pool), pick)
        hops = self._in_flight.setdefault(request.request_id, {})
        hops[pool] = hop
        try:
            with self._pinned(pick, request.request_id, streams,
                              None if request.adapter is None else request.adapter.name):
                yield
        except (asyncio.CancelledError, GeneratorExit):
            if hops.get(pool) is hop:  # else `abort` has sent it already
                self._abort_soon(hop, request.request_id)
            raise
        finally:
            if hops.get(pool) is hop:
                del hops[pool]
            if not hops:
                self._in_flight.pop(request.request_id, None)

    def release(self, request_id: str) -> None:
        """The request's attempt is over: its decode pick stops counting if its hop never started."""
        if self._router is not None:
            self._router.release(request_id)

    def _pinned(self, pick: Optional[Pick], request_id: str, streams: bool = False, adapter: Optional[str] = None):
        if pick is None or self._router is None:
            return contextlib.nullcontext()
        return self._router.dispatch(pick, request_id, streams, adapter=adapter)

    def _first_token(self, request: EngineRequest) -> None:
        if self._router is not None:  # the prompt is no longer queued where it streams
            self._router.first_token(request.request_id)
