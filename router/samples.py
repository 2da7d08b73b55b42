"""Sampling n > 1 on the P/D path: one route, one prefill (the prompt computed once), then n
decode requests on the same decode replica. The first pulls the KV; the others start one
after another once the one before has produced (from the first's first token on, decode's
prefix cache holds the prompt's blocks), so the KV crosses once. Seeds follow vLLM's own n:
sample i uses seed + i. The outputs are merged into one stream, index set per sample, as
vLLM's AsyncLLM yields them.

The other half of DisaggregatedBackend (router/disagg.py), which calls `generate_n` for a
request with n > 1; it uses the backend's hops (route, prefill, decode) as they are.
"""

from __future__ import annotations

import asyncio
import copy
from dataclasses import replace
from typing import TYPE_CHECKING, AsyncIterator

from cluster.protocol import EngineRequest
from router.path_metrics import FIRST_TOKEN, ROUTES

if TYPE_CHECKING:
    from vllm.outputs import RequestOutput

    from router.disagg import DisaggregatedBackend


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


async def generate_n(backend: "DisaggregatedBackend", request: EngineRequest) -> AsyncIterator["RequestOutput"]:
    """n samples of one prompt: one prefill, n decode requests (module docstring)."""
    pools = backend._tier(request)
    tier = request.tier
    n = request.sampling.n
    samples = [sample_of(request, i) for i in range(n)]
    backend._samples[request.request_id] = [s.request_id for s in samples]
    decision = await backend._route(samples[0])
    prompt_logprobs = None
    if decision is not None and decision.skip_prefill:
        handoff, path = None, "decode_only"
        ROUTES.labels(tier=tier, path=path, reason="").inc()
    else:
        FIRST_TOKEN.labels(tier=tier, path="decode", reason="n").inc()
        with backend._dispatch(decision, "prefill", samples[0]):
            handoff, _, prompt_logprobs = await backend._prefill_hop(samples[0], pools.prefill, False)
        path = "disaggregated" if handoff is not None else "fallback_recompute"
    if prompt_logprobs is not None:
        samples = [without_prompt_logprobs(s) for s in samples]
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
            async for output in backend._decode(sample, handoff if i == 0 else None, decision, path, pools.decode):
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
