"""Open-loop load generator: replays a schedule of streaming /v1/completions requests against
one or more OpenAI-compatible servers (round-robin by request index) and records what the
client saw of each. Works against tandem's gateway and plain vLLM api_servers alike."""

from __future__ import annotations

import asyncio
import time
from typing import Callable

import httpx

from loadtest.bench.workload import ScheduledRequest
from loadtest.measure.record import RequestRecord
from loadtest.measure.sse import stream_async


async def stream_one(client: httpx.AsyncClient, url: str, model: str, req: ScheduledRequest) -> RequestRecord:
    """One scheduled request, streamed; failed unless it gave exactly `max_tokens` tokens."""
    body = {"model": model, "prompt": list(req.prompt), "max_tokens": req.max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    record, _ = await stream_async(client, f"{url}/v1/completions", body, expect_tokens=req.max_tokens,
                                   index=req.index, workload=req.kind, start_s=req.at_s)
    return record


async def replay(urls: list[str], model: str, schedule: list[ScheduledRequest], drain_timeout_s: float,
                 progress: Callable[[str], None], label: str) -> tuple[list[RequestRecord], float]:
    """Send each request at its arrival time (never waiting for earlier ones: open loop), then
    wait up to `drain_timeout_s` after the last arrival; requests still running then are
    cancelled and recorded as errors. Returns the records and the span first arrival → last
    response."""
    limits = httpx.Limits(max_connections=1024, max_keepalive_connections=64)
    done: list[RequestRecord] = []
    finished_at: list[float] = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(600, connect=30), limits=limits) as client:
        start = time.perf_counter()

        async def one(req: ScheduledRequest) -> None:
            await asyncio.sleep(max(0.0, start + req.at_s - time.perf_counter()))
            rec = await stream_one(client, urls[req.index % len(urls)], model, req)
            done.append(rec)
            finished_at.append(time.perf_counter())

        tasks = [asyncio.create_task(one(r)) for r in schedule]
        last_arrival = schedule[-1].at_s if schedule else 0.0
        deadline = start + last_arrival + drain_timeout_s
        while not all(t.done() for t in tasks) and time.perf_counter() < deadline:
            await asyncio.wait(tasks, timeout=min(10.0, max(0.01, deadline - time.perf_counter())))
            elapsed = time.perf_counter() - start
            sent = sum(r.at_s <= elapsed for r in schedule)
            progress(f"[goodput] {label}: {elapsed:5.0f} s  sent {sent}/{len(schedule)}  done {len(done)}  "
                     f"in flight {sent - len(done)}")
        unfinished = {r.index for r in schedule} - {rec.index for rec in done}
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    by_index = {r.index: r for r in schedule}
    records = [r for r in done if r.index not in unfinished]
    cut = f"unfinished {drain_timeout_s:.0f} s after the last arrival"
    records += [RequestRecord(index=i, workload=by_index[i].kind, start_s=by_index[i].at_s, error=cut)
                for i in sorted(unfinished)]
    first = schedule[0].at_s if schedule else 0.0
    span = (max(finished_at) - start - first) if finished_at else 0.0
    return sorted(records, key=lambda r: r.index), span
