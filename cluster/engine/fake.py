"""FakeEngine: a deterministic Engine (base.py) without vLLM, so the real Ray Serve graph
(gateway, router, both pools) runs on CPU in seconds (tests/serve/). A replica process with a
FakeEngine never imports vLLM (~8 s of CPU each on 2 cores): requests arrive with their
SamplingParams still pickled (cluster/protocol.py ReceivedSampling), and the fake's outputs
(FakeOutput) become vLLM RequestOutputs only when unpickled in the gateway. It lives in the
package, not in tests/support/fakes.py, because Serve replicas import it by class (cluster/app.py
build_app's `engine_cls`). A fake for tests of the graph's logic; what real engines do (NIXL, vLLM's
scheduler, answers' quality) stays with tests/integration/.

Behaviour:
- Tokens: the next token is a function of the last one and the sequence's length, so an
  answer is the same whether decode pulled the prompt, recomputed it, or continued after a
  first token sampled on prefill. Every answer runs to max_tokens ("length"); no EOS.
- KV: `prefill` returns kv_transfer_params of vLLM's NIXL shape (do_remote_prefill, engine
  id, block ids, host, port). `generate` with such params "pulls" (counted as transferred
  prompt tokens and one KV transfer), without them "recomputes" (computed prompt tokens).
  A failed pull is counted and recomputed, as vLLM's kv_load_failure_policy=recompute does.
  No pull reaches the producer: with the `kv_hold_s` knob a prefill's KV stays in its KV usage
  for that long, as a real producer's blocks wait for the pull (the lease drain's test).
- KV events: with `spec.kv_events_host` set (prefix caching on), a publisher speaking vLLM's
  ZMQ protocol (fake_kv_events.py: PUB + replay, bound on that host) sends a BlockStored for
  each full prompt block this engine computes or pulls for the first time, hashed as vLLM
  hashes blocks (cluster/hashing.py, proven equal to a real engine's by
  tests/integration/test_kv_router.py): the router's subscribers and prefix index follow a
  fake engine as they follow a real one. No eviction: nothing is ever removed.
- Counters: the same vLLM metric names VLLMEngine reads (metrics.py), so stats, the exporter
  of exact sums, the autoscaling signals and the routing stats work unchanged; `stats()` adds the
  request ids seen, pulled, recomputed, aborted and cancelled (FakeEngineStats), so a test
  tells which replica did what.
- Knobs (FakeKnobs): latency (start, prefill, per token) and failures (prefill raises, pull
  fails, engine dead, the replica's process dies mid-stream). Engine-wide from the constructor (functools.partial(FakeEngine,
  knobs=...) or FakeEngines(knobs, prefill_knobs) as the app's engine_cls), or per request from the request's
  SamplingParams.extra_args (`vllm_xargs` in an OpenAI request) under the names in KNOB_ARGS.
- Steps: streams of one token pace advance together, one step per pace interval (StepClock),
  as a GPU engine's running batch does.
- Outputs: FakeOutput DELTAs (one token each, its text the token id and a space), merged by
  `merge_outputs` when the replica coalesces them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Optional, Sequence

from cluster import vllm_metrics as vm  # the vLLM metric names, one table
from cluster.engine.base import CacheLayout, Engine, EngineInfo, EngineSpec, KVEventsEndpoint, cache_identity
from cluster.engine.fake_kv_events import KVEventPublisher, block_stored
from cluster.engine.metrics import EngineStats, Readings
from cluster.protocol import EngineRequest, PrefillResult
from cluster.hashing import BlockHasher, engine_hash_seed

START_GATE_MAX_S = 120.0
FIRST_TOKEN_ID = 5  # below: the tiny model's special tokens
RECENT = 1000  # request ids kept per list in stats


@dataclass(frozen=True)
class FakeKnobs:
    start_s: float = 0.0  # start() takes this long
    # start() also waits until this file exists (at most START_GATE_MAX_S): a load that ends when a
    # test says, e.g. once another deployment is up. None: no gate.
    start_gate: Optional[str] = None
    prefill_s: float = 0.0  # each prefill takes this long
    token_s: float = 0.0  # the gap between generated tokens
    fail_prefill: bool = False  # prefill raises (a broken prefill pool, as the gateway sees it)
    fail_pull: bool = False  # the KV pull fails: counted, then the prompt is recomputed
    dead: bool = False  # check_alive raises (Serve's health probe replaces the replica)
    # A generate stream that has yielded this many tokens, with more to come, kills its whole
    # process (os._exit) at its next step: a replica dying mid-answer (router/pd/migration.py).
    # One step later, not at once, so the tokens yielded reach the gateway first. 0: never.
    die_after_tokens: int = 0
    # A prefill keeps its KV (counted in the KV usage gauge) this long after it returns, as a
    # producer's blocks wait for the decode's pull (no pull reaches a fake producer). 0: none.
    kv_hold_s: float = 0.0


# vllm_xargs name → knob: e.g. {"vllm_xargs": {"fake_fail_prefill": 1, "fake_token_s": 0.05}}.
KNOB_ARGS = {f"fake_{f.name}": f.name for f in dataclasses.fields(FakeKnobs) if f.name not in ("start_s", "start_gate", "dead")}


@dataclass(frozen=True)
class FakeEngineStats(EngineStats):
    seen: tuple[str, ...] = ()  # request ids this engine prefilled or generated
    pulled: tuple[str, ...] = ()  # generated with a handoff's KV pulled
    recomputed: tuple[str, ...] = ()  # generated with the prompt computed here
    aborted: tuple[str, ...] = ()  # abort(request_id) calls, known ids or not
    cancelled: tuple[str, ...] = ()  # generate streams closed before their last token, without an abort


def fake_tokens(seq: list[int], n: int, vocab_size: int) -> list[int]:
    """The n tokens FakeEngine generates after `seq`: each is a function of the one before
    and the sequence's length, so where the answer was computed does not change it."""
    seq, out = list(seq), []
    span = max(vocab_size - FIRST_TOKEN_ID, 1)
    for _ in range(n):
        token = FIRST_TOKEN_ID + (seq[-1] * 31 + len(seq)) % span
        seq.append(token)
        out.append(token)
    return out


