"""In-process PrefixIndex: two dicts behind one lock (apply runs on subscriber threads,
match on the gateway's event loop; each call holds the lock for microseconds)."""

from __future__ import annotations

import threading
from typing import Iterable, Sequence

from router.prefix_index.base import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent, leading_matches


class MemoryPrefixIndex:
    in_process = True  # match() is cheap enough to call on the event loop

    def __init__(self) -> None:
        self._holders: dict[int, set[str]] = {}  # block hash → workers holding it
        self._blocks: dict[str, set[int]] = {}  # worker → its block hashes (for removal)
        self._lock = threading.Lock()

    def apply(self, events: Iterable[KVEvent]) -> None:
        with self._lock:
            for event in events:
                if isinstance(event, BlockStored):
                    mine = self._blocks.setdefault(event.worker, set())
                    for h in event.block_hashes:
                        self._holders.setdefault(h, set()).add(event.worker)
                        mine.add(h)
                elif isinstance(event, BlockRemoved):
                    mine = self._blocks.get(event.worker, set())
                    for h in event.block_hashes:
                        self._drop(h, event.worker)
                        mine.discard(h)
                elif isinstance(event, AllBlocksCleared):
                    self._remove_worker(event.worker)

    def match(self, block_hashes: Sequence[int]) -> dict[str, int]:
        with self._lock:
            holders = []
            for h in block_hashes:
                workers = self._holders.get(h)
                if not workers:
                    break
                holders.append(tuple(workers))
        return leading_matches(holders)

    def remove_worker(self, worker: str) -> None:
        with self._lock:
            self._remove_worker(worker)

    def num_blocks(self) -> int:
        with self._lock:
            return len(self._holders)

    def close(self) -> None:
        pass

    def _remove_worker(self, worker: str) -> None:
        for h in self._blocks.pop(worker, set()):
            self._drop(h, worker)

    def _drop(self, h: int, worker: str) -> None:
        workers = self._holders.get(h)
        if workers is not None:
            workers.discard(worker)
            if not workers:
                del self._holders[h]
