"""cluster/coalesce.py: what is ready goes out as one item, nothing waits for a later one,
order is kept, and a reader that leaves stops the source at once."""

from __future__ import annotations

import asyncio

import pytest

from cluster.coalesce import coalesced
from cluster.protocol import TokenChunk, merge_chunks


def join(items):
    return "".join(items)


async def timed_source(events: list, gaps: list[float], log: list):
    try:
        for i, gap in enumerate(gaps):
            await asyncio.sleep(gap)
            events.append(("produced", i, asyncio.get_running_loop().time()))
            yield str(i)
    finally:
        log.append("source closed")


def test_a_lone_item_goes_out_at_once_without_waiting_for_the_next():
    async def main():
        events, log = [], []
        loop = asyncio.get_running_loop()
        got = []
        # One item, then a long pause before the next: the first must not wait for it.
        async for item in coalesced(timed_source(events, [0.0, 0.3], log), join):
            got.append((item, loop.time()))
        return events, got

    events, got = asyncio.run(main())
    assert [item for item, _ in got] == ["0", "1"]
    produced_0 = events[0][2]
    assert got[0][1] - produced_0 < 0.05  # delivered while the source still slept 0.3 s


def test_items_ready_while_the_reader_is_busy_come_as_one_in_order():
    async def main():
        events, log = [], []
        got = []
        async for item in coalesced(timed_source(events, [0.0] + [0.001] * 9, log), join):
            got.append(item)
            await asyncio.sleep(0.03)  # a slow reader: the source runs ahead
        return got, log

    got, log = asyncio.run(main())
    assert "".join(got) == "0123456789"  # order kept, nothing lost or repeated
    assert len(got) < 10  # some items were merged
    assert log == ["source closed"]


def test_a_reader_that_leaves_closes_the_source_at_once():
    async def main():
        events, log = [], []
        stream = coalesced(timed_source(events, [0.0] + [0.01] * 1000, log), join)
        assert await anext(stream) == "0"
        await stream.aclose()
        produced = len(events)
        await asyncio.sleep(0.1)
        return produced, len(events), log, [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]

    produced, later, log, leftover = asyncio.run(main())
    assert log == ["source closed"]
    assert later == produced  # nothing read after the reader left
    assert leftover == []  # no reading task left behind


def test_cancelling_the_reader_task_stops_the_source():
    async def main():
        events, log = [], []

        async def consume():
            async for _ in coalesced(timed_source(events, [0.01] * 1000, log), join):
                pass

        task = asyncio.ensure_future(consume())
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        produced = len(events)
        await asyncio.sleep(0.05)
        return produced, len(events), log

    produced, later, log = asyncio.run(main())
    assert log == ["source closed"] and later == produced


def test_an_error_arrives_after_the_items_before_it():
    async def failing():
        yield "a"
        yield "b"
        raise RuntimeError("engine died")

    async def main():
        got = []
        with pytest.raises(RuntimeError, match="engine died"):
            async for item in coalesced(failing(), join):
                got.append(item)
        return got

    assert "".join(asyncio.run(main())) == "ab"


def test_token_chunks_merge_keeps_ids_logprobs_and_the_last_totals():
    a = TokenChunk("He", (1,), None, 5, 1)
    b = TokenChunk("llo", (2, 3), "stop", 5, 3)
    merged = merge_chunks([a, b])
    assert merged == TokenChunk("Hello", (1, 2, 3), "stop", 5, 3)