@dataclass(frozen=True)
class FakeOutput:
    """One DELTA of a fake stream. Unpickled (in the gateway, across Ray) it is the vLLM
    RequestOutput an engine yields, built by `request_output`; in the replica it stays this."""

    request_id: str
    token_ids: tuple[int, ...]
    finish_reason: Optional[str] = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def __reduce__(self):
        return (request_output, (self.request_id, self.token_ids, self.finish_reason))


def request_output(request_id: str, token_ids: Sequence[int], finish_reason: Optional[str]) -> Any:
    """A fake DELTA as vLLM's RequestOutput (the process that calls this imports vLLM)."""
    from vllm.outputs import CompletionOutput, RequestOutput

    completion = CompletionOutput(0, "".join(f"{t} " for t in token_ids), list(token_ids), None, None,
                                  finish_reason=finish_reason)
    return RequestOutput(request_id, None, None, None, [completion], finish_reason is not None)


class _KVEvents:
    """The BlockStored events of the blocks first cached here, published as vLLM publishes them."""

    def __init__(self, host: str, block_size: int):
        self.seed = engine_hash_seed()
        self._hasher = BlockHasher(block_size, self.seed)
        self._block_size = block_size
        self._publisher = KVEventPublisher(host)
        self.endpoint = KVEventsEndpoint(endpoint=self._publisher.endpoint,
                                         replay_endpoint=self._publisher.replay_endpoint)
        self._stored: set[int] = set()

    def store(self, token_ids: list[int], cache_salt: Optional[str]) -> None:
        hashes = self._hasher.hashes(token_ids, cache_salt)
        first_new = next((i for i, h in enumerate(hashes) if h not in self._stored), None)
        if first_new is None:
            return
        new = hashes[first_new:]  # a block's hash chains its parent's: the new ones are a suffix
        self._stored.update(new)
        size = self._block_size
        parent = hashes[first_new - 1] if first_new else None
        self._publisher.publish([block_stored(new, parent, token_ids[first_new * size:len(hashes) * size], size)])

    def shutdown(self) -> None:
        self._publisher.close()


def _vocab_size(spec: EngineSpec) -> int:
    try:
        return int(json.loads((Path(spec.model_path) / "config.json").read_text())["vocab_size"])
    except (OSError, KeyError, ValueError):
        return 256


