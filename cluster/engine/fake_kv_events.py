"""vLLM's ZMQ KV-event wire protocol without vLLM: what FakeEngine (fake.py) publishes through,
and the publisher the router's unit tests (tests/unit/test_prefix_index*.py) drive by hand.

The protocol, as vLLM 0.32's ZmqEventPublisher speaks it (router/kv_events.py reads it):
- a PUB socket sends (topic, 8-byte big-endian seq, msgpack [ts, [event...], dp_rank]), each
  event a map tagged by "type" (BlockStored, BlockRemoved, AllBlocksCleared);
- a ROUTER replay socket answers a start seq with every buffered batch from it, then an end
  marker (seq -1, empty payload).

Test hooks: `publish(..., drop=True)` skips the send but keeps the batch for replay (a gap the
subscriber can repair); `forget()` empties the replay buffer (a gap it cannot); `send_raw` puts
a message on the wire that is not (topic, seq, payload) at all.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Optional, Sequence

import msgspec
import zmq

REPLAY_BUFFER = 10_000  # batches kept for replay (vLLM's default buffer_steps)


def block_stored(block_hashes: Sequence[int], parent: Optional[int], token_ids: Sequence[int],
                 block_size: int) -> dict:
    """A BlockStored event as vLLM encodes it (hashes in their integer form, cluster/hashing.py)."""
    return {"type": "BlockStored", "block_hashes": list(block_hashes), "parent_block_hash": parent,
            "token_ids": list(token_ids), "block_size": block_size, "lora_id": None, "medium": "CPU",
            "lora_name": None}


class KVEventPublisher:
    """PUB + replay sockets bound on `host` (free ports), a thread answering replays."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._encode = msgspec.msgpack.Encoder().encode
        self._ctx = zmq.Context.instance()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.bind(f"tcp://{host}:0")
        self.endpoint = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self._replay = self._ctx.socket(zmq.ROUTER)
        self._replay.setsockopt(zmq.LINGER, 0)
        self._replay.bind(f"tcp://{host}:0")
        self.replay_endpoint = self._replay.getsockopt_string(zmq.LAST_ENDPOINT)
        self._seq = 0
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=REPLAY_BUFFER)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve_replay, name="fake-kv-events-replay", daemon=True)
        self._thread.start()

    def publish(self, events: list[dict], drop: bool = False) -> int:
        return self.publish_payload(self._encode([time.time(), events, None]), drop)

    def publish_payload(self, payload: bytes, drop: bool = False) -> int:
        """Any payload, well-formed or not, sent and buffered like a batch."""
        with self._lock:
            seq = self._seq
            self._seq += 1
            self._buffer.append((seq, payload))
            if not drop:
                self._pub.send_multipart((b"", seq.to_bytes(8, "big"), payload))
        return seq

    def send_raw(self, frames: list[bytes]) -> None:
        """A message on the wire that is not (topic, seq, payload) at all; not buffered."""
        with self._lock:
            self._pub.send_multipart(frames)

    def forget(self) -> None:
        with self._lock:
            self._buffer.clear()

    def _serve_replay(self) -> None:
        while not self._stop.is_set():
            if not self._replay.poll(50):
                continue
            client, _, start = self._replay.recv_multipart()
            start_seq = int.from_bytes(start, "big")
            with self._lock:
                for seq, payload in self._buffer:
                    if seq >= start_seq:
                        self._replay.send_multipart((client, b"", b"", seq.to_bytes(8, "big"), payload))
                self._replay.send_multipart((client, b"", b"", (-1).to_bytes(8, "big", signed=True), b""))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self._pub.close()
        self._replay.close()
