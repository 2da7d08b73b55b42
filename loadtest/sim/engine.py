"""One simulated vLLM engine: vLLM 0.32's v1 scheduler loop on the simulated clock.

Mirrored from vllm/v1/core/sched/scheduler.py `schedule()` (read it beside this file):
- each step has a token budget, `max_num_batched_tokens`;
- the RUNNING requests come first, in order: each gets what it still needs (1 token when
  decoding, the rest of its prompt when prefilling), at most the budget left (chunked
  prefill). A request whose blocks cannot be allocated preempts the LAST running request
  (FCFS), which loses its blocks and its computed tokens and goes back to the FRONT of the
  waiting queue; when the victim is the request itself it is not scheduled;
- only when nothing was preempted, WAITING requests are admitted, FIFO, while budget is left
  and fewer than `max_num_seqs` run: a prompt's cached prefix (kv_cache.py, by real block
  hash) is skipped, the rest is chunked into the budget; a request whose blocks cannot be
  allocated stops admission for this step;
- remote KV (the decode role after a remote prefill, vLLM's WAITING_FOR_REMOTE_KVS): at
  admission it allocates blocks for its whole prompt and starts the pull; the request waits
  outside the running set until the blocks have arrived, then is admitted first (vLLM drains
  its KV-holding queue first) with all but the last prompt token computed (vLLM recomputes
  the last one to sample from it);
- a request samples a token in a step that computes its last known token; its blocks are
  freed when it finishes (a prefill producer's stay until `release`: vLLM keeps them until
  the decode engine has pulled them).

Step time: the step-time model (step_time.py) of the step's shape, times the control plane's
slowdown of shared cores (control_plane.py). Not mirrored: async scheduling's overlap, spec
decode, encoder budgets, priorities, long_prefill_token_threshold (0 in tandem's configs).
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Optional

from loadtest.sim.kv_cache import BlockPool
from loadtest.sim.step_time import StepShape, StepTimeModel


@dataclass(frozen=True)
class EngineParams:
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    num_blocks: int


@dataclass
class LatencyCounters:
    """vLLM's TTFT and inter-token-latency histograms' `_sum`/`_count`, lifetime totals as the
    engine's Prometheus exports them (cluster/autoscaling/signals.py reports their increments)."""

    ttft_s_sum: float = 0.0
    ttft_count: int = 0
    itl_s_sum: float = 0.0
    itl_count: int = 0


@dataclass(eq=False)
class SimRequest:
    """One request inside an engine. `tokens` gets the simulated time of each sampled token."""

    request_id: str
    prompt_tokens: int
    hashes: list[int]  # the prompt's full-block hashes (cluster/hashing.py)
    max_tokens: int
    hold_blocks: bool = False  # a prefill producer: blocks stay until release()
    # Whether its sampled tokens reach the client, so the control plane is charged for them. A
    # prefill producer's token does only when the gateway streams it as the first (reuse);
    # otherwise the decode engine samples the first token again and that one is streamed.
    streamed: bool = True
    remote_kv: Optional[Callable[[int], Awaitable[None]]] = None  # pull(uncached tokens), decode role
    tokens: list[float] = field(default_factory=list)
    arrived: float = 0.0  # when the engine got it: vLLM's TTFT starts here
    computed: int = 0
    blocks: list[int] = field(default_factory=list)
    kv_ready: bool = False
    cached_tokens: int = 0  # prefix-cache hit at its (last) admission
    cached_run: tuple = (None, 0)  # (the blocks list it is about, its leading blocks known cached)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    first: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def num_tokens(self) -> int:
        return self.prompt_tokens + len(self.tokens)

    @property
    def prefilling(self) -> bool:
        return self.computed < self.prompt_tokens


