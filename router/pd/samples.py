"""Sampling n > 1 on the P/D path: one route, one prefill (the prompt computed once), then n
decode requests on the same decode replica. The first pulls the KV; the others start one
after another once the one before has produced (from the first's first token on, decode's
prefix cache holds the prompt's blocks), so the KV crosses once. Seeds follow vLLM's own n:
sample i uses seed + i. The outputs are merged into one stream, index set per sample, as
vLLM's AsyncLLM yields them.

DisaggregatedBackend (path.py) hands a request with n > 1 to `generate_n`, with its hops
(hops.py) and its way to route a request.
"""

from __future__ import annotations

import asyncio
import copy
from dataclasses import replace
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable, Optional

from cluster.protocol import EngineRequest
from router.path_metrics import FIRST_TOKEN, count_prefilled, count_route
from router.pd.hops import Hops
from router.routing.types import Pick, RouteDecision, RouteLabel

if TYPE_CHECKING:
    from vllm.outputs import RequestOutput

Route = Callable[[EngineRequest], Awaitable[Optional[RouteDecision]]]
Continued = Callable[[EngineRequest, AsyncIterator[Any], Optional[Pick]], AsyncIterator[Any]]


def sample_of(request: EngineRequest, i: int) -> EngineRequest:
    """Sample i of an n > 1 request as a request of its own (vLLM's n: seed + i)."""
    sampling = request.sampling.clone()
    sampling.n = 1
    if sampling.seed is not None:
        sampling.seed += i
    return replace(request, request_id=f"{request.request_id}-s{i}", sampling=sampling)


def without_prompt_logprobs(request: EngineRequest) -> EngineRequest:
    """The request without prompt logprobs (the prefill computed them)."""
    sampling = request.sampling.clone()
    sampling.prompt_logprobs = None
    return replace(request, sampling=sampling)


async def generate_n(hops: Hops, route: Route, request: EngineRequest,
                     continued: Optional[Continued] = None) -> AsyncIterator[RequestOutput]:
    """n samples of one prompt: one prefill, n decode requests (module docstring). `continued`
    (sample, its decode stream, the decode pick) → the sample's answer, migrated where its
    stream breaks (path.py, migration.py): each sample continues as a request of its own."""
    n = request.sampling.n
    samples = [sample_of(request, i) for i in range(n)]
    with hops.samples(request.request_id, [s.request_id for s in samples]):
        decision, handoff, path, prompt_logprobs = await _prefill_once(hops, route, samples[0])
        if prompt_logprobs is not None:
            samples = [without_prompt_logprobs(s) for s in samples]
        decode = None if decision is None else decision.decode
        queue: asyncio.Queue = asyncio.Queue()
        # Sample i starts once sample i-1 has produced: sample 0's first output means decode's
        # prefix cache holds the prompt. One at a time, not all at once: two samples started
        # together on one decode replica left one without a first token (seen with n=3 on the
        # CPU test cluster, n=2 never); a decode step per sample is the price.
        produced = [asyncio.Event() for _ in range(n)]

        async def run(i: int, sample: EngineRequest) -> None:
            try:
                if i > 0:
                    await produced[i - 1].wait()
                stream = hops.decode(sample, handoff if i == 0 else None, decode, route=path)
                if continued is not None:
                    stream = continued(sample, stream, decode)
                async for output in stream:
                    produced[i].set()
                    await queue.put((i, output))
                await queue.put((i, None))
            except BaseException as exc:
                produced[i].set()
                await queue.put((i, exc))
                raise

        tasks = [asyncio.ensure_future(run(i, s)) for i, s in enumerate(samples)]
        try:
            running = n
            finished = 0  # counted by finished outputs: a sample's stream may close after another's last output
            started: set[int] = set()
            while running:
                i, item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                if item is None:
                    running -= 1
                    continue
                finished += bool(item.finished)
                output = copy.copy(item)
                output.request_id = request.request_id
                output.outputs = [replace(c, index=i) for c in item.outputs]
                output.finished = bool(item.finished and finished == n)
                if prompt_logprobs is not None and i not in started:
                    # The prefill's, as vLLM's own n yields them: on each sample's first output
                    # (its streaming echo reads them per choice).
                    started.add(i)
                    output.prompt_logprobs = prompt_logprobs
                yield output
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            hops.release(samples[0].request_id)  # the route booked sample 0's decode pick


async def _prefill_once(hops: Hops, route: Route, first: EngineRequest):
    """Route sample 0 and compute the prompt for all: (the decision, the handoff for sample 0's
    decode, the route the samples take, the prompt's logprobs when asked for)."""
    tier = first.tier
    decision = await route(first)
    if decision is not None and decision.path == "local":
        path: RouteLabel = "decode_only"
        count_route(tier, path)
        return decision, None, path, None
    FIRST_TOKEN.labels(tier=tier, path="decode", reason="n").inc()
    answer = await hops.prefill(first, None if decision is None else decision.prefill, False)
    return decision, answer.handoff, count_prefilled(tier, answer.failed), answer.prompt_logprobs
