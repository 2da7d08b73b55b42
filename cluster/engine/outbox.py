"""Many streams, one Ray stream: a decode replica's outputs for one gateway, sent per step.

Why: a Ray streaming item costs both processes a fixed ~0.2-0.4 ms of CPU (serialize, report,
ack, a thread hop each side), whatever it carries. One item per token per request made the
relay, not the engine, the limit at GPU token rates (issue 27). vLLM's own engine core sends
its frontend one message per step for all requests; this does the same across Ray: every
request a gateway runs on this replica puts its outputs in that gateway's `Outbox`, and one
long-lived streaming call per (gateway, replica), `subscribe`, takes everything there each
time it asks, as one item. Nothing waits for a later output: a lone token goes alone.

Lifecycle of one request (decode_workers/deployment.py `run`, a Serve streaming call of its
own, so Serve's queue bounds, pinning, cancellation and ongoing-request counts still hold per
request): `Outboxes.open(gateway)` → `outbox.start(stream_id)` → `outbox.put(stream_id,
output)` per engine output → `outbox.end(stream_id)` once. The stream id is the gateway's name
for this one call (a retried request gets a new one). The gateway reads `(stream_id, output)`
pairs; an `END` output ends that stream, a `Failed` one raises its error there.

Lifecycle of a subscription: the gateway calls `subscribe(gateway)` when it first needs this
replica; it yields batches until the outbox has been idle (no request running, nothing
buffered) for `idle_close_s`, then ends, so a replica Serve drains is not held by it; the
gateway opens a new one on its next request. An outbox whose gateway has not subscribed for
`orphan_s` while requests run there is orphaned (the gateway died): its requests are
cancelled and it is dropped (`Outboxes.reap`).

The window: Serve reads a replica's generator as fast as it yields and queues the items
towards the caller, so a gateway that fell behind (its event loop saturated) never made the
outbox wait: every step went out as its own item, the queue grew (measured: 2-10 s behind at
128 streams x 20 ms on a 2-core VM), and a request joining the channel got its second token
seconds after its first. So a call carries a window of batches. Halfway through, a batch
carries `NEXT_CALL`: the gateway, having read that far, opens its next call (the
acknowledgement), which takes the outbox over when it arrives (the current call ends; what it
had not yet taken goes out on the new one). A gateway that keeps up acknowledges before the
window is used, and its streams never wait for it. A call that has used its window pauses until
the next call comes; what comes meanwhile waits here, merged per request, so a gateway behind
gets fewer, fuller items (several tokens per stream), as vLLM's output collector merges for a
slow reader. A call costs both sides a Serve request (several ms of CPU), so the window adapts
(`Window.next`): halved after a call that had to pause, doubled after one whose next call came
in time; a channel starts at the widest. A paused call waits as long as the gateway still
sends this replica new requests (it is behind, and its next call will come); one whose next
call has not come within `ack_timeout_s` with no new request either (a draining replica:
Serve routes it neither) sends on without pausing again, still asking, so a drain costs at
most one pause (plus one per straggling request), not the requests.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Optional, Sequence

class _Marker:
    """A singleton item of this module that unpickles as itself (pickle finds it by its global
    name here), so the gateway compares it with `is` after Ray carried it."""

    def __init__(self, name: str):
        self._name = name

    def __reduce__(self):
        return self._name

    def __repr__(self) -> str:
        return self._name


END = _Marker("END")  # the output that ends one request's stream on the gateway
NEXT_CALL = _Marker("NEXT_CALL")  # the item that asks the gateway for its next call
NEXT_CALL_ITEM = ("", NEXT_CALL)  # no stream has the empty id (the gateway names streams by uuid)


class Failed:
    """The output that ends one request's stream with the engine's error (raised on the gateway)."""

    def __init__(self, error: BaseException):
        self.error = error

    def __reduce__(self):
        return (Failed, (self.error,))

Merge = Callable[[Sequence[Any]], Any]


@dataclass(frozen=True)
class Window:
    """How many batches one subscription call may carry (see the module docstring)."""

    least: int = 2  # ask after the first batch, pause after the second
    most: int = 64  # ~1 s of steps at a GPU's pace: the calls cost nothing then

    def next(self, current: int, paused: bool) -> int:
        """`paused`: the last call used its window before the next one came (the gateway read
        the ask late: it is behind, or the call's round trip is longer than half a window)."""
        return max(self.least, current // 2) if paused else min(self.most, current * 2)


class WrongReplica(RuntimeError):
    """A subscription that Serve routed to another replica than the one named (it was full or gone)."""


class Outbox:
    def __init__(self, gateway: str, merge: Merge):
        self.gateway = gateway
        self._merge = merge
        self._buffer: list[tuple[str, Any]] = []
        self._ready = asyncio.Event()
        self.running: dict[str, asyncio.Task] = {}  # stream id → the task running it here
        self.subscribed = False
        self.last_seen = time.monotonic()  # last time a subscriber was attached, or a request began
        self.per_call = 0  # the window of the last subscription call (0: none yet)
        self.paused = False  # the last call used its window before the next call came
        self.starts = 0  # requests begun here: while they come, the gateway can reach this replica
        self._handover = asyncio.Event()  # a newer call wants the outbox
        self._released = asyncio.Event()  # no call holds it
        self._released.set()

    def start(self, stream_id: str) -> None:
        task = asyncio.current_task()
        assert task is not None, "Outbox.start runs inside the request's task"
        self.running[stream_id] = task
        self.starts += 1
        self.last_seen = time.monotonic()

    def put(self, stream_id: str, output: Any) -> None:
        self._buffer.append((stream_id, output))
        self._ready.set()

    def end(self, stream_id: str, error: Optional[BaseException] = None) -> None:
        """The request is over on this replica: its END (finished or cancelled) or its error
        goes out after its outputs, so the gateway's reader stops, or raises it."""
        if self.running.pop(stream_id, None) is not None:
            self.put(stream_id, END if error is None else Failed(error))

    def take(self) -> list[tuple[str, Any]]:
        """Everything buffered, one entry per stream in first-seen order, its outputs merged
        (an END stays apart, after them)."""
        items, self._buffer = self._buffer, []
        self._ready.clear()
        outputs: dict[str, list[Any]] = {}
        ended: list[tuple[str, Any]] = []
        for stream_id, output in items:
            if output is END or isinstance(output, Failed):
                ended.append((stream_id, output))
            else:
                outputs.setdefault(stream_id, []).append(output)
        batch = [(rid, outs[0] if len(outs) == 1 else self._merge(outs)) for rid, outs in outputs.items()]
        return batch + ended

    async def batches(self, idle_close_s: float, window: Window,
                      ack_timeout_s: float) -> AsyncIterator[list[tuple[str, Any]]]:
        """What one subscription call reads: every batch as soon as there is one, the one halfway
        through each window asking for the next call; ends once idle, or when the next call
        takes over (`hand_over`)."""
        self.subscribed = True
        self._released.clear()
        self._handover.clear()
        self.per_call = window.most if not self.per_call else window.next(self.per_call, self.paused)
        self.paused = False
        ask_at = self.per_call // 2  # halfway: the next call comes before the window is used
        pause = True
        try:
            sent = 0
            while not self._handover.is_set():
                if pause and sent and sent % self.per_call == 0:
                    self.paused = True
                    if await self._next_call_came(ack_timeout_s):
                        return
                    pause = False  # no next call comes (a drain): send on, still asking
                if not self._buffer:
                    try:
                        await asyncio.wait_for(self._ready.wait(), idle_close_s)
                    except asyncio.TimeoutError:
                        if not self.running and not self._buffer:
                            return
                        continue
                    if not self._buffer:  # woken by hand_over (or a newer call's was left set)
                        self._ready.clear()
                        continue
                batch = self.take()
                sent += 1
                if sent % self.per_call == ask_at:
                    batch.append(NEXT_CALL_ITEM)
                yield batch
        finally:
            self.subscribed = False
            self.last_seen = time.monotonic()
            self._released.set()

    async def _next_call_came(self, ack_timeout_s: float) -> bool:
        """Waits for the next call while the gateway may still send it: a gateway that sent
        this replica a new request in the last `ack_timeout_s` is behind, not cut off (only
        Serve stopping this replica, a drain, stops both its requests and its calls)."""
        while True:
            starts = self.starts
            try:
                await asyncio.wait_for(self._handover.wait(), ack_timeout_s)
                return True
            except asyncio.TimeoutError:
                if self.starts == starts:
                    return False

    async def hand_over(self) -> None:
        """A new call for this gateway takes the outbox: the current call ends (at once when
        paused at its window's end), and this returns once it has."""
        while self.subscribed:
            self._handover.set()
            self._ready.set()  # wakes a call waiting for outputs
            await self._released.wait()

    def cancel_all(self) -> None:
        for task in list(self.running.values()):
            task.cancel()

    @property
    def idle(self) -> bool:
        return not self.running and not self._buffer and not self.subscribed


class Outboxes:
    """A replica's outboxes, one per gateway that runs requests here."""

    def __init__(self, merge: Merge, *, idle_close_s: float = 2.0, orphan_s: float = 30.0,
                 window: Window = Window(), ack_timeout_s: float = 0.5):
        self._merge = merge
        self.idle_close_s = idle_close_s
        self.window = window
        self.ack_timeout_s = ack_timeout_s
        self.orphan_s = orphan_s
        self._boxes: dict[str, Outbox] = {}

    def open(self, gateway: str) -> Outbox:
        box = self._boxes.get(gateway)
        if box is None:
            box = self._boxes[gateway] = Outbox(gateway, self._merge)
        return box

    async def subscribe(self, gateway: str) -> AsyncIterator[list[tuple[str, Any]]]:
        box = self.open(gateway)
        await box.hand_over()  # a gateway's call after a window's end, or after its last call died
        try:
            async for batch in box.batches(self.idle_close_s, self.window, self.ack_timeout_s):
                yield batch
        finally:
            self.reap()

    def reap(self, now: Optional[float] = None) -> None:
        """Drop idle outboxes; cancel the requests of those whose gateway is gone."""
        now = time.monotonic() if now is None else now
        for gateway, box in list(self._boxes.items()):
            if box.idle:
                del self._boxes[gateway]
            elif not box.subscribed and now - box.last_seen > self.orphan_s:
                box.cancel_all()

    def __len__(self) -> int:
        return len(self._boxes)
