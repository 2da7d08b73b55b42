"""Follow one vLLM engine's KV-event stream (ZMQ) into the PrefixIndex.

vLLM's ZmqEventPublisher (kv_events_config, publisher "zmq") binds a PUB socket and sends
multipart messages (topic, seq as 8 bytes big-endian, msgpack KVEventBatch), and a ROUTER
replay socket that resends buffered batches from a given seq. One `KVEventSubscriber` per
worker runs a daemon thread:

- joining (as the thread starts, and again at the first message if the publisher's buffer was
  empty or did not answer): drop whatever the index holds for this worker (a previous gateway
  may have left entries in Redis) and apply its replay from seq 0, so blocks stored before we
  joined are known too, even when the engine publishes nothing more for a while;
- a sequence gap: ask for a replay of the missing batches; when the publisher's buffer no
  longer has them (or it does not answer), reset the worker's entries and carry on;
- the index unreachable (Redis down): skip, remember the worker is stale, and reset its
  entries once the index answers again, so the index never holds a worker's old blocks as
  if they were current;
- a malformed frame (wrong parts, not msgpack, not a KVEventBatch): counted ("malformed")
  and skipped; the events it held are lost, so the worker's entries are rebuilt ("rebuild"):
  dropped, then refilled from the publisher's replay buffer. No frame ends the thread; if
  anything else does, `alive` turns false and the KVRouter starts a new subscriber.

Lifecycle: `start()` once, `stop()` once or more (idempotent, joins the thread).
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Iterable, Optional

import msgspec
import zmq

from cluster.hashing import external_hash
from router.prefix_index import AllBlocksCleared, BlockRemoved, BlockStored, IndexUnavailable, KVEvent, PrefixIndex

log = logging.getLogger(__name__)

_END_SEQ = -1
POLL_MS = 200
REPLAY_TIMEOUT_MS = 1000


class MalformedFrame(ValueError):
    """A KV-event message that is not vLLM's wire format."""


def parse_frames(frames: list[bytes]) -> tuple[int, bytes]:
    """(seq, payload) of a publisher message (topic, 8-byte seq, payload)."""
    if len(frames) != 3 or len(frames[1]) != 8:
        raise MalformedFrame(f"{len(frames)} parts, expected topic, an 8-byte seq and a payload")
    return int.from_bytes(frames[1], "big", signed=True), frames[2]


def decode_batch(worker: str, payload: bytes) -> list[KVEvent]:
    """Like `_decode_batch`, with every way a payload can be wrong as one MalformedFrame."""
    try:
        return _decode_batch(worker, payload)
    except (msgspec.DecodeError, TypeError, KeyError, IndexError, AttributeError, ValueError) as exc:
        raise MalformedFrame(f"not a KVEventBatch: {type(exc).__name__}: {exc}") from None


def _decode_batch(worker: str, payload: bytes) -> list[KVEvent]:
    """A msgpack KVEventBatch ([ts, [event...], dp_rank]) as index events for `worker`."""
    batch = msgspec.msgpack.decode(payload)
    events: list[KVEvent] = []
    for raw in batch[1]:
        kind = raw.get("type")
        if kind == "BlockStored":
            events.append(BlockStored(worker, tuple(external_hash(h) for h in raw["block_hashes"])))
        elif kind == "BlockRemoved":
            events.append(BlockRemoved(worker, tuple(external_hash(h) for h in raw["block_hashes"])))
        elif kind == "AllBlocksCleared":
            events.append(AllBlocksCleared(worker))
    return events


