"""Follow one vLLM engine's KV-event stream (ZMQ) into the PrefixIndex.

vLLM's ZmqEventPublisher (kv_events_config, publisher "zmq") binds a PUB socket and sends
multipart messages (topic, seq as 8 bytes big-endian, msgpack KVEventBatch), and a ROUTER
replay socket that resends buffered batches from a given seq. One `KVEventSubscriber` per
worker runs a daemon thread:

- first message: drop whatever the index holds for this worker (a previous gateway may have
  left entries in Redis) and ask for a replay from seq 0, so blocks stored before we joined
  are known too;
- a sequence gap: ask for a replay of the missing batches; when the publisher's buffer no
  longer has them (or it does not answer), reset the worker's entries and carry on;
- the index unreachable (Redis down): skip, remember the worker is stale, and reset its
  entries once the index answers again, so the index never holds a worker's old blocks as
  if they were current.

Lifecycle: `start()` once, `stop()` once or more (idempotent, joins the thread).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Iterable, Optional

import msgspec
import zmq

from router.hashing import external_hash
from router.prefix_index import AllBlocksCleared, BlockRemoved, BlockStored, IndexUnavailable, KVEvent, PrefixIndex

log = logging.getLogger(__name__)

_END_SEQ = -1
POLL_MS = 200
REPLAY_TIMEOUT_MS = 1000


def decode_batch(worker: str, payload: bytes) -> list[KVEvent]:
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
            while not self._stop.is_set():
                if not sub.poll(POLL_MS):
                    continue
                _topic, seq_bytes, payload = sub.recv_multipart()
                self._handle(int.from_bytes(seq_bytes, "big", signed=True), payload)
        except Exception:  # never let one bad stream kill the gateway; its entries go stale
            log.exception("KV event subscriber for %s stopped", self.worker)
        finally:
            sub.close()

    def _handle(self, seq: int, payload: bytes) -> None:
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
        self._apply(decode_batch(self.worker, payload))
        self._next_seq = seq + 1

    def _replay(self, start: int, until: int) -> bool:
        """Apply batches [start, until) from the publisher's buffer; False if it cannot."""
        if not self.replay_endpoint:
            return False
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(self.replay_endpoint)
            sock.send_multipart((b"", start.to_bytes(8, "big")))
            batches: list[tuple[int, bytes]] = []
            while sock.poll(REPLAY_TIMEOUT_MS):
                _empty, _topic, seq_bytes, payload = sock.recv_multipart()
                seq = int.from_bytes(seq_bytes, "big", signed=True)
                if seq == _END_SEQ:
                    break
                if seq < until:
                    batches.append((seq, payload))
            else:
                return False  # no answer in time
        finally:
            sock.close()
        if start < until and (not batches or batches[0][0] != start):
            return False  # the buffer no longer reaches back to `start`
        for _seq, payload in batches:
            self._apply(decode_batch(self.worker, payload))
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


