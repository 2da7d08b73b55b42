"""DisaggregatedBackend: one request's path through the pools, behind the OpenAI edge.

prefill pool (max_tokens=1, returns a Handoff and the answer's first token) → the first token
to the client → decode pool (pulls the KV over NIXL, continues after the first token, streams).
Where the prefill's token cannot serve as the first (kv_transfer/first_token.py names why),
decode samples it itself, as without reuse.

Which prefill and decode replica, and whether to prefill remotely at all, is the KVRouter's
decision (router/routing/service.py); it never fails a request: when it cannot decide, Serve
picks the replica as before. A short answer may run whole on the prefill replica it chose
(path prefill_only): no decode hop, no KV transfer.

Failure policy, in order of what can go wrong:
- the prefill hop raises, times out, or returns no handoff → decode computes the prompt
  itself ("fallback_recompute", counted by reason). Latency, not a lost request. The same
  for a whole request on prefill that fails or times out before its first token.
- the KV pull fails inside decode → vLLM's kv_load_failure_policy=recompute handles it.
- the decode hop fails before the first token → retried once on the decode pool.
- the decode hop yields no first token within decode_first_token_timeout_s, or Serve's queue
  for the decode pool is full → 429 (the request gives its admission place back at once).

Sampling n > 1: one prefill, n decode requests on one decode replica (router/samples.py).

Streams are vLLM RequestOutputs (DELTA), index set per sample, as vLLM's AsyncLLM yields them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
import time
from typing import TYPE_CHECKING, Any, AsyncIterator, Mapping, Optional

from cluster.protocol import EngineRequest, InvalidEngineRequest, finish_reason
from cluster.types import ROLES, PoolId, TierPools
from kv_transfer.first_token import FirstTokenOffset, continuation, reuse_blocker
from kv_transfer.handoff import Handoff, HandoffMismatch
from router.openai.errors import bad_request, too_many_requests
from router.path_metrics import (DECODE_FIRST_TOKEN_SECONDS, DECODE_REFUSED, DECODE_RETRIES, FIRST_TOKEN,
                                 HEALTH_PROBES, PREFILL_HOP_SECONDS, ROUTES)
from router.routing.service import KVRouter
from router.routing.types import Pick, RouteDecision
from router.samples import generate_n, without_prompt_logprobs
from router.serve_calls import remote

if TYPE_CHECKING:
    from ray.serve.handle import DeploymentHandle
    from vllm.outputs import RequestOutput

log = logging.getLogger(__name__)

HEALTH_TIMEOUT_S = 5.0
ABORT_TIMEOUT_S = 5.0  # an abort that does not answer in this is given up (the engine frees it on finish)


class _NoFirstToken(Exception):
    """The decode hop yielded no first token within its deadline."""


class _WholeFailed(Exception):
    """The whole request on prefill failed before its first token: decode computes it."""


async def _first_token_within(stream: Any, timeout_s: float) -> AsyncIterator[RequestOutput]:
    """The stream, with a deadline on its first chunk only (later gaps are the engine's pace)."""
    it = stream.__aiter__()
    try:
        first = await asyncio.wait_for(it.__anext__(), timeout_s)
    except StopAsyncIteration:
        return
    except asyncio.TimeoutError:
        raise _NoFirstToken() from None
    yield first
    async for chunk in it:
        yield chunk


def _is_backpressure(exc: BaseException) -> bool:
    """Serve refused the call: the deployment's max_queued_requests is reached."""
    from ray.serve.exceptions import BackPressureError

    return isinstance(exc, BackPressureError) or isinstance(getattr(exc, "cause", None), BackPressureError)


def _refused(exc: InvalidEngineRequest) -> Exception:
    """The engine refused the request: the same request would fail again, a 400."""
    cause = getattr(exc, "cause", exc)  # Ray wraps it; the cause holds the plain message
    return bad_request(f"The engine refused the request: {cause}")


@dataclass(frozen=True)
class _Hop:
    """A hop of a request now in flight: the pool's handle and the replica it was routed to
    (None: Serve picked, so we do not know which)."""

    handle: DeploymentHandle
    pick: Optional[Pick]


class DisaggregatedBackend:
    """The P/D path over Ray Serve handles to the pools (the engine client's backend,
    router/openai/engine_client.py)."""

    def __init__(self, *, pools: Mapping[str, TierPools],
                 prefill_timeout_s: float, router: Optional[KVRouter] = None,
                 first_token_reuse: bool = True, decode_first_token_timeout_s: float = 120.0):
        self._pools = pools
        self._prefill_timeout_s = prefill_timeout_s
        self._decode_first_token_timeout_s = decode_first_token_timeout_s
        self._router = router  # None: Serve's own replica choice
        self._first_token_reuse = first_token_reuse
        # request_id → pool → the hop in flight; `abort` sends each abort where its hop went.
        self._hops: dict[str, dict[str, _Hop]] = {}
        self._aborts: set[asyncio.Task] = set()  # fire-and-forget aborts, kept from the GC
        self._samples: dict[str, list[str]] = {}  # request_id → its samples' ids (n > 1)

    def _tier(self, request: EngineRequest) -> TierPools:
        return self._pools[request.tier]

    async def _prefill_hop(self, request: EngineRequest, prefill: DeploymentHandle,
                           first_token: bool) -> tuple[Optional[Handoff], Optional[RequestOutput], Optional[list]]:
        """Run the prefill hop: the handoff (None: decode computes the prompt itself), with
        `first_token` the answer's first token as a RequestOutput (None: decode samples it),
        and the prompt's logprobs when asked for (None: decode computes them if asked)."""
        reason = None
        tier = request.tier
        started = time.perf_counter()
        first = None
        handoff = None
        prompt_logprobs = None
        try:
            result = await asyncio.wait_for(remote(prefill.prefill, request, first_token),
                                            timeout=self._prefill_timeout_s)
            first = result.first
            ended = None if first is None else finish_reason(first)
            if ended in ("error", "abort"):
                raise RuntimeError(f"the prefill engine ended the request with {ended!r}")
            prompt_logprobs = result.prompt_logprobs
            if ended is None:  # else: the answer ended on token 1
                handoff = result.handoff  # the prefill replica's, stamped; decode checks it
                if handoff is None:
                    raise HandoffMismatch("the prefill replica returned no handoff")
        except asyncio.TimeoutError:
            reason = "prefill_timeout"
            self._abort_later(request.request_id, "prefill")
        except HandoffMismatch as exc:
            reason = "bad_handoff"
            log.warning("request %s: %s", request.request_id, exc)
        except Exception as exc:  # a dead or missing replica: any Ray error lands here
            reason = "prefill_error"
            log.warning("request %s: prefill failed (%s: %s); recomputing on decode",
                        request.request_id, type(exc).__name__, exc)
        if reason is not None:
            ROUTES.labels(tier=tier, path="fallback_recompute", reason=reason).inc()
            return None, None, None
        PREFILL_HOP_SECONDS.labels(tier=tier).observe(time.perf_counter() - started)
        ROUTES.labels(tier=tier, path="disaggregated", reason="").inc()
        return handoff, first, prompt_logprobs

    def _reuse_first_token(self, request: EngineRequest, decision: Optional[RouteDecision]) -> bool:
        """Whether the prefill's token can be the answer's first (kv_transfer/first_token.py) and
        the P/D decider finds it pays (rule 9: "handoff_gap" when not); counted either way."""
        blocker = reuse_blocker(request.sampling) if self._first_token_reuse else "off"
        if blocker is None and decision is not None and not decision.reuse_first_token:
            blocker = "handoff_gap"
        FIRST_TOKEN.labels(tier=request.tier, path="prefill" if blocker is None else "decode",
                           reason=blocker or "").inc()
        return blocker is None

    async def _route(self, request: EngineRequest) -> Optional[RouteDecision]:
        if self._router is None:
            return None
        try:
            return await self._router.route(request, request.tier)
        except Exception:  # routing must never fail a request
            log.exception("request %s: routing failed; Serve picks the replicas", request.request_id)
            ROUTES.labels(tier=request.tier, path="router_error", reason="").inc()
            return None

    @contextlib.contextmanager
    def _dispatch(self, decision: Optional[RouteDecision], pool: str, request: EngineRequest, streams: bool = False):
        """Around one hop: pin it to the routed replica, and remember where it went until it ends.

        A hop cancelled (the client left during an await) or closed (it left while the stream
        waited at a yield) is aborted here, on the replica it went to: by the time the cancel
        reaches the engine client's own abort, this hop is no longer in flight."""
        pick = None if decision is None else (decision.prefill if pool == "prefill" else decision.decode)
        hop = _Hop(self._tier(request).of(pool), pick)
        hops = self._hops.setdefault(request.request_id, {})
        hops[pool] = hop
        try:
            with self._pinned(pick, request.request_id, streams):
                yield
        except (asyncio.CancelledError, GeneratorExit):
            if hops.get(pool) is hop:  # else `abort` has sent it already
                self._abort_soon(hop, request.request_id)
            raise
        finally:
            if hops.get(pool) is hop:
                del hops[pool]
            if not hops:
                self._hops.pop(request.request_id, None)

    def _pinned(self, pick: Optional[Pick], request_id: str, streams: bool = False):
        if pick is None or self._router is None:
            return contextlib.nullcontext()
        return self._router.dispatch(pick, request_id, streams)

    def _first_token(self, request: EngineRequest) -> None:
        if self._router is not None:  # the prompt is no longer queued where it streams
            self._router.first_token(request.request_id)

    async def generate(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        if request.sampling.n > 1:
            try:
                async for output in generate_n(self, request):
                    yield output
            finally:  # also when it ends before its samples' decode began (cancelled during the prefill)
                self._samples.pop(request.request_id, None)
            return
        pools = self._tier(request)
        tier = request.tier
        decision = await self._route(request)
        if decision is not None and decision.whole_on_prefill:
            # aclosing: a client that leaves closes the hop now (its abort, its in-flight count),
            # not when the garbage collector finds the suspended generator.
            try:
                async with contextlib.aclosing(self._whole(request, decision, pools.prefill)) as whole:
                    async for output in whole:
                        yield output
                return
            except _WholeFailed:  # before its first token: decode computes it
                handoff, path, first, prompt_logprobs = None, "fallback_recompute", None, None
        elif decision is not None and decision.skip_prefill:
            handoff, path, first, prompt_logprobs = None, "decode_only", None, None  # decode computes it
            ROUTES.labels(tier=tier, path=path, reason="").inc()
        else:
            reuse = self._reuse_first_token(request, decision)
            with self._dispatch(decision, "prefill", request):
                handoff, first, prompt_logprobs = await self._prefill_hop(request, pools.prefill, reuse)
            path = "disaggregated" if handoff is not None or first is not None else "fallback_recompute"
        offset = None
        if first is not None:
            # The prefill's token goes out now; decode continues after it.
            first.prompt_logprobs, prompt_logprobs = prompt_logprobs, None
            yield first
            if first.finished:
                return
            offset = FirstTokenOffset(first.outputs[0].cumulative_logprob)
            request = continuation(request, first)
        elif prompt_logprobs is not None:
            request = without_prompt_logprobs(request)
        async with contextlib.aclosing(self._decode(request, handoff, decision, path, pools.decode)) as decoded:
            async for output in decoded:
                if prompt_logprobs is not None:
                    output.prompt_logprobs, prompt_logprobs = prompt_logprobs, None
                yield output if offset is None else offset.apply(output)

    async def _decode(self, request: EngineRequest, handoff: Optional[Handoff], decision: Optional[RouteDecision],
                      path: str, pool: DeploymentHandle) -> AsyncIterator[RequestOutput]:
        """The decode hop; retried once (wherever Serve sends it) if it fails before its first token."""
        tier = request.tier
        for attempt in (1, 2):
            # The retry goes wherever Serve sends it: the chosen replica may be the broken one.
            routed = decision if attempt == 1 else None
            started = False
            stream = None
            decode_called = time.perf_counter()
            try:
                with self._dispatch(routed, "decode", request, streams=True):
                    stream = remote(pool.options(stream=True).generate, request, handoff)
                    async for chunk in _first_token_within(stream, self._decode_first_token_timeout_s):
                        if not started:
                            started = True
                            seconds = time.perf_counter() - decode_called
                            DECODE_FIRST_TOKEN_SECONDS.labels(tier=tier, path=path).observe(seconds)
                            self._first_token(request)
                            if path == "disaggregated" and routed is not None and routed.decode is not None:
                                self._router.observe_handoff(routed.decode, seconds)
                        yield chunk
                return
            except (asyncio.CancelledError, GeneratorExit):
                if stream is not None:  # cancelled before the decode call was made: nothing to cancel
                    stream.cancel()
                raise
            except _NoFirstToken:
                stream.cancel()
                DECODE_REFUSED.labels(tier=tier, reason="no_first_token").inc()
                raise too_many_requests(f"No decode replica produced a first token within "
                                        f"{self._decode_first_token_timeout_s:g} s; retry later.") from None
            except InvalidEngineRequest as exc:  # the same request would fail again: a 400
                raise _refused(exc) from None
            except Exception as exc:
                if not started and _is_backpressure(exc):
                    DECODE_REFUSED.labels(tier=tier, reason="queue_full").inc()
                    raise too_many_requests("The decode pool's queue is full; retry later.") from None
                if started or attempt == 2:
                    raise
                DECODE_RETRIES.labels(tier=tier).inc()
                log.warning("request %s: decode failed before the first token; retrying", request.request_id)

    async def _whole(self, request: EngineRequest, decision: RouteDecision,
                     pool: DeploymentHandle) -> AsyncIterator[RequestOutput]:
        """The whole request on the chosen prefill replica. Before its first token a failure,
        a full queue or the prefill timeout raise _WholeFailed (counted, the caller recomputes
        on decode); after it, the failure is the request's, as on decode."""
        tier = request.tier
        stream = None
        started = False
        with self._dispatch(decision, "prefill", request, streams=True):
            try:
                stream = remote(pool.options(stream=True).generate, request)
                async for chunk in _first_token_within(stream, self._prefill_timeout_s):
                    if not started:
                        started = True
                        self._first_token(request)
                        ROUTES.labels(tier=tier, path="prefill_only", reason="").inc()
                    yield chunk
                return
            except (asyncio.CancelledError, GeneratorExit):
                if stream is not None:
                    stream.cancel()
                raise
            except _NoFirstToken:
                stream.cancel()
                self._abort_later(request.request_id, "prefill")
                reason = "prefill_timeout"
            except InvalidEngineRequest as exc:
                raise _refused(exc) from None
            except Exception as exc:
                if started:
                    raise
                reason = "prefill_queue_full" if _is_backpressure(exc) else "prefill_error"
                log.warning("request %s: whole on prefill failed (%s: %s); recomputing on decode",
                            request.request_id, type(exc).__name__, exc)
        ROUTES.labels(tier=tier, path="fallback_recompute", reason=reason).inc()
        raise _WholeFailed()

    async def abort(self, request_id: str) -> None:
        """Abort the request on the replicas of its hops in flight. A finished prefill hop holds
        nothing to abort (its KV waits for decode's pull, or decode's abort frees it); an
        unknown id has nothing in flight."""
        ids = self._samples.get(request_id, [request_id])
        hops = []
        for rid in ids:  # taken out, so the cancel that follows sends no second abort
            in_flight = self._hops.get(rid, {})
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
        hop = self._hops.get(request_id, {}).get(pool)
        if hop is not None:
            self._abort_soon(hop, request_id)

    def _abort_soon(self, hop: _Hop, request_id: str) -> None:
        """Fire and forget: a cancelled task must not wait for the abort's answer."""
        task = asyncio.ensure_future(self._abort_hop(hop, request_id))
        self._aborts.add(task)
        task.add_done_callback(self._aborts.discard)

    async def health(self) -> dict[str, Any]:
        """Ready only when every pool of every tier can take requests: "ready" (its stats call
        answered) or "busy" (no answer in time, but Serve lists running replicas: the call waits
        behind full request slots, and Serve's controller health-checks each replica itself)."""
        HEALTH_PROBES.inc()

        async def probe(tier: str, pool: str) -> str:
            try:
                await asyncio.wait_for(remote(self._pools[tier].of(pool).stats), timeout=HEALTH_TIMEOUT_S)
                return "ready"
            except Exception as exc:
                if isinstance(exc, asyncio.TimeoutError) or _is_backpressure(exc):
                    busy = self._router is not None and bool(self._router.workers(tier, pool))
                    return "busy" if busy else "no answer"
                log.warning("health: %s did not answer: %r", PoolId(tier, pool).deployment_name, exc)
                return "down"

        names = [PoolId(tier, role) for tier in self._pools for role in ROLES]
        results = await asyncio.gather(*(probe(p.tier, p.role) for p in names))
        pools = {p.deployment_name: state for p, state in zip(names, results)}
        return {"ready": all(state in ("ready", "busy") for state in results), "pools": pools}
