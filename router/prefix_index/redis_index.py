"""Redis PrefixIndex: the same index shared by several gateway replicas.

Layout (all keys under `prefix`): `<prefix>b:<hash>` is a SET of workers holding the block,
`<prefix>w:<worker>` a SET of that worker's hashes (so a worker's entries can be removed).
`match` reads all of a prompt's blocks in one pipelined round trip.

Every Redis error (refused, timeout, reset) becomes `IndexUnavailable`; timeouts are short
so routing never waits long on a Redis that went away. The redis-py client reconnects by
itself on the next call, so the index recovers as soon as Redis is back.
"""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

import redis

from router.prefix_index.base import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    IndexUnavailable,
    KVEvent,
    leading_matches,
)


class RedisPrefixIndex:
    def __init__(self, url: str, *, password: Optional[str] = None, prefix: str = "tandem:",
                 timeout_s: float = 0.25):
        self._prefix = prefix
        self._redis = redis.Redis.from_url(
            url, password=password, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
            retry_on_timeout=False,
        )

    def _b(self, h: int) -> str:
        return f"{self._prefix}b:{h}"

    def _w(self, worker: str) -> str:
        return f"{self._prefix}w:{worker}"

    def apply(self, events: Iterable[KVEvent]) -> None:
        try:
            pipe = self._redis.pipeline(transaction=False)
            for event in events:
                if isinstance(event, BlockStored) and event.block_hashes:
                    for h in event.block_hashes:
                        pipe.sadd(self._b(h), event.worker)
                    pipe.sadd(self._w(event.worker), *event.block_hashes)
                elif isinstance(event, BlockRemoved) and event.block_hashes:
                    for h in event.block_hashes:
                        pipe.srem(self._b(h), event.worker)
                    pipe.srem(self._w(event.worker), *event.block_hashes)
                elif isinstance(event, AllBlocksCleared):
                    pipe.execute()
                    self._remove_worker(event.worker)
            pipe.execute()
        except redis.RedisError as exc:
            raise IndexUnavailable(f"Redis index: {exc}") from exc

    def match(self, block_hashes: Sequence[int]) -> dict[str, int]:
        if not block_hashes:
            return {}
        try:
            pipe = self._redis.pipeline(transaction=False)
            for h in block_hashes:
                pipe.smembers(self._b(h))
            members = pipe.execute()
        except redis.RedisError as exc:
            raise IndexUnavailable(f"Redis index: {exc}") from exc
        return leading_matches([{w.decode() for w in m} for m in members])

    def remove_worker(self, worker: str) -> None:
        try:
            self._remove_worker(worker)
        except redis.RedisError as exc:
            raise IndexUnavailable(f"Redis index: {exc}") from exc

    def _remove_worker(self, worker: str) -> None:
        hashes = self._redis.smembers(self._w(worker))
        pipe = self._redis.pipeline(transaction=False)
        for h in hashes:
            pipe.srem(self._b(int(h)), worker)
        pipe.delete(self._w(worker))
        pipe.execute()

    def close(self) -> None:
        self._redis.close()
