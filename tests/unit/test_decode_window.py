"""The decode replica's credit window (cluster/engine/outbox.py, its module docstring), stepped
without Ray: a call asks for the next one halfway through its window, pauses once the window is
used, and is taken over by the next call; the markers survive pickling as themselves. The
gateway's side across calls is in test_decode_mux.py."""

from __future__ import annotations

import asyncio
import pickle

import pytest

from cluster.engine.outbox import END, NEXT_CALL, NEXT_CALL_ITEM, Outboxes, Window


def merge(outputs):
    return "+".join(outputs)


def test_the_markers_unpickle_as_themselves():
    assert pickle.loads(pickle.dumps(END)) is END
    assert pickle.loads(pickle.dumps([NEXT_CALL_ITEM]))[0][1] is NEXT_CALL


def test_window_halves_after_a_call_that_paused_and_doubles_after_one_that_did_not():
    window = Window(least=2, most=16)
    assert [window.next(n, False) for n in (2, 4, 8, 16)] == [4, 8, 16, 16]
    assert [window.next(n, True) for n in (16, 8, 3, 2)] == [8, 4, 2, 2]


def test_a_call_asks_halfway_pauses_when_its_window_is_used_and_the_next_call_takes_what_waited_merged():
    """The credit window (cluster/engine/outbox.py), step by step: halfway through its window a
    call asks for the next one; a next call that comes in time takes the outbox over with no
    pause (the window doubles); one that comes after the window is used finds the call paused
    and what came meanwhile merged per request (the window halves)."""

    async def main():
        boxes = Outboxes(merge, idle_close_s=0.05, window=Window(least=2, most=4), ack_timeout_s=30)
        box = boxes.open("gw")
        box.start("a")
        box.start("b")
        call1 = boxes.subscribe("gw")
        box.put("a", "a1")
        box.put("b", "b1")
        assert await call1.__anext__() == [("a", "a1"), ("b", "b1")]
        assert box.per_call == 4  # a channel starts at the widest window
        box.put("a", "a2")
        assert await call1.__anext__() == [("a", "a2"), NEXT_CALL_ITEM]  # halfway: asks
        box.put("a", "a3")
        assert await call1.__anext__() == [("a", "a3")]
        box.put("a", "a4")
        assert await call1.__anext__() == [("a", "a4")]  # the window is used
        paused = asyncio.ensure_future(call1.__anext__())
        for step in (5, 6, 7):
            box.put("a", f"a{step}")
            box.put("b", f"b{step}")
        await asyncio.sleep(0.02)
        assert not paused.done()  # waits for the next call, however much comes
        call2 = boxes.subscribe("gw")
        assert await call2.__anext__() == [("a", "a5+a6+a7"), ("b", "b5+b6+b7"), NEXT_CALL_ITEM]
        with pytest.raises(StopAsyncIteration):
            await paused  # the paused call ended: the new one took over
        assert box.per_call == 2  # the last call paused (the gateway read its ask late): halved, it asks at once
        sending = asyncio.ensure_future(call2.__anext__())
        call3 = boxes.subscribe("gw")  # comes before the window is used: no pause
        third = asyncio.ensure_future(call3.__anext__())
        with pytest.raises(StopAsyncIteration):
            await sending
        box.put("a", "a8")
        assert await third == [("a", "a8")]
        assert box.per_call == 4  # the last call did not pause: the gateway kept up, the window doubled
        box.end("a")
        box.end("b")
        assert await call3.__anext__() == [("a", END), ("b", END), NEXT_CALL_ITEM]
        with pytest.raises(StopAsyncIteration):
            await call3.__anext__()  # then idle: the call ends
        assert len(boxes) == 0  # leak check: the idle outbox was dropped

    asyncio.run(main())


def test_a_call_whose_next_call_never_comes_sends_on_after_the_ack_timeout():
    """A draining replica gets no new call (Serve routes none to it): the pause at the end of
    the window ends after ack_timeout_s and the call sends on, still asking, never pausing again."""

    async def main():
        boxes = Outboxes(merge, idle_close_s=0.05, window=Window(least=2, most=2), ack_timeout_s=0.05)
        box = boxes.open("gw")
        box.start("a")
        call = boxes.subscribe("gw")
        got = []
        for step in range(1, 6):
            box.put("a", f"a{step}")
            got.append(await asyncio.wait_for(call.__anext__(), 5))
        assert got == [[("a", "a1"), NEXT_CALL_ITEM], [("a", "a2")], [("a", "a3"), NEXT_CALL_ITEM], [("a", "a4")],
                       [("a", "a5"), NEXT_CALL_ITEM]]
        box.end("a")
        assert await call.__anext__() == [("a", END)]
        with pytest.raises(StopAsyncIteration):
            await call.__anext__()
        assert len(boxes) == 0

    asyncio.run(main())


def test_a_paused_call_waits_on_while_the_gateway_still_sends_requests():
    """Behind, not cut off: a gateway that still starts requests here will send its next call,
    so the pause outlasts the ack timeout; only a pause with no new request ends it."""

    async def main():
        boxes = Outboxes(merge, idle_close_s=5, window=Window(least=2, most=2), ack_timeout_s=0.05)
        box = boxes.open("gw")
        box.start("a")
        call = boxes.subscribe("gw")
        box.put("a", "a1")
        assert await call.__anext__() == [("a", "a1"), NEXT_CALL_ITEM]
        box.put("a", "a2")
        assert await call.__anext__() == [("a", "a2")]
        paused = asyncio.ensure_future(call.__anext__())
        box.put("a", "a3")
        for n in range(4):  # a new request every 30 ms: four ack timeouts' worth of pause
            await asyncio.sleep(0.03)
            box.start(f"new{n}")
        assert not paused.done()
        call2 = boxes.subscribe("gw")
        assert await call2.__anext__() == [("a", "a3"), NEXT_CALL_ITEM]  # the next call came: it takes over
        with pytest.raises(StopAsyncIteration):
            await paused
        await call2.aclose()

    asyncio.run(main())