class KVEventSubscriber:
    def __init__(self, worker: str, endpoint: str, replay_endpoint: Optional[str], index: PrefixIndex,
                 on_event: Callable[[str], None] = lambda kind: None):
        self.worker = worker
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self._index = index
        self._on_event = on_event  # metrics hook: "batch", "gap", "replayed", "reset", "index_down"
        self._next_seq: Optional[int] = None
        self._stale = True  # until the first successful reset
        self._stop = threading.Event()
        self._ctx = zmq.Context.instance()
        self._thread = threading.Thread(target=self._run, name=f"kv-events-{worker}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def crashed(self) -> bool:
        """The thread was started and has ended without stop(): nobody follows the worker."""
        return self._thread.ident is not None and not self._thread.is_alive() and not self._stop.is_set()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2)

    def _run(self) -> None:
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(self.endpoint)
        try:
            # What the SUB socket gets meanwhile queues; the seq logic skips what this applied.
            self._catch_up()
            while not self._stop.is_set():
                if not sub.poll(POLL_MS):
                    continue
                frames = sub.recv_multipart()
                try:
                    seq, payload = parse_frames(frames)
                except MalformedFrame as exc:
                    self._malformed(exc)
                    continue
                self._handle(seq, payload)
        except Exception:  # never let one bad stream kill the gateway; the KVRouter restarts us
            log.exception("KV event subscriber for %s stopped", self.worker)
        finally:
            sub.close()

    def _handle(self, seq: int, payload: bytes) -> None:
        try:
            events = decode_batch(self.worker, payload)
        except MalformedFrame as exc:
            self._malformed(exc)  # and its seq is not to be trusted either: no gap logic on it
            return
        if self._next_seq is None:  # joined the stream: start clean, fetch what came before
            self._reset()
            self._next_seq = 0
        if seq > self._next_seq:
            self._on_event("gap")
            if not self._replay(self._next_seq, seq):
                self._on_event("reset")
                self._reset()
            self._next_seq = seq
        if seq < self._next_seq:
            return  # already applied (replay overlap)
        self._apply(events)
        self._next_seq = seq + 1

    def _malformed(self, exc: Exception) -> None:
        log.warning("KV events of %s: malformed frame (%s); rebuilding its entries", self.worker, exc)
        self._on_event("malformed")
        self._rebuild()

    def _rebuild(self) -> None:
        """The worker's entries missed a batch: drop them and apply what the publisher still
        buffers, which also says where the stream is (the bad frame's seq is not trusted).
        Sound: a block stored and not removed within the buffer's window is cached; blocks
        stored before it are missed, which costs hits, never gives a false one. A malformed
        batch in the buffer starts the entries over after it."""
        self._on_event("rebuild")
        self._catch_up()

    def _catch_up(self) -> None:
        """Start the worker's entries over from what the publisher still buffers."""
        self._reset()
        batches = self._fetch(0) or []
        for _seq, payload in batches:
            try:
                events = decode_batch(self.worker, payload)
            except MalformedFrame:
                self._on_event("malformed")
                self._reset()
                continue
            self._apply(events)
        # Carry on after the buffer; with nothing buffered (or no answer), rejoin at the next batch.
        self._next_seq = batches[-1][0] + 1 if batches else None

    def _fetch(self, start: int) -> Optional[list[tuple[int, bytes]]]:
        """The publisher's buffered batches from `start` on, in order; None when it does not
        answer in time (or there is no replay endpoint). Malformed replay frames are skipped."""
        if not self.replay_endpoint:
            return None
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(self.replay_endpoint)
            sock.send_multipart((b"", start.to_bytes(8, "big")))
            batches: list[tuple[int, bytes]] = []
            while sock.poll(REPLAY_TIMEOUT_MS):
                frames = sock.recv_multipart()
                try:
                    seq, payload = parse_frames(frames[1:])  # after the DEALER's empty delimiter
                except MalformedFrame:
                    self._on_event("malformed")
                    continue
                if seq == _END_SEQ:
                    return batches
                batches.append((seq, payload))
            return None  # no answer in time
        finally:
            sock.close()

    def _replay(self, start: int, until: int) -> bool:
        """Apply batches [start, until) from the publisher's buffer; False if it cannot."""
        fetched = self._fetch(start)
        if fetched is None:
            return False
        batches = [b for b in fetched if b[0] < until]
        if start < until and (not batches or batches[0][0] != start):
            return False  # the buffer no longer reaches back to `start`
        try:
            decoded = [decode_batch(self.worker, payload) for _seq, payload in batches]
        except MalformedFrame:
            self._on_event("malformed")
            return False  # a batch of the gap is unreadable: the caller resets
        for events in decoded:
            self._apply(events)
        self._on_event("replayed")
        return True

    def _reset(self) -> None:
        try:
            self._index.remove_worker(self.worker)
            self._stale = False
        except IndexUnavailable:
            self._stale = True

    def _apply(self, events: Iterable[KVEvent]) -> None:
        if self._stale:
            self._reset()
            if self._stale:
                self._on_event("index_down")
                return
        try:
            self._index.apply(events)
            self._on_event("batch")
        except IndexUnavailable:
            self._stale = True
            self._on_event("index_down")


