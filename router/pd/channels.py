"""The gateway's end of the decode replicas' outboxes (cluster/engine/outbox.py): one
subscription per decode replica carries the outputs of all of this gateway's requests there,
one Ray item per engine step; here they are dealt out to each request's stream.

Lifecycle of one request (`stream`): it gets a stream id of its own and a queue under it
first; then its `run` call on the decode replica (made with that id, pinned and bounded by
Serve as any call) yields the replica's worker id, and the stream joins that replica's
channel, opening it if needed. It reads its outputs until END (or the engine's error, or the
channel's loss). Outputs may arrive on an open channel before the run call's first item: the
queue is there first, so none is lost. The run call is watched meanwhile: its error ends the
stream with that error. Leaving early (the client hung up) cancels the run call, which
aborts the request on the replica.

Lifecycle of a channel: opened by the first request for its replica. When a batch asks for the
next call (`NEXT_CALL`, the replica's credit window: cluster/engine/outbox.py), the channel opens
it at once and reads on; the replica ends the current call when the next one arrives, and the
channel then reads the next one (a next call that fails is dropped: the current one goes on). A
subscription also ends when the replica finds the outbox idle, and the channel closes with it
unless a request still waits (then it subscribes again: the outputs buffered meanwhile come
first). A subscription that
fails ends every request waiting on it with `ChannelLost` (the replica died, or Serve routed the
subscription elsewhere): before a first token the P/D path retries it like any decode failure.

Pure asyncio: the caller gives the subscription as a function (worker id → async iterator of
batches), so unit tests drive it without Ray.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from typing import Any, AsyncIterator, Awaitable, Callable, Optional

from cluster.engine.outbox import END, NEXT_CALL, Failed

log = logging.getLogger(__name__)

Batch = list[tuple[str, Any]]
Subscribe = Callable[[str], AsyncIterator[Batch]]


class ChannelLost(RuntimeError):
    """The subscription to a decode replica failed with requests still reading from it."""


class _Channel:
    def __init__(self, worker_id: str, sinks: dict[str, asyncio.Queue], subscribe: Subscribe,
                 on_close: Callable[["_Channel"], None]):
        self.worker_id = worker_id
        self.members: set[str] = set()  # streams known to run on this replica
        self._sinks = sinks  # every stream of this gateway's tier: outputs may come before membership
        self._subscribe = subscribe
        self._on_close = on_close
        self.task = asyncio.ensure_future(self._pump())

    async def _pump(self) -> None:
        calls = self._subscribe(self.worker_id)
        following: Optional[_NextCall] = None  # opened when the replica asked, while `calls` still runs
        try:
            while True:
                batch = await _batch_or_none(calls.__anext__())
                if batch is None and following is not None and not following.failed():
                    # The replica ended this call because the next one took over: read that one.
                    calls, first, following = following.calls, following.first, None
                    batch = await _batch_or_none(first)
                if batch is None:
                    if not self.members:  # the replica closed an idle subscription: so do we
                        return
                    calls, following = self._subscribe(self.worker_id), None
                    continue
                for stream_id, output in batch:
                    if output is NEXT_CALL:
                        # Read that far: the next call acknowledges it (cluster/engine/outbox.py).
                        # One that failed (a draining replica is out of Serve's routing) is
                        # dropped: the replica sends on in this call after its ack timeout.
                        if following is None or following.failed():
                            following = _NextCall(self._subscribe(self.worker_id))
                        continue
                    sink = self._sinks.get(stream_id)
                    if sink is not None:  # else: its reader left (a cancelled request's tail)
                        sink.put_nowait(output)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            lost = ChannelLost(f"the stream from decode replica {self.worker_id} failed: {type(exc).__name__}: {exc}")
            for stream_id in self.members:
                sink = self._sinks.get(stream_id)
                if sink is not None:
                    sink.put_nowait(Failed(lost))
            log.warning("%s (%d requests on it)", lost, len(self.members))
        finally:
            if following is not None:
                following.first.cancel()
            self._on_close(self)


class _NextCall:
    """A subscription call opened before the current one ended; its first batch, awaited in
    the background, comes once the replica has ended the current one."""

    def __init__(self, calls: AsyncIterator[Batch]):
        self.calls = calls
        self.first = asyncio.ensure_future(calls.__anext__())

    def failed(self) -> bool:
        if not self.first.done() or self.first.cancelled():
            return False
        error = self.first.exception()  # retrieved here: a failed next call is dropped, not raised
        if error is not None and not isinstance(error, StopAsyncIteration):
            log.debug("the next subscription to a decode replica failed: %r", error)
            return True
        return False


async def _batch_or_none(next_batch: Awaitable[Batch]) -> Optional[Batch]:
    """A call's next batch; None once the call has ended."""
    try:
        return await next_batch
    except StopAsyncIteration:
        return None


