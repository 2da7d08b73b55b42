"""The decode replica's outboxes (cluster/engine/outbox.py) and the gateway's channels
(router/pd/channels.py), stepped without Ray: a fake subscription reads the replica's outbox
directly, a fake run call stands for the request's own Serve call."""

from __future__ import annotations

import asyncio

import pytest

from cluster.engine.outbox import END, Failed, Outboxes, Window
from router.pd.channels import ChannelLost, DecodeChannels


def merge(outputs):
    return "+".join(outputs)


class FakeRun:
    """A run call: yields the worker id, then waits until ended (or raises)."""

    def __init__(self, worker_id: str):
        self.worker_id = worker_id
        self.done = asyncio.Event()
        self.error = None
        self.cancelled = False
        self._first = True

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self._first:
            self._first = False
            return self.worker_id
        await self.done.wait()
        if self.error is not None:
            raise self.error
        raise StopAsyncIteration

    def cancel(self):
        self.cancelled = True
        self.done.set()


async def run_on_replica(boxes: Outboxes, gateway: str, request_id: str, outputs, *, error=None):
    """What DecodeWorker.run does with an engine stream."""
    box = boxes.open(gateway)
    box.start(request_id)
    for output in outputs:
        box.put(request_id, output)
        await asyncio.sleep(0)
    box.end(request_id, error)


def test_outbox_batches_merge_per_request_and_end_after_outputs():
    async def main():
        boxes = Outboxes(merge)
        box = boxes.open("gw")

        async def request(rid, outs):
            box.start(rid)
            for out in outs:
                box.put(rid, out)
            box.end(rid)

        await asyncio.gather(request("a", ["a1", "a2"]), request("b", ["b1"]))
        batch = box.take()
        assert batch == [("a", "a1+a2"), ("b", "b1"), ("a", END), ("b", END)]
        assert box.take() == [] and box.idle
        boxes.reap()
        assert len(boxes) == 0  # leak check

    asyncio.run(main())


def test_channels_read_across_windows_in_order_and_a_failed_next_call_costs_nothing():
    """The gateway's side: each window's end opens the next call, the stream reads every output
    in order across calls; a next call that fails (Serve cannot route to a draining replica) is
    dropped and the current call goes on after the replica's ack timeout."""

    async def main():
        boxes = Outboxes(merge, idle_close_s=0.05, window=Window(least=2, most=4), ack_timeout_s=0.05)
        calls = []

        async def refused(worker_id):
            raise RuntimeError("not routable")
            yield  # an async generator, as Hops._subscription

        def subscribe(worker_id):
            calls.append(worker_id)
            if 3 <= len(calls) <= 4:  # the third and fourth calls fail
                return refused(worker_id)
            return boxes.subscribe("gw")

        channels = DecodeChannels(subscribe)
        run = FakeRun("w1")
        outs = [f"t{i}" for i in range(40)]
        replica = []

        async def engine_steps(stream_id):  # an output every few ms: many windows
            box = boxes.open("gw")
            box.start(stream_id)
            for output in outs:
                box.put(stream_id, output)
                await asyncio.sleep(0.003)
            box.end(stream_id)

        def call_run(stream_id):
            replica.append(asyncio.ensure_future(engine_steps(stream_id)))
            return run

        got = [o async for o in channels.stream(call_run)]
        await replica[0]
        run.done.set()
        assert "+".join(got) == "+".join(outs)  # every output, once, in order, merged or not
        assert len(calls) >= 5 and set(calls) == {"w1"}  # windows ended, failed next calls were dropped
        for _ in range(50):
            if len(channels) == 0 and len(boxes) == 0:
                break
            await asyncio.sleep(0.01)
        assert len(channels) == 0 and len(boxes) == 0 and channels.streams == 0  # leak check

    asyncio.run(main())


def test_subscription_ends_when_idle_and_outbox_is_dropped():
    async def main():
        boxes = Outboxes(merge, idle_close_s=0.05)
        task = asyncio.ensure_future(run_on_replica(boxes, "gw", "r1", ["x", "y"]))
        batches = [batch async for batch in boxes.subscribe("gw")]
        await task
        items = [item for batch in batches for item in batch]
        assert "+".join(o for _, o in items if o is not END) == "x+y"  # in order, merged or not
        assert items[-1] == ("r1", END)
        assert len(boxes) == 0

    asyncio.run(main())


def test_orphaned_outbox_cancels_its_requests():
    async def main():
        boxes = Outboxes(merge, orphan_s=10.0)
        box = boxes.open("gone-gateway")
        started = asyncio.Event()

        async def forever():
            box.start("r")
            started.set()
            try:
                await asyncio.sleep(3600)
            finally:
                box.end("r")

        task = asyncio.ensure_future(forever())
        await started.wait()
        boxes.reap(now=box.last_seen + 5)
        assert not task.cancelled()
        boxes.reap(now=box.last_seen + 11)
        with pytest.raises(asyncio.CancelledError):
            await task
        box.take()
        boxes.reap()
        assert len(boxes) == 0

    asyncio.run(main())


