"""KVRouter: the gateway's routing decision for each request, and the KV-event plumbing.

Lifecycle and call order:
1. `KVRouter(...)` in the gateway's constructor; it starts nothing.
2. `await route(request)` per request: syncs KV-event subscribers with the live workers
   (throttled), hashes the prompt per cache layout, looks the hashes up in the PrefixIndex,
   picks the decode worker and the prefill worker, asks the decider (decider.py) whether
   the remote prefill is worth it from both engines' live state and cost models, counts the
   decision and its reason. Never raises for routing reasons: an index that
   cannot answer (Redis down, slow) means load-only routing, no workers known means "let
   Serve choose".
3. `dispatch(decision.prefill / decision.decode, request_id, streams)` as a context manager
   around each hop: pins the request to the chosen replica and counts it in flight. Around
   the hop that computes the prompt it also counts the prompt's uncached tokens as queued on
   that replica: a prefill hop until it returns, a streaming hop (a local prefill on decode,
   a whole request on prefill) until `first_token(request_id)` or the hop's end. A prefill
   engine's prompt with nothing of this gateway's queued ahead of it is timed until done:
   one observation for that engine's prefill cost model. The counts are the LoadLedger's
   (ledger.py).
4. `first_token(request_id)` when a streaming hop yields its first token;
   `observe_handoff(decode_pick, seconds)` when a decode hop after a remote prefill does
   (the decode engine's handoff time, for the decider's rule 7).
5. `close()` once: stops the subscribers and the index client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from typing import Callable, Collection, Iterator, Mapping, Optional

from cluster.config import SLOConfig
from cluster.protocol import EngineRequest
from cluster.types import PoolId, RoutingStats
from cluster.hashing import DEFAULT_SEED, BlockHasher
from router.kv_events import KVEventSubscriber
from router.prefix_index import IndexUnavailable, PrefixIndex
from router.routing import metrics
from router.routing.cost_model import EngineCostModel
from router.routing.decider import Decision, DecodeView, Objectives, PDDecider, PrefillView, RequestView, decide
from router.routing.directory import PoolDirectory, ReplicaInfo
from router.routing.ledger import LoadLedger
from router.routing.pipeline import LORA_EVICTS, LORA_HELD, LORA_ROOM, lora_score, pick
from router.routing.types import ROUTE_LABELS, Path, Pick, RouteContext, RouteDecision, Worker
from router.tracing import annotate_route

# lora_score's level of the engine a LoRA request was sent to → tandem_lora_routes' affinity label.
LORA_AFFINITY = {LORA_HELD: "held", LORA_ROOM: "free_slot", LORA_EVICTS: "evicts"}

log = logging.getLogger(__name__)

INDEX_TIMEOUT_S = 0.25
SYNC_PERIOD_S = 0.5
_SLO = SLOConfig()
DEFAULT_OBJECTIVES = Objectives(ttft_s=_SLO.ttft_s, itl_s=_SLO.itl_s, gap_s=_SLO.gap_s)
DEFAULT_CHUNK_BUDGET = 2048  # vLLM's max_num_batched_tokens when unset (chunked prefill on, its default)
OUTLIER_FACTOR = 3.0


def worker_from(info: ReplicaInfo, pool: PoolId, in_flight: int, adapters: frozenset[str] = frozenset()) -> Worker:
    """A Worker from a replica's directory entry; before its first routing stats arrive it
    is load-only (no cache layout known). `adapters`: those of this gateway's hops on it now,
    held there with those the engine reported."""
    stats = info.stats
    return Worker(
        worker_id=stats.worker_id or pool.worker_id(info.replica_id),
        replica_id=info.replica_id,
        tier=pool.tier,
        pool=pool.role,
        in_flight=in_flight,
        capacity=max(int(info.capacity), 1),
        kv_usage=stats.kv_usage,
        block_size=stats.block_size if stats.hash_algo == "sha256" else None,
        hash_seed=stats.hash_seed or DEFAULT_SEED,
        loras=frozenset(stats.loras or ()) | adapters,
        max_loras=stats.max_loras,
    )


class KVRouter:
    traced = False  # set by the gateway when tracing is on: each decision on the request's span

    def __init__(self, *, directories: Mapping[tuple[str, str], PoolDirectory], index: Optional[PrefixIndex],
                 weights: Mapping[str, float], decider: PDDecider, subscribe: bool = True,
                 rng: Optional[random.Random] = None, clock: Callable[[], float] = time.monotonic,
                 picker: str = "max_score", objectives: Optional[Mapping[str, Objectives]] = None,
                 chunk_budgets: Optional[Mapping[str, int]] = None,
                 prefill_chunk_budgets: Optional[Mapping[str, int]] = None,
                 timer: Callable[[], float] = time.perf_counter,
                 on_verdict: Optional[Callable[[tuple, Decision], None]] = None):
        # directories: (tier, pool) → the PoolDirectory of that deployment ("interactive", "prefill").
        self._directories = dict(directories)
        self._index = index
        self._weights = dict(weights)
        self._decider = decider
        self._picker = picker  # pipeline.PICKERS; the baselines exist for benchmarks
        self._turns: dict[tuple[str, str], int] = {}  # (tier, pool) → picks so far, for round_robin
        self._subscribe = subscribe and index is not None
        self._rng = rng or random.Random()
        self._clock = clock
        self._subscribers: dict[str, KVEventSubscriber] = {}
        self._last_sync = float("-inf")
        # The decider's inputs: tier → objectives and decode chunk budget; worker_id → its cost
        # model (replaced on each observation) and its last step report seen.
        self._objectives = dict(objectives or {})
        self._chunk_budgets = dict(chunk_budgets or {})  # tier → its decode engines' budget
        self._prefill_budgets = dict(prefill_chunk_budgets or {})  # ... its prefill engines'
        self._models: dict[str, EngineCostModel] = {}
        self._step_reports: dict[str, tuple] = {}
        self._ledger = LoadLedger(clock=clock, timer=timer)  # this gateway's requests on each replica
        # Sees each verdict with decide()'s inputs: the simulator (loadtest/sim) records them to
        # prove it replays the real decider.
        self._on_verdict = on_verdict

    # -- workers and their event streams ---------------------------------------------------

    def workers(self, tier: str, pool: str) -> list[Worker]:
        directory = self._directories.get((tier, pool))
        if directory is None:
            return []
        pool_id = PoolId(tier, pool)  # type: ignore[arg-type]
        return [worker_from(r, pool_id, self._ledger.in_flight(r.replica_id), self._ledger.adapters(r.replica_id))
                for r in directory.replicas()]

    async def _sync_subscribers(self) -> None:
        """Follow the KV events of every live worker; forget the workers that left."""
        now = self._clock()
        if not self._subscribe or now - self._last_sync < SYNC_PERIOD_S:
            return
        self._last_sync = now
        live: dict[str, tuple[str, Optional[str]]] = {}
        for directory in self._directories.values():
            for info in directory.replicas():
                endpoint = info.stats.kv_events
                if endpoint and info.stats.worker_id:
                    live[info.stats.worker_id] = (endpoint, info.stats.kv_replay)
        for worker_id, (endpoint, replay) in live.items():
            old = self._subscribers.get(worker_id)
            if old is not None and old.crashed:  # its thread died: follow the worker anew
                log.warning("KV event subscriber of %s had stopped; restarting it", worker_id)
                metrics.KV_EVENTS.labels(kind="restarted").inc()
                del self._subscribers[worker_id]
            if worker_id not in self._subscribers:
                sub = KVEventSubscriber(worker_id, endpoint, replay, self._index,
                                        on_event=lambda kind: metrics.KV_EVENTS.labels(kind=kind).inc())
                sub.start()
                self._subscribers[worker_id] = sub
                log.info("following KV events of %s at %s", worker_id, endpoint)
        for worker_id in [w for w in self._subscribers if w not in live]:
            await asyncio.to_thread(self._subscribers.pop(worker_id).stop)  # joins its thread
            try:
                await asyncio.to_thread(self._index.remove_worker, worker_id)
            except IndexUnavailable:
                pass  # its entries stay until Redis returns; a gone worker is never a candidate
            log.info("worker %s left; its prefix entries are removed", worker_id)

    # -- the decision ------------------------------------------------------------------------

    async def _matches(self, token_ids, workers: list[Worker], cache_salt: Optional[str] = None,
                       lora: Optional[tuple[str, str]] = None) -> tuple[dict[str, int], dict[str, int], bool]:
        """(blocks of the prompt per worker, leading cached blocks per worker, index answered)."""
        num_blocks: dict[str, int] = {}
        layouts: dict[tuple[int, str], list[int]] = {}
        for w in workers:
            if w.block_size:
                key = (w.block_size, w.hash_seed or DEFAULT_SEED)
                if key not in layouts:
                    layouts[key] = BlockHasher(*key).hashes(token_ids, cache_salt, lora)  # salted and keyed like vLLM
                num_blocks[w.worker_id] = len(layouts[key])
        if self._index is None or not layouts:
            return num_blocks, {}, self._index is not None
        matches: dict[str, int] = {}
        try:
            for key, hashes in layouts.items():
                if not hashes:
                    continue
                if getattr(self._index, "in_process", False):  # microseconds: no thread hop
                    found = self._index.match(hashes)
                else:  # a network round trip: off the event loop, bounded
                    found = await asyncio.wait_for(asyncio.to_thread(self._index.match, hashes), INDEX_TIMEOUT_S)
                same_layout = {w.worker_id for w in workers if (w.block_size, w.hash_seed or DEFAULT_SEED) == key}
                matches.update({w: n for w, n in found.items() if w in same_layout})
        except (IndexUnavailable, asyncio.TimeoutError) as exc:
            metrics.INDEX_ERRORS.inc()
            log.debug("prefix index unavailable (%s); routing on load", exc)
            return num_blocks, {}, False
        return num_blocks, matches, True

    async def route(self, request: EngineRequest, tier: str, exclude: Collection[str] = ()) -> RouteDecision:
        """`exclude`: Serve replica ids not to pick (a migrated request's failed replicas,
        router/pd/migration.py); with every decode replica excluded, the request runs whole on
        a prefill replica."""
        started = time.perf_counter()
        await self._sync_subscribers()
        decode_workers = [w for w in self.workers(tier, "decode") if w.replica_id not in exclude]
        prefill_workers = [w for w in self.workers(tier, "prefill") if w.replica_id not in exclude]
        adapter = request.adapter
        num_blocks, matches, index_ok = await self._matches(request.prompt_token_ids, decode_workers + prefill_workers,
                                                            request.cache_salt,
                                                            None if adapter is None else (adapter.name, adapter.path))
        ctx = RouteContext(tier=tier, prompt_tokens=len(request.prompt_token_ids),
                           num_blocks=num_blocks, matches=matches, adapter=None if adapter is None else adapter.name)
        decode = self._pick(decode_workers, ctx, tier, "decode")
        prefill = None
        path: Path = "remote"
        reuse = True
        if decode is not None:
            if self._decider.mode != "never":
                prefill = self._pick(prefill_workers, ctx, tier, "prefill")
            verdict = self._decide(ctx, tier, decode, prefill, request.sampling.max_tokens)
            # Whole needs the prefill replica it runs on; without one the request goes remote.
            path = "remote" if verdict.path == "whole" and prefill is None else verdict.path
            reuse = verdict.reuse_first_token
            metrics.PD_DECISIONS.labels(tier=tier, path=verdict.path, reason=verdict.reason).inc()
            log.debug("request %s: %s (%s): ttft remote %.3f s, local %.3f s, streams' gap if local %.3f s",
                      request.request_id, verdict.path, verdict.reason, verdict.ttft_remote_s,
                      verdict.ttft_local_s, verdict.gap_local_s)
        else:
            prefill = self._pick(prefill_workers, ctx, tier, "prefill")
            if exclude and prefill is not None:
                # A continuation whose decode replica failed, and no other known: Serve would send
                # a decode hop to the failed one (or wait for its replacement); a prefill replica
                # runs it whole now.
                path = "whole"
        local = path == "local"
        if decode is not None and path != "whole":
            self._ledger.book(request.request_id, decode.worker)
        if local:
            prefill = None
            self._ledger.expect(request.request_id, ctx.prompt_tokens - _hit_tokens(decode, ctx))
        elif prefill is not None:
            self._ledger.expect(request.request_id, ctx.prompt_tokens - _hit_tokens(prefill, ctx))
        hit = _hit_tokens(decode, ctx) if local else _hit_tokens(prefill, ctx)
        if not index_ok:
            reason = "index_unavailable"
        elif (decode if local else prefill) is None:
            reason = "no_workers"
        else:
            reason = "prefix_hit" if hit > 0 else "load"
        decision = RouteDecision(prefill=prefill, decode=decode, path=path, reason=reason,
                                 predicted_hit_tokens=hit, reuse_first_token=reuse)
        metrics.DECISIONS.labels(tier=tier, path=ROUTE_LABELS[path], reason=reason).inc()
        metrics.PREDICTED_HIT_TOKENS.labels(tier=tier, pool="decode" if local else "prefill").inc(hit)
        metrics.PROMPT_TOKENS.labels(tier=tier).inc(ctx.prompt_tokens)
        if adapter is not None:
            for pool, chosen in (("decode", None if path == "whole" else decode), ("prefill", None if local else prefill)):
                if chosen is not None:
                    metrics.LORA_ROUTES.labels(tier=tier, pool=pool, affinity=LORA_AFFINITY[lora_score(chosen.worker, ctx)]).inc()
        metrics.DECISION_SECONDS.observe(time.perf_counter() - started)
        if self.traced:
            annotate_route(decision)
        return decision

    def _decide(self, ctx: RouteContext, tier: str, decode: Pick, prefill: Optional[Pick],
                max_tokens: Optional[int]):
        """The decider's frozen inputs from the chosen engines' reported stats, this gateway's
        own queue accounting (fresher than the stats) and the cost models."""
        d_stats = self._stats_of(decode.worker)
        d_model = self._observe_step(decode.worker.worker_id, d_stats)
        running = max(d_stats.running_seqs, decode.worker.in_flight)
        decode_view = DecodeView(running_seqs=running,
                                 chunk_budget_tokens=self._chunk_budgets.get(tier, DEFAULT_CHUNK_BUDGET),
                                 model=d_model, queued_tokens=self._ledger.queued_tokens(decode.worker.replica_id))
        if prefill is None:  # none known yet: an idle engine of the prior model
            prefill_view = PrefillView(queued_tokens=0)
        else:
            p_stats = self._stats_of(prefill.worker)
            reported = max((p_stats.queued_prompt_tokens or 0) - self._ledger.recently_done(prefill.worker.replica_id), 0)
            queued = max(reported, self._ledger.queued_tokens(prefill.worker.replica_id))
            prefill_view = PrefillView(queued_tokens=queued, model=self._observe_step(prefill.worker.worker_id, p_stats),
                                       chunk_budget_tokens=self._prefill_budgets.get(tier, DEFAULT_CHUNK_BUDGET),
                                       running_seqs=p_stats.running_seqs)
        req = RequestView(prompt_tokens=ctx.prompt_tokens, cached_on_decode=_hit_tokens(decode, ctx),
                          cached_on_prefill=_hit_tokens(prefill, ctx), max_tokens=max_tokens)
        inputs = (self._decider, req, prefill_view, decode_view, self._objectives.get(tier, DEFAULT_OBJECTIVES))
        verdict = decide(*inputs)
        if self._on_verdict is not None:
            self._on_verdict(inputs, verdict)
        return verdict

    def _stats_of(self, worker: Worker) -> RoutingStats:
        directory = self._directories.get((worker.tier, worker.pool))
        for info in directory.replicas() if directory is not None else ():
            if info.replica_id == worker.replica_id:
                return info.stats
        return RoutingStats()

    def _observe_step(self, worker_id: str, stats: RoutingStats) -> EngineCostModel:
        """Feed a decode engine's step report to its model, once per new report."""
        model = self._models.get(worker_id, EngineCostModel())
        report = (stats.running_seqs, stats.step_s, stats.step_n)
        if stats.step_s is not None and report != self._step_reports.get(worker_id):
            self._step_reports[worker_id] = report
            model = model.observe_step(float(stats.running_seqs), stats.step_s)
            self._models[worker_id] = model
        return model

    def cost_model(self, worker_id: str) -> EngineCostModel:
        """The engine's cost model as calibrated so far (the prior when never observed)."""
        return self._models.get(worker_id, EngineCostModel())

    def _pick(self, workers: list[Worker], ctx: RouteContext, tier: str, pool: str) -> Optional[Pick]:
        turn = self._turns.get((tier, pool), 0)
        self._turns[(tier, pool)] = turn + 1
        return pick(workers, ctx, self._weights, self._rng, self._picker, turn)

    @contextlib.contextmanager
    def dispatch(self, chosen: Optional[Pick], request_id: str, streams: bool = False,
                 adapter: Optional[str] = None) -> Iterator[None]:
        """Send the next call for `request_id` to the chosen replica, counted in flight (with its
        LoRA `adapter`, held there meanwhile). If this hop computes the prompt, its uncached
        tokens count as queued on the replica until the prompt is done: when the hop returns,
        or, for a hop that `streams`, at `first_token`."""
        if chosen is None:
            yield
            return
        worker = chosen.worker
        directory = self._directories[(worker.tier, worker.pool)]
        directory.pin(request_id, worker.replica_id)
        self._ledger.start(request_id, worker, adapter)
        try:
            yield
        except BaseException:
            self._prompt_done(request_id, observe=False)
            raise
        finally:
            directory.unpin(request_id)
            self._ledger.end(worker, adapter)
        # Returned: a prefill hop computed its prompt (router/pd/hops.py catches its failures
        # inside); a stream that ended before its first token computed nothing to time.
        self._prompt_done(request_id, observe=not streams)

    def release(self, request_id: str) -> None:
        """An attempt at the request is over (router/pd/path.py): its decode pick, booked at the
        route, stops counting if its decode hop never started."""
        self._ledger.unbook(request_id)

    def observe_handoff(self, chosen: Pick, seconds: float) -> None:
        worker_id = chosen.worker.worker_id
        self._models[worker_id] = self._models.get(worker_id, EngineCostModel()).observe_handoff(seconds)

    def first_token(self, request_id: str) -> None:
        """A streaming hop yielded its first token: its prompt is no longer queued there."""
        self._prompt_done(request_id, observe=True)

    def _prompt_done(self, request_id: str, observe: bool) -> None:
        timed = self._ledger.prompt_done(request_id, observe)
        if timed is None:
            return
        worker_id = timed.worker.worker_id
        model = self._models.get(worker_id, EngineCostModel())
        # A timed-out or failed hop (router/pd/hops.py catches those inside the hop) is not a
        # prefill time: one observation moves the model at most 3x from its prediction.
        predicted = model.prefill_s(timed.tokens)
        seconds = min(max(timed.seconds, predicted / OUTLIER_FACTOR), predicted * OUTLIER_FACTOR)
        self._models[worker_id] = model.observe_prefill(timed.tokens, seconds)

    def close(self) -> None:
        for sub in self._subscribers.values():
            sub.stop()
        self._subscribers.clear()
        if self._index is not None:
            self._index.close()


def _hit_tokens(chosen: Optional[Pick], ctx: RouteContext) -> int:
    if chosen is None or not chosen.worker.block_size:
        return 0
    return ctx.matches.get(chosen.worker.worker_id, 0) * chosen.worker.block_size
