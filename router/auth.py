"""API keys: key → tenant → tier, checked at the edge before anything else.

`ApiKeyAuth.caller(headers)` is the edge's authenticate hook (router/openai/app.py), called
once per request: it returns the Caller (tier, tenant, prefix-cache salt) or raises an
OpenAI-shaped error. The rate limits read the tenant it found; nothing checks the key again. Keys are kept only as
SHA-256 digests and compared with `hmac.compare_digest` against every digest (no early
exit), so timing says nothing about a key; a key is never logged or echoed in an error.

- Keys configured: a missing or wrong `Authorization: Bearer <key>` → 401. The request runs
  in its tenant's tier; the tier header (`auth.tier_header`) may pick another tier the tenant
  is allowed (403 otherwise, 400 for an unknown tier).
- No keys configured: the API is open (local runs), any caller may pick any tier, and the
  gateway says so at start-up.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from dataclasses import dataclass
from typing import Mapping, Optional

from router.openai.context import Caller
from router.openai.errors import OpenAIError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Grant:
    tenant: str
    tier: str
    allowed_tiers: frozenset[str]


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


def unauthorized(message: str) -> OpenAIError:
    return OpenAIError(401, message, "invalid_request_error", None, "invalid_api_key",
                       {"WWW-Authenticate": "Bearer"})


def cache_salt(tenant: str) -> str:
    """A tenant's vLLM cache salt: one per tenant, its name not spelled out in engine state."""
    return hashlib.sha256(f"tandem-prefix-cache:{tenant}".encode("utf-8")).hexdigest()[:32]


class ApiKeyAuth:
    def __init__(self, grants: Mapping[str, Grant], *, tiers: tuple[str, ...], default_tier: str,
                 tier_header: str = "X-Tandem-Tier", isolate_prefix_cache: bool = False):
        """`grants` maps each API key to its tenant's grant; the keys themselves are not kept.
        `isolate_prefix_cache`: each tenant's requests carry its cache salt (auth.prefix_cache)."""
        self._grants = [(_digest(key), grant) for key, grant in grants.items()]
        self._isolate = isolate_prefix_cache
        self._tiers = tiers
        self._default_tier = default_tier
        self.tier_header = tier_header

    @classmethod
    def from_config(cls, cfg) -> "ApiKeyAuth":
        """From a ClusterConfig; reads keys from their env variables or files."""
        tenants = cfg.auth.tenants
        grants = {
            source.resolve(): Grant(
                source.tenant,
                tenants[source.tenant].tier,
                frozenset((tenants[source.tenant].tier, *tenants[source.tenant].allowed_tiers)),
            )
            for source in cfg.auth.keys
        }
        auth = cls(grants, tiers=tuple(cfg.tiers), default_tier=cfg.default_tier, tier_header=cfg.auth.tier_header,
                   isolate_prefix_cache=cfg.auth.isolates_prefix_cache())
        for source in cfg.auth.keys:
            if source.value is not None:
                log.warning("API key of tenant %r is plaintext in the config; use env or file outside tests.",
                            source.tenant)
        if auth.open:
            log.warning("No API keys configured (auth.keys): the API is OPEN to anyone who can reach it.")
        else:
            log.info("API keys: %d key(s) for %d tenant(s)", len(grants), len(tenants))
        return auth

    @property
    def open(self) -> bool:
        return not self._grants

    def _grant_of(self, key: str) -> Optional[Grant]:
        presented = _digest(key)
        found = None
        for digest, grant in self._grants:  # all of them, always: constant time
            if hmac.compare_digest(presented, digest):
                found = grant
        return found

    def authenticate(self, headers: Mapping[str, str]) -> Optional[Grant]:
        """The caller's grant; None when the API is open. Raises 401."""
        if self.open:
            return None
        scheme, _, key = (headers.get("authorization") or "").partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            raise unauthorized("You didn't provide an API key. Send it as 'Authorization: Bearer YOUR_KEY'.")
        grant = self._grant_of(key)
        if grant is None:
            raise unauthorized("Incorrect API key provided. Check the key you were given.")
        return grant

    def caller(self, headers: Mapping[str, str]) -> Caller:
        """The edge hook: authenticate, then pick the request's tier (401 / 400 / 403)."""
        grant = self.authenticate(headers)
        tier = self._tier(grant, headers)
        if grant is None:
            return Caller(tier)
        return Caller(tier, grant.tenant, cache_salt(grant.tenant) if self._isolate else None)

    def tier_of(self, headers: Mapping[str, str]) -> str:
        """The request's tier (401 / 400 / 403 like `caller`)."""
        return self.caller(headers).tier

    def _tier(self, grant: Optional[Grant], headers: Mapping[str, str]) -> str:
        asked = headers.get(self.tier_header)
        if asked is None:
            return grant.tier if grant else self._default_tier
        if asked not in self._tiers:
            raise OpenAIError(400, f"Unknown tier {asked!r} in {self.tier_header}; tiers are {', '.join(self._tiers)}.",
                              "invalid_request_error", None, "invalid_tier")
        if grant is not None and asked not in grant.allowed_tiers:
            raise OpenAIError(403, f"This API key may not use tier {asked!r}; allowed: "
                              f"{', '.join(sorted(grant.allowed_tiers))}.", "permission_denied", None, "tier_not_allowed")
        return asked