def test_channels_deal_outputs_to_each_request_and_close_when_idle():
    async def main():
        boxes = Outboxes(merge, idle_close_s=0.05)
        subscriptions = []

        def subscribe(worker_id):
            subscriptions.append(worker_id)
            return boxes.subscribe("gw")

        channels = DecodeChannels(subscribe)

        async def request(rid, outs):
            run = FakeRun("w1")
            replica = []

            def call_run(stream_id):
                replica.append(asyncio.ensure_future(run_on_replica(boxes, "gw", stream_id, outs)))
                return run

            got = [o async for o in channels.stream(call_run)]
            await replica[0]
            run.done.set()
            return "+".join(got)

        a, b = await asyncio.gather(request("a", ["a1", "a2", "a3"]), request("b", ["b1"]))
        assert a == "a1+a2+a3" and b == "b1"
        assert set(subscriptions) == {"w1"}  # one channel, to the one replica, carried both requests
        for _ in range(50):
            if len(channels) == 0 and len(boxes) == 0:
                break
            await asyncio.sleep(0.01)
        assert len(channels) == 0 and len(boxes) == 0  # leak check: both ends closed once idle
        assert channels.streams == 0

    asyncio.run(main())


def test_engine_error_reaches_the_request_and_run_error_too():
    async def main():
        boxes = Outboxes(merge, idle_close_s=0.05)
        channels = DecodeChannels(lambda worker_id: boxes.subscribe("gw"))
        run = FakeRun("w1")
        replica = []

        def call_run(stream_id):
            replica.append(asyncio.ensure_future(
                run_on_replica(boxes, "gw", stream_id, ["a1"], error=ValueError("engine says no"))))
            return run

        got = []
        with pytest.raises(ValueError, match="engine says no"):
            async for o in channels.stream(call_run):
                got.append(o)
        await replica[0]
        assert got == ["a1"] and run.cancelled

        # The run call itself fails (the replica died): its error ends the stream.
        run2 = FakeRun("w1")
        run2.error = RuntimeError("actor died")
        started = []

        def call_run2(stream_id):
            boxes.open("gw").start(stream_id)
            started.append(stream_id)
            return run2

        async def die():
            await asyncio.sleep(0.01)
            run2.done.set()

        asyncio.ensure_future(die())
        with pytest.raises(RuntimeError, match="actor died"):
            async for _ in channels.stream(call_run2):
                pass
        boxes.open("gw").end(started[0])
        await channels.close()
        assert channels.streams == 0  # leak check

    asyncio.run(main())


def test_a_failed_subscription_ends_its_requests_with_channel_lost():
    async def main():
        async def broken(worker_id):
            raise ConnectionError("replica gone")
            yield  # pragma: no cover

        channels = DecodeChannels(broken)
        run = FakeRun("w1")
        with pytest.raises(ChannelLost, match="replica gone"):
            async for _ in channels.stream(lambda stream_id: run):
                pass
        assert run.cancelled and len(channels) == 0 and channels.streams == 0

    asyncio.run(main())


def test_failed_pickles_with_its_error():
    import pickle

    restored = pickle.loads(pickle.dumps(Failed(ValueError("x"))))
    assert isinstance(restored.error, ValueError) and str(restored.error) == "x"


def test_outputs_that_come_before_the_run_calls_first_item_are_kept():
    """On a channel already open, the replica's outputs for a new stream may arrive before the
    run call's first item (the worker id) reaches the gateway: none may be lost."""
    async def main():
        boxes = Outboxes(merge, idle_close_s=0.2)
        channels = DecodeChannels(lambda worker_id: boxes.subscribe("gw"))
        keep_open = FakeRun("w1")
        opener = []

        def call_opener(stream_id):
            boxes.open("gw").start(stream_id)  # a long request keeps the channel open
            opener.append(stream_id)
            return keep_open

        first = channels.stream(call_opener).__aiter__()
        reading = asyncio.ensure_future(first.__anext__())
        await asyncio.sleep(0.02)  # the channel is open now

        class LateRun(FakeRun):
            async def __anext__(self):
                if self._first:
                    await asyncio.sleep(0.05)  # the worker id arrives after the outputs
                return await super().__anext__()

        late = LateRun("w1")

        def call_late(stream_id):
            asyncio.ensure_future(run_on_replica(boxes, "gw", stream_id, ["b1", "b2", "b3"]))
            return late

        got = [o async for o in channels.stream(call_late)]
        assert "+".join(got) == "b1+b2+b3"
        late.done.set()
        boxes.open("gw").put(opener[0], "o1")
        boxes.open("gw").end(opener[0])
        assert await reading == "o1"
        with pytest.raises(StopAsyncIteration):
            await first.__anext__()
        keep_open.done.set()
        await channels.close()
        assert channels.streams == 0

    asyncio.run(main())
