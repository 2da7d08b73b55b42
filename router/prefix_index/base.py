"""The PrefixIndex interface: which worker holds which KV block, fed by vLLM's KV events.

Lifecycle and call order:
1. Build one backend (`make_index` in __init__.py): `MemoryPrefixIndex` (in-process, the
   default) or `RedisPrefixIndex` (shared by several gateway replicas).
2. `apply(events)` from the KV-event subscriber threads, in each worker's sequence order.
   `BlockStored` adds (worker, hash) pairs, `BlockRemoved` drops them, `AllBlocksCleared`
   drops all of that worker's pairs.
3. `match(block_hashes)` from the routing path, any time, concurrently with `apply`: for each
   worker, how many LEADING blocks of the prompt it holds (a prefix cache only reuses an
   unbroken prefix, so a hole ends the match for that worker).
4. `remove_worker(worker)` when a worker leaves, or when its event stream had a gap that
   replay could not fill: its entries are dropped and rebuilt from new events.

Backends raise `IndexUnavailable` when their store cannot be reached; callers route on load
alone then. Hashes are vLLM's integer block hashes (cluster/hashing.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol, Sequence, Union


class IndexUnavailable(RuntimeError):
    """The index's store cannot be reached; route on load alone."""


@dataclass(frozen=True)
class BlockStored:
    worker: str
    block_hashes: tuple[int, ...]


@dataclass(frozen=True)
class BlockRemoved:
    worker: str
    block_hashes: tuple[int, ...]


@dataclass(frozen=True)
class AllBlocksCleared:
    worker: str


KVEvent = Union[BlockStored, BlockRemoved, AllBlocksCleared]


class PrefixIndex(Protocol):
    def apply(self, events: Iterable[KVEvent]) -> None: ...

    def match(self, block_hashes: Sequence[int]) -> dict[str, int]:
        """{worker: number of leading blocks of `block_hashes` it holds}; workers with 0 omitted."""
        ...

    def remove_worker(self, worker: str) -> None: ...

    def close(self) -> None: ...


def leading_matches(holders: Sequence[Iterable[str]]) -> dict[str, int]:
    """Given the holders of each block in prompt order, count each worker's leading run."""
    result: dict[str, int] = {}
    alive: set[str] | None = None
    for depth, workers in enumerate(holders):
        current = set(workers) if alive is None else alive.intersection(workers)
        if not current:
            break
        for worker in current:
            result[worker] = depth + 1
        alive = current
    return result
