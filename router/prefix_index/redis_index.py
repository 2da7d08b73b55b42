"""Redis PrefixIndex: the same index shared by several gateway replicas.

Layout (all keys under `prefix`): `<prefix>b:<hash>` is a SET of workers holding the block,
`<prefix>w:<worker>` a SET of that worker's hashes (so a worker's entries can be removed).
`match` reads all of a prompt's blocks in one pipelined round trip.

Every key expires `key_ttl_s` after its last write (a BlockStored refreshes it): entries of a
worker that vanished without a BlockRemoved, of a gateway that died mid-reset or of a renamed
prefix do not stay for ever. A block still cached but not stored again within the TTL costs
one routing miss until an engine stores it again; None: keys never expire.

Every Redis error (refused, timeout, reset) becomes `IndexUnavailable`; timeouts are short
so routing never waits long on a Redis that went away. The redis-py client reconnects by
itself on the next call, so the index recovers as soon as Redis is back.

Credentials are the exception: a Redis that refuses the password (or needs one we lack) is
a configuration error, not an outage, so the index raises `RedisAuthError` when it is built
instead of routing on load only forever. A Redis that is merely down at that moment is fine.

TLS: a `rediss://` URL; `RedisTLS` adds the CA bundle, a client certificate (mutual TLS) and
whether to verify the server.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence
from urllib.parse import urlsplit

import redis

from router.prefix_index.base import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    IndexUnavailable,
    KVEvent,
    leading_matches,
)


log = logging.getLogger(__name__)


class RedisAuthError(ValueError):
    """Redis refused our credentials: fix the config (the message says which fields)."""


@dataclass(frozen=True)
class RedisTLS:
    ca_file: Optional[Path] = None  # None: the system's CA bundle
    cert_file: Optional[Path] = None  # client certificate and key, for Redis' tls-auth-clients
    key_file: Optional[Path] = None
    verify: bool = True  # verify the server's certificate and host name


def tls_of(config: Any) -> Optional[RedisTLS]:
    """The RedisTLS of a routing.index.redis_tls config (None: no TLS options)."""
    return None if config is None else RedisTLS(config.ca_file, config.cert_file, config.key_file, config.verify)


def endpoint_of(url: str) -> str:
    """host:port of a Redis URL, for logs and errors (never the URL: it may carry a user)."""
    parts = urlsplit(url)
    return f"{parts.hostname or '?'}:{parts.port or 6379}"


def client_kwargs(url: str, *, password: Optional[str] = None, username: Optional[str] = None,
                  tls: Optional[RedisTLS] = None, timeout_s: float = 0.25) -> dict[str, Any]:
    """Keyword arguments of `redis.Redis.from_url(url, ...)` for the index."""
    scheme = urlsplit(url).scheme
    if tls is not None and scheme != "rediss":
        raise ValueError(f"Redis TLS options need a rediss:// URL (got {scheme}://)")
    kwargs: dict[str, Any] = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s,
                              "retry_on_timeout": False}
    if password is not None:
        kwargs["password"] = password
    if username is not None:
        kwargs["username"] = username
    if scheme == "rediss":
        tls = tls or RedisTLS()
        kwargs.update(ssl_cert_reqs="required" if tls.verify else "none", ssl_check_hostname=tls.verify)
        for key, path in (("ssl_ca_certs", tls.ca_file), ("ssl_certfile", tls.cert_file), ("ssl_keyfile", tls.key_file)):
            if path is not None:
                kwargs[key] = str(path)
    return kwargs


class RedisPrefixIndex:
    def __init__(self, url: str, *, password: Optional[str] = None, username: Optional[str] = None,
                 tls: Optional[RedisTLS] = None, prefix: str = "tandem:", timeout_s: float = 0.25,
                 key_ttl_s: Optional[int] = None):
        self._prefix = prefix
        self._ttl = key_ttl_s
        self._redis = redis.Redis.from_url(
            url, **client_kwargs(url, password=password, username=username, tls=tls, timeout_s=timeout_s))
        self._check_credentials(url)

    def _check_credentials(self, url: str) -> None:
        where = endpoint_of(url)
        try:
            self._redis.ping()
        except (redis.AuthenticationError, redis.ResponseError) as exc:
            raise RedisAuthError(
                f"Redis at {where} refused the prefix index's credentials ({exc}). Check "
                "routing.index.redis_password / redis_password_env / redis_username.") from None
        except redis.RedisError as exc:  # down or unreachable for now: routing falls back to load
            log.warning("Redis at %s is not reachable yet (%s); routing on load until it is", where, exc)

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
                        self._refresh(pipe, self._b(h))
                    pipe.sadd(self._w(event.worker), *event.block_hashes)
                    self._refresh(pipe, self._w(event.worker))
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

    def _refresh(self, pipe: Any, key: str) -> None:
        if self._ttl is not None:
            pipe.expire(key, self._ttl)

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