class SimEngine:
    def __init__(self, worker_id: str, params: EngineParams, step_model: StepTimeModel, pool: BlockPool,
                 slowdown: Callable[[], float] = lambda: 1.0,
                 on_tokens: Callable[[float, int], None] = lambda now, n: None,
                 on_busy: Callable[[bool], None] = lambda busy: None):
        self.worker_id = worker_id
        self.params = params
        self.step_model = step_model
        self.pool = pool
        self._slowdown = slowdown
        self._on_tokens = on_tokens  # the control plane's CPU per streamed token (SimRequest.streamed)
        self._on_busy = on_busy  # tells the control plane whether this engine's core is free (control_plane.py)
        self._busy = False
        self._boundary = asyncio.Event()  # set when a step ends (next_boundary)
        self.running: list[SimRequest] = []
        self.waiting: deque[SimRequest] = deque()
        self.kv_ready: deque[SimRequest] = deque()  # remote KV arrived: admitted first
        self.loading: set[SimRequest] = set()
        self._wake = asyncio.Event()
        self._task: Optional[asyncio.Task] = None
        self.reset_counts()
        self.latency = LatencyCounters()
        self._gaps_reported = (0.0, 0)  # latency's (itl_s_sum, itl_count) at the last take_gaps

    def reset_counts(self) -> None:
        """The step counters a run reports start again (a measured rate after a warm-up)."""
        self.steps = 0
        self.preemptions = 0
        self.busy_s = 0.0
        self.full_chunks = (0, 0.0)  # (count, seconds) of steps that were one full budget of prompt (step_record.py)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def submit(self, request: SimRequest) -> SimRequest:
        request.arrived = asyncio.get_running_loop().time()
        self.waiting.append(request)
        self._wake.set()
        return request

    def release(self, request: SimRequest) -> None:
        """A producer's blocks after the consumer pulled them (or gave up)."""
        self.pool.free(request.blocks)
        request.blocks = []
        # A real engine core keeps stepping while it has waiting requests, and its scheduler
        # takes the freed blocks from the connector's finished sends at the next step; this
        # loop sleeps when nothing fits, so freeing blocks must wake it, or a prefill engine
        # whose every block was held for pulls idles with its queue full (nothing else wakes
        # it once the arrivals stop).
        self._wake.set()

    async def next_boundary(self) -> None:
        """Until the end of the step running now (at once when idle). Without NIXL's progress
        thread a pull from this engine completes only when the engine touches NIXL, once per
        step (RESULTS.md section 10); an idle engine's empty steps serve it at once."""
        if self._busy:
            await self._boundary.wait()

    def take_gaps(self) -> tuple[Optional[float], int]:
        """(mean token gap of its streams since the last call, their number), as a replica reports."""
        total, n = self.latency.itl_s_sum, self.latency.itl_count
        gap_sum, gap_n = total - self._gaps_reported[0], n - self._gaps_reported[1]
        self._gaps_reported = (total, n)
        return (gap_sum / gap_n if gap_n else None, gap_n)

    # -- the scheduler ---------------------------------------------------------------------------

    def _blocks_for(self, r: SimRequest, tokens: int) -> int:
        return max(math.ceil(tokens / self.params.block_size) - len(r.blocks), 0)

    def _preempt(self, victim: SimRequest) -> None:
        self.pool.free(victim.blocks)
        victim.blocks, victim.computed = [], 0
        self.waiting.appendleft(victim)
        self.preemptions += 1

    def schedule(self) -> dict[SimRequest, int]:
        budget = self.params.max_num_batched_tokens
        scheduled: dict[SimRequest, int] = {}
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            r = self.running[i]
            n = min(r.num_tokens - r.computed, budget)
            while (new := self.pool.allocate(self._blocks_for(r, r.computed + n))) is None:
                victim = self.running.pop()
                if victim in scheduled:
                    budget += scheduled.pop(victim)
                self._preempt(victim)
                preempted = True
                if victim is r:
                    break
            else:
                r.blocks += new
                self._cache_prompt_blocks(r, r.computed + n)
                scheduled[r] = n
                budget -= n
                i += 1
        if preempted:
            return scheduled
        while budget > 0 and len(self.running) < self.params.max_num_seqs:
            queue = self.kv_ready if self.kv_ready else self.waiting
            if not queue:
                break
            r = queue[0]
            if r.remote_kv is not None and not r.kv_ready:
                if not self._start_pull(r):
                    break
                queue.popleft()
                continue
            if r.kv_ready and r.blocks:  # its prompt's KV is here: recompute the last token only
                r.computed = r.prompt_tokens - 1
            else:
                hit = self.pool.cached_prefix(r.hashes, r.num_tokens)
                need = self._blocks_total(r.num_tokens, len(hit), budget)
                new = self.pool.allocate(need)
                if new is None:
                    break
                self.pool.touch(hit)
                r.blocks = hit + new
                r.computed = r.cached_tokens = len(hit) * self.params.block_size
            n = min(r.num_tokens - r.computed, budget)
            queue.popleft()
            self.running.append(r)
            self._cache_prompt_blocks(r, r.computed + n)
            scheduled[r] = n
            budget -= n
        return scheduled

    def _blocks_total(self, num_tokens: int, hit_blocks: int, budget: int) -> int:
        computed = hit_blocks * self.params.block_size
        n = min(num_tokens - computed, budget)
        return max(math.ceil((computed + n) / self.params.block_size) - hit_blocks, 0)

    def _start_pull(self, r: SimRequest) -> bool:
        """Admit a remote-KV request: blocks for its whole prompt, then the pull (async)."""
        hit = self.pool.cached_prefix(r.hashes, r.prompt_tokens)
        new = self.pool.allocate(math.ceil(r.prompt_tokens / self.params.block_size) - len(hit))
        if new is None:
            return False
        self.pool.touch(hit)
        r.blocks = hit + new
        r.cached_tokens = len(hit) * self.params.block_size
        self.loading.add(r)
        asyncio.get_running_loop().create_task(self._pull(r, r.prompt_tokens - r.cached_tokens))
        return True

    async def _pull(self, r: SimRequest, tokens: int) -> None:
        assert r.remote_kv is not None
        await r.remote_kv(tokens)
        self.loading.discard(r)
        r.kv_ready = True
        self._cache_prompt_blocks(r, r.prompt_tokens)
        self.kv_ready.append(r)
        self._wake.set()

    def _cache_prompt_blocks(self, r: SimRequest, upto_tokens: int) -> None:
        full = min(upto_tokens, r.prompt_tokens) // self.params.block_size
        # A leading block already cached stays cached while r holds it (a referenced block is
        # never evicted), and pool.cache would skip it: start after that run. Same events, and
        # a decode step no longer walks every prompt block (the GPU validation's long prompts).
        start = r.cached_run[1] if r.cached_run[0] is r.blocks else 0
        start = min(start, full)
        self.pool.cache(r.blocks[start:full], r.hashes[start:full])
        r.cached_run = (r.blocks, self.pool.cached_run(r.blocks, start, full))

    # -- the step loop ---------------------------------------------------------------------------

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            scheduled = self.schedule()
            if not scheduled:
                self._set_busy(False)
                self._wake.clear()
                await self._wake.wait()
                continue
            self._set_busy(True)
            shape = StepShape(
                decode_seqs=sum(1 for r in scheduled if not r.prefilling),
                prefill_tokens=sum(n for r, n in scheduled.items() if r.prefilling),
                context_tokens=sum(r.computed + n for r, n in scheduled.items()),
                attention_pairs=sum(n * (2 * r.computed + n + 1) // 2 for r, n in scheduled.items()),
                decode_context_tokens=sum(r.computed + n for r, n in scheduled.items() if not r.prefilling),
            )
            seconds = self.step_model.step_s(shape) * self._slowdown()
            await asyncio.sleep(seconds)
            self._boundary.set()
            self._boundary = asyncio.Event()
            self.steps += 1
            self.busy_s += seconds
            if shape.decode_seqs == 0 and shape.prefill_tokens == self.params.max_num_batched_tokens:
                self.full_chunks = (self.full_chunks[0] + 1, self.full_chunks[1] + seconds)
            now = loop.time()
            streamed = 0
            for r, n in scheduled.items():
                r.computed += n
                if r.computed >= r.num_tokens:
                    self._sample(r, now)
                    streamed += r.streamed
            self._on_tokens(now, streamed)

    def _set_busy(self, busy: bool) -> None:
        if busy != self._busy:
            self._busy = busy
            self._on_busy(busy)

    def _sample(self, r: SimRequest, now: float) -> None:
        if r.tokens:
            self.latency.itl_s_sum += now - r.tokens[-1]
            self.latency.itl_count += 1
        else:
            self.latency.ttft_s_sum += now - r.arrived
            self.latency.ttft_count += 1
        r.tokens.append(now)
        if len(r.tokens) == 1:
            r.first.set()
        if len(r.tokens) >= r.max_tokens:
            self.running.remove(r)
            if not r.hold_blocks:
                self.pool.free(r.blocks)
                r.blocks = []
            r.done.set()