class StepClock:
    """The steps of an engine that runs every stream of one pace together, as vLLM's scheduler
    does (one forward pass, one token for each running sequence): each stream waits for the
    next step boundary, and all of them wake in the same turn of the event loop, from one timer.
    So the replica sees what a GPU engine gives it, a burst of outputs per step, and the fake
    costs one timer per step, not one per token."""

    def __init__(self, step_s: float):
        self.step_s = step_s
        self._waiters: list[asyncio.Future] = []
        self._timer: Optional[asyncio.TimerHandle] = None
        self._last = 0.0  # the last boundary fired: asyncio may fire a timer up to its clock resolution early
        self._loop: Optional[asyncio.AbstractEventLoop] = None

    def next_step(self) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a new event loop (a test's next asyncio.run): the old timer never fires
            self._loop, self._waiters, self._timer = loop, [], None
        step = loop.create_future()
        self._waiters.append(step)
        if self._timer is None:
            at = max((math.floor(loop.time() / self.step_s) + 1) * self.step_s, self._last + self.step_s)
            self._timer = loop.call_at(at, self._fire, at)
        return step

    def _fire(self, at: float) -> None:
        waiters, self._waiters, self._timer, self._last = self._waiters, [], None, at
        for step in waiters:
            if not step.done():  # an abort may have ended its wait already
                step.set_result(None)


@dataclass(frozen=True)
class FakeEngines:
    """An app's engine factory (build_app's engine_cls): FakeEngines with `knobs`, the prefill
    pool's with `prefill_knobs` where given (a pool whose engines load slowly, as vLLM's do)."""

    knobs: FakeKnobs = FakeKnobs()
    prefill_knobs: Optional[FakeKnobs] = None

    def __call__(self, spec: EngineSpec) -> "FakeEngine":
        prefill = spec.kv_role == "kv_producer"
        return FakeEngine(spec, self.prefill_knobs if prefill and self.prefill_knobs else self.knobs)


class FakeEngine(Engine):
    def __init__(self, spec: EngineSpec, knobs: FakeKnobs = FakeKnobs()):
        super().__init__(spec)
        self.knobs = knobs
        self.info: Optional[EngineInfo] = None
        self._vocab = _vocab_size(spec)
        self._values: Readings = {}
        self._running: dict[str, asyncio.Event] = {}  # request id → set on abort
        self._clocks: dict[float, StepClock] = {}  # token pace → the steps of streams at that pace
        self._waiting: dict[str, asyncio.Future] = {}  # request id → the step its stream waits for
        self._ids = {name: deque(maxlen=RECENT) for name in ("seen", "pulled", "recomputed", "aborted", "cancelled")}
        self._closed = False
        self._kv_events: Optional[_KVEvents] = None
        self._held: dict[str, float] = {}  # request id → when its prefill's KV is let go (monotonic)

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> EngineInfo:
        time.sleep(self.knobs.start_s)
        gate_deadline = time.monotonic() + START_GATE_MAX_S
        while self.knobs.start_gate and not os.path.exists(self.knobs.start_gate) and time.monotonic() < gate_deadline:
            time.sleep(0.1)
        block = self.spec.engine.block_size or 16
        if self.spec.kv_events_host is not None:
            self._kv_events = _KVEvents(self.spec.kv_events_host, block)
        seed = self._kv_events.seed if self._kv_events else "fake"
        cache = CacheLayout(block_size=block, hash_algo="sha256", hash_seed=seed)
        self.info = EngineInfo(worker_id=self.spec.worker_id, kv_role=self.spec.kv_role, cache=cache,
                               identity=cache_identity(self.spec, block),
                               kv_events=self._kv_events.endpoint if self._kv_events else None)
        return self.info

    def check_alive(self) -> None:
        if self.knobs.dead or self._closed:
            raise RuntimeError(f"fake engine {self.spec.worker_id} is dead")

    def shutdown(self) -> None:
        if not self._closed and self._kv_events is not None:
            self._kv_events.shutdown()
        self._closed = True

    # -- requests --------------------------------------------------------------------------

    def next_token(self, seq: list[int]) -> int:
        return fake_tokens(seq, 1, self._vocab)[0]

    def _knobs(self, request: EngineRequest) -> FakeKnobs:
        extra = request.sampling.extra_args or {}
        wanted = {knob: extra[arg] for arg, knob in KNOB_ARGS.items() if arg in extra}
        for knob, value in wanted.items():
            wanted[knob] = bool(value) if knob.startswith("fail") else int(value) if knob == "die_after_tokens" \
                else float(value)
        return dataclasses.replace(self.knobs, **wanted) if wanted else self.knobs

    def _add(self, key: tuple[str, Optional[str]], amount: float = 1.0) -> None:
        self._values[key] = self._values.get(key, 0.0) + amount

    async def prefill(self, request: EngineRequest, *, first_token: bool = False) -> PrefillResult:
        knobs = self._knobs(request)
        self._ids["seen"].append(request.request_id)
        await asyncio.sleep(knobs.prefill_s)
        if knobs.fail_prefill:
            raise RuntimeError(f"fake prefill of {request.request_id} failed (knob fail_prefill)")
        prompt = list(request.prompt_token_ids)
        self._add(vm.PROMPT_TOKENS_COMPUTED, len(prompt))
        self._cached(request)
        wanted = request.sampling.max_tokens or 1
        first = None
        if first_token:
            first = self._output(request.request_id, [self.next_token(prompt)],
                                 "length" if wanted == 1 else None)
        keep_kv = not first_token or wanted > 1
        if keep_kv and knobs.kv_hold_s > 0:
            self._held[request.request_id] = time.monotonic() + knobs.kv_hold_s
            self._set_running()
        block = self.info.cache.block_size if self.info else 16
        params = None
        if keep_kv:
            nixl = self.spec.nixl
            params = {"do_remote_prefill": True, "do_remote_decode": False,
                      "remote_engine_id": self.spec.worker_id,
                      "remote_block_ids": list(range(-(-len(prompt) // block))),
                      "remote_host": nixl.host if nixl else "127.0.0.1", "remote_port": nixl.port if nixl else 0,
                      "remote_num_tokens": len(prompt)}
        return PrefillResult(request_id=request.request_id, kv_transfer_params=params,
                             worker_id=self.spec.worker_id, num_prompt_tokens=len(prompt), first=first)

    async def generate(self, request: EngineRequest,
                       kv_transfer_params: Optional[dict[str, Any]]) -> AsyncIterator[Any]:
        knobs = self._knobs(request)
        rid = request.request_id
        self._ids["seen"].append(rid)
        seq = list(request.prompt_token_ids)
        if kv_transfer_params and kv_transfer_params.get("do_remote_prefill") and not knobs.fail_pull:
            self._add(vm.PROMPT_TOKENS_TRANSFERRED, len(seq))
            self._add(vm.KV_TRANSFERS)
            self._add(vm.KV_BYTES_TRANSFERRED, 64.0 * len(seq))
            self._ids["pulled"].append(rid)
        else:
            if kv_transfer_params:
                self._add(vm.KV_FAILED_TRANSFERS)
            self._add(vm.PROMPT_TOKENS_COMPUTED, len(seq))
            self._ids["recomputed"].append(rid)
        self._cached(request)
        aborted = self._running.setdefault(rid, asyncio.Event())
        self._set_running()
        started = last = time.perf_counter()
        done = False
        try:
            limit = request.sampling.max_tokens or 16
            for i in range(limit):
                if knobs.token_s:
                    step = self._clocks.setdefault(knobs.token_s, StepClock(knobs.token_s)).next_step()
                    self._waiting[rid] = step  # abort ends the wait early
                    await step
                    self._waiting.pop(rid, None)
                else:
                    await asyncio.sleep(0)
                if aborted.is_set():
                    return
                if knobs.die_after_tokens and i == knobs.die_after_tokens:
                    os._exit(1)  # the replica's actor dies, as after a SIGKILL or an OOM kill
                token = self.next_token(seq)
                seq.append(token)
                now = time.perf_counter()
                if i == 0:
                    self._add(vm.TTFT_SUM, now - started)
                    self._add(vm.TTFT_COUNT)
                else:
                    self._add(vm.ITL_SUM, now - last)
                    self._add(vm.ITL_COUNT)
                last = now
                done = i == limit - 1
                yield self._output(rid, [token], "length" if done else None)
        finally:  # also when the caller closes the stream early (the client left)
            if not done and not aborted.is_set():
                self._ids["cancelled"].append(rid)
            self._running.pop(rid, None)
            self._waiting.pop(rid, None)
            self._set_running()

    def _cached(self, request: EngineRequest) -> None:
        if self._kv_events is not None:
            self._kv_events.store(list(request.prompt_token_ids), request.cache_salt)

    async def abort(self, request_id: str) -> None:
        self._ids["aborted"].append(request_id)
        event = self._running.get(request_id)
        if event is not None:
            event.set()
        step = self._waiting.pop(request_id, None)
        if step is not None and not step.done():
            step.set_result(None)

    def _output(self, request_id: str, token_ids: list[int], finish_reason: Optional[str]) -> FakeOutput:
        return FakeOutput(request_id, tuple(token_ids), finish_reason)

    def merge_outputs(self, outputs: Sequence[FakeOutput]) -> FakeOutput:
        return FakeOutput(outputs[0].request_id, tuple(t for out in outputs for t in out.token_ids),
                          outputs[-1].finish_reason)

    # -- counters --------------------------------------------------------------------------

    def _set_running(self) -> None:
        now = time.monotonic()
        self._held = {rid: until for rid, until in self._held.items() if until > now}
        self._values[vm.REQUESTS_RUNNING] = float(len(self._running))
        self._values[vm.KV_CACHE_USAGE] = (len(self._running) + len(self._held)) / max(self.spec.engine.max_num_seqs, 1)

    def metrics(self) -> Readings:
        if self._held:
            self._set_running()  # a hold ends with time, not with an event
        return dict(self._values)

    def stats(self) -> FakeEngineStats:
        base = super().stats()
        return FakeEngineStats(**dataclasses.asdict(base), **{k: tuple(v) for k, v in self._ids.items()})