class DecodeChannels:
    def __init__(self, subscribe: Subscribe):
        self._subscribe = subscribe
        self._channels: dict[str, _Channel] = {}
        # stream id → its reader's queue, from before its run call is made: the replica may send
        # outputs on a channel already open before the run call's first item names the replica.
        self._sinks: dict[str, asyncio.Queue] = {}

    def _join(self, worker_id: str, stream_id: str) -> _Channel:
        channel = self._channels.get(worker_id)
        if channel is None or channel.task.done():
            channel = self._channels[worker_id] = _Channel(worker_id, self._sinks, self._subscribe, self._closed)
        channel.members.add(stream_id)
        return channel

    def _closed(self, channel: _Channel) -> None:
        if self._channels.get(channel.worker_id) is channel:
            del self._channels[channel.worker_id]

    def stream(self, call_run: Callable[[str], Any]) -> "ChannelStream":
        """One request's decode stream: `call_run(stream_id)` makes its run call (a Serve
        response generator: `__anext__`, `cancel`), named by a stream id of its own so that no
        other call's outputs (an earlier attempt's) ever reach it."""
        stream_id = uuid.uuid4().hex
        self._sinks[stream_id] = asyncio.Queue()
        try:
            run = call_run(stream_id)
        except BaseException:
            del self._sinks[stream_id]
            raise
        return ChannelStream(self._outputs(stream_id, run), run)

    async def _outputs(self, stream_id: str, run: Any) -> AsyncIterator[Any]:
        """The stream's outputs; the module docstring says when it ends."""
        sink = self._sinks[stream_id]
        channel = None
        watcher = None
        try:
            worker_id = await run.__anext__()
            channel = self._join(worker_id, stream_id)
            watcher = asyncio.ensure_future(_watch(run, sink))
            while True:
                output = await sink.get()
                if output is END:
                    return
                if isinstance(output, Failed):
                    raise output.error
                yield output
        finally:
            self._sinks.pop(stream_id, None)
            if channel is not None:
                channel.members.discard(stream_id)
            if watcher is not None and not watcher.done():
                watcher.cancel()
            run.cancel()  # a no-op when it ended; else the engine aborts the request

    async def close(self) -> None:
        channels = list(self._channels.values())
        for channel in channels:
            channel.task.cancel()
        for channel in channels:
            with contextlib.suppress(BaseException):
                await channel.task

    def __len__(self) -> int:
        return len(self._channels)

    @property
    def streams(self) -> int:
        return len(self._sinks)


async def _watch(run: Any, sink: asyncio.Queue) -> None:
    """The run call's own end: after its first item it yields nothing; an error it raises
    ends the request's stream with it (an END or Failed from the outbox may come first)."""
    try:
        async for _ in run:
            pass
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        sink.put_nowait(Failed(exc))


class ChannelStream:
    """One request's outputs as the P/D path reads a decode stream: iterate it, or `cancel()`
    it (the run call is cancelled; the iterator's own cleanup runs when it is closed)."""

    def __init__(self, outputs: AsyncIterator[Any], run: Any):
        self._outputs, self._run = outputs, run

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._outputs

    def cancel(self) -> None:
        self._run.cancel()
