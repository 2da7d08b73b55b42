"""Prefix index backends (see base.py for the interface and call order)."""

from __future__ import annotations

from typing import Any, Optional

from router.prefix_index.base import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    IndexUnavailable,
    KVEvent,
    PrefixIndex,
)
from router.prefix_index.memory import MemoryPrefixIndex

__all__ = ["AllBlocksCleared", "BlockRemoved", "BlockStored", "IndexUnavailable", "KVEvent",
           "PrefixIndex", "MemoryPrefixIndex", "make_index"]


def make_index(backend: str, *, redis_url: Optional[str] = None, redis_password: Optional[str] = None,
               redis_username: Optional[str] = None, redis_tls: Any = None, prefix: str = "tandem:",
               key_ttl_s: Optional[int] = None) -> PrefixIndex:
    """The index the routing config asks for: "memory" or "redis" (`redis_tls`: a RedisTLS)."""
    if backend == "memory":
        return MemoryPrefixIndex()
    if backend == "redis":
        from router.prefix_index.redis_index import RedisPrefixIndex

        if not redis_url:
            raise ValueError("routing.index.redis_url is required for the redis backend")
        return RedisPrefixIndex(redis_url, password=redis_password, username=redis_username, tls=redis_tls,
                                prefix=prefix, key_ttl_s=key_ttl_s)
    raise ValueError(f"unknown prefix index backend {backend!r}: use memory or redis")
