"""DisaggregatedBackend: one request's path through the pools, behind the OpenAI edge; the
policy only (how each hop is sent, timed, retried and aborted: hops.py).

The KVRouter decides the path (router/routing/service.py, types.py Path):
- remote: prefill pool (max_tokens=1, returns a Handoff and the answer's first token) → the
  first token to the client → decode pool (pulls the KV over NIXL, continues after the first
  token, streams). Where the prefill's token cannot serve as the first
  (kv_transfer/first_token.py names why), decode samples it itself, as without reuse.
- local: the decode replica computes the prompt and streams (no prefill hop, no KV transfer).
- whole: a short answer runs whole on the prefill replica chosen (no decode hop, no transfer).
The router never fails a request: when it cannot decide, Serve picks the replicas (path remote).

Failure policy, in order of what can go wrong:
- the prefill hop raises, times out, or returns no handoff → decode computes the prompt
  itself ("fallback_recompute", counted by reason). Latency, not a lost request. The same
  for a whole request on prefill that fails or times out before its first token.
- the KV pull fails inside decode → vLLM's kv_load_failure_policy=recompute handles it.
- the decode hop fails before the first token → retried once on the decode pool (hops.py).
- a stream fails (or ends unfinished) after tokens reached the client → continued on another
  replica as a new request of prompt + the tokens sent, through this same path, up to
  kv_transfer.migration_limit times; what may not migrate fails as before (migration.py). With
  no other decode replica known, the router sends the continuation whole to a prefill replica.
- the decode hop yields no first token within decode_first_token_timeout_s, or Serve's queue
  for the decode pool is full → 429 (the request gives its admission place back at once).

Sampling n > 1: one prefill, n decode requests on one decode replica (samples.py).

Streams are vLLM RequestOutputs (DELTA), index set per sample, as vLLM's AsyncLLM yields them.
Metrics: `tandem_route{path}` counts the path each request took in the end (path_metrics.py).
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any, AsyncIterator, Collection, Mapping, Optional

from cluster.protocol import EngineRequest, new_token_ids
from cluster.types import TierPools
from kv_transfer.first_token import FirstTokenOffset, continuation, reuse_blocker
from router.path_metrics import FIRST_TOKEN, count_prefilled, count_route
from router.pd.answer_text import text_after_cut, without_stop_strings
from router.pd.answers import DecodeStreams, WholeFailed
from router.pd.hops import Hops
from router.pd.migration import Migration
from router.pd.samples import generate_n, without_prompt_logprobs
from router.routing.service import KVRouter
from router.routing.types import Path, Pick, RouteDecision, RouteLabel
from router.tracing import annotate_migration

if TYPE_CHECKING:
    from vllm.outputs import RequestOutput

log = logging.getLogger(__name__)


class DisaggregatedBackend:
    """The P/D path over the pools of each tier (the engine client's backend,
    router/openai/engine_client.py)."""

    def __init__(self, *, pools: Mapping[str, TierPools],
                 prefill_timeout_s: float, router: Optional[KVRouter] = None,
                 first_token_reuse: bool = True, decode_first_token_timeout_s: Optional[float] = None,
                 decode_streams: DecodeStreams = "per_step", migration_limit: int = 2,
                 tokenizer: Any = None):
        # The served model's tokenizer: the text after a cut that split a character
        # (answer_text.py). None: engines' text as is (FakeEngine tests).
        self._tokenizer = tokenizer
        self._router = router  # None: Serve's own replica choice
        self._migration_limit = migration_limit  # continuations per request (migration.py); 0: off
        self._first_token_reuse = first_token_reuse
        self.hops = Hops(pools, router, prefill_timeout_s=prefill_timeout_s,
                         decode_first_token_timeout_s=decode_first_token_timeout_s, decode_streams=decode_streams)

    async def generate(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        # aclosing: a client that leaves closes the hops now (their aborts, their in-flight
        # counts), not when the garbage collector finds the suspended generator.
        if request.sampling.n > 1:  # each sample migrates as its own request
            answer = generate_n(self.hops, self._route, request, self._continued)
        else:
            answer = self._continued(request)
        async with contextlib.aclosing(answer) as outputs:
            async for output in outputs:
                yield output

    async def _continued(self, request: EngineRequest, first: Optional[AsyncIterator[RequestOutput]] = None,
                         first_on: Optional[Pick] = None) -> AsyncIterator[RequestOutput]:
        """`request`'s answer; a stream that breaks after tokens reached the client is continued
        through the normal path, without the replica that failed (migration.py). `first`: the
        first attempt's stream, where the caller started it (a sample of n > 1, on `first_on`)."""
        migration = Migration(request, self._migration_limit, self._tokenizer)
        if first is not None:
            migration.ran_on(_replica(first_on))
        attempt = first if first is not None else self._once(request, migration)
        while True:
            failure: Optional[Exception] = None
            try:
                with self._aborts_reach(migration):
                    async with contextlib.aclosing(attempt) as outputs:
                        async for output in outputs:
                            yield migration.sent(output)
                            if migration.stopped_here:  # closing the attempt aborts its engine request
                                break
            except Exception as exc:  # not the client leaving (GeneratorExit, CancelledError)
                failure = exc
            if failure is None and migration.finished:
                return
            following = migration.failed(failure)
            if migration.outcome is not None:
                annotate_migration(*migration.outcome, tokens_sent=len(migration.tokens), attempt=migration.attempts)
            if following is None:
                if failure is not None:
                    raise failure
                return  # ended unfinished, not continued: as before migration
            log.warning("request %s: its stream broke after %d tokens (%s); continuing as %s",
                        request.request_id, len(migration.tokens), failure, following.request_id)
            attempt = self._once(following, migration)

    def _aborts_reach(self, migration: Migration):
        """An abort of the request reaches its continuation's hops (they run under their own id)."""
        if not migration.attempts:
            return contextlib.nullcontext()
        return self.hops.samples(migration.request.request_id, [migration.current_id])

    async def _once(self, request: EngineRequest, migration: Migration) -> AsyncIterator[RequestOutput]:
        """One attempt at the answer on the path the router names (module docstring)."""
        try:
            tier = request.tier
            decision = await self._route(request, migration.exclude)
            path: Path = "remote" if decision is None else decision.path  # undecided: Serve picks, remote
            first = prompt_logprobs = None
            handoff = None
            route: RouteLabel
            if decision is not None and path == "whole":
                try:
                    counted = False
                    migration.ran_on(_replica(decision.prefill))
                    async with contextlib.aclosing(self.hops.whole(request, decision.prefill)) as whole:
                        async for output in whole:
                            if not counted:
                                counted = True
                                count_route(tier, "prefill_only")
                            yield output
                    return
                except WholeFailed as failed:  # before its first token: decode computes it
                    route = "fallback_recompute"
                    count_route(tier, route, failed.reason)
            elif path == "local":
                route = "decode_only"  # decode computes the prompt
                count_route(tier, route)
            else:
                reuse = self._reuse_first_token(request, decision)
                answer = await self.hops.prefill(request, None if decision is None else decision.prefill, reuse)
                route = count_prefilled(tier, answer.failed)
                handoff, first, prompt_logprobs = answer.handoff, answer.first, answer.prompt_logprobs
            offset = text = None
            if first is not None:
                # The prefill's token goes out now; decode continues after it.
                first.prompt_logprobs, prompt_logprobs = prompt_logprobs, None
                yield first
                if first.finished:
                    return
                offset = FirstTokenOffset(first.outputs[0].cumulative_logprob)
                text = text_after_cut(self._tokenizer, request, new_token_ids(first), first)
                request = continuation(request, first)
                if text is not None and text.checks_stops:
                    request = without_stop_strings(request)  # the gateway checks them (answer_text.py)
            elif prompt_logprobs is not None:
                request = without_prompt_logprobs(request)
            decode = None if decision is None else decision.decode
            migration.ran_on(_replica(decode))
            async with contextlib.aclosing(self.hops.decode(request, handoff, decode, route=route)) as decoded:
                async for output in decoded:
                    if prompt_logprobs is not None:
                        output.prompt_logprobs, prompt_logprobs = prompt_logprobs, None
                    if text is not None:
                        output = text.restate(output)
                    yield output if offset is None else offset.apply(output)
                    if text is not None and text.stopped:  # the gateway found a stop string: closing decode aborts it
                        return
        finally:
            # Its decode pick was booked in flight at the route (routing/ledger.py): released
            # here if its decode hop never started (the client left, the prefill failed the request).
            self.hops.release(request.request_id)

    async def _route(self, request: EngineRequest, exclude: Collection[str] = ()) -> Optional[RouteDecision]:
        if self._router is None:
            return None
        try:
            return await self._router.route(request, request.tier, exclude=exclude)
        except Exception:  # routing must never fail a request
            log.exception("request %s: routing failed; Serve picks the replicas", request.request_id)
            count_route(request.tier, "router_error")
            return None

    def _reuse_first_token(self, request: EngineRequest, decision: Optional[RouteDecision]) -> bool:
        """Whether the prefill's token can be the answer's first (kv_transfer/first_token.py) and
        the P/D decider finds it pays (rule 9: "handoff_gap" when not); counted either way."""
        blocker = reuse_blocker(request.sampling) if self._first_token_reuse else "off"
        if blocker is None and decision is not None and not decision.reuse_first_token:
            blocker = "handoff_gap"
        FIRST_TOKEN.labels(tier=request.tier, path="prefill" if blocker is None else "decode",
                           reason=blocker or "").inc()
        return blocker is None

    async def abort(self, request_id: str) -> None:
        await self.hops.abort(request_id)

    async def health(self) -> dict[str, Any]:
        health = await self.hops.health()
        return {"ready": health.ready, "pools": dict(health.pools)}


def _replica(pick: Optional[Pick]) -> Optional[str]:
    return None if pick is None else pick.worker.replica_id
