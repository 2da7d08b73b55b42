"""cluster/coalesce.py: what is ready goes out as one item, nothing waits for a later one,
order is kept, and a reader that leaves stops the source at once."""

from __future__ import annotations

import asyncio

import pytest

from cluster.coalesce import coalesced
from cluster.protocol import finish_reason, merge_outputs, new_token_ids
from tests.support.fakes import fake_output


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


def test_outputs_merge_keeps_ids_text_and_the_last_finish_without_touching_the_inputs():
    from vllm.logprobs import Logprob

    a = fake_output("r", "He", [1], cumulative_logprob=-0.5)
    b = fake_output("r", "llo", [2, 3], "stop", cumulative_logprob=-1.5)
    a.outputs[0].logprobs = [{1: Logprob(-0.5)}]
    b.outputs[0].logprobs = [{2: Logprob(-0.25)}, {3: Logprob(-0.75)}]
    merged = merge_outputs([a, b])
    assert merged.outputs[0].text == "Hello"
    assert list(new_token_ids(merged)) == [1, 2, 3]
    assert finish_reason(merged) == "stop" and merged.finished
    assert [next(iter(lp)) for lp in merged.outputs[0].logprobs] == [1, 2, 3]
    assert merged.outputs[0].cumulative_logprob == -1.5  # the last total, as vLLM aggregates
    # The decode replica's coalescer merges outputs it also handed on: the inputs stay as they were.
    assert (a.outputs[0].text, list(a.outputs[0].token_ids), a.finished) == ("He", [1], False)
    assert len(a.outputs[0].logprobs) == 1
    assert list(b.outputs[0].token_ids) == [2, 3]
