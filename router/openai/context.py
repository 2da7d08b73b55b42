"""The tandem side of one HTTP request, as vLLM's serving code cannot carry it: who asked
(tenant, tier, cache salt, headers) and, when tandem refuses the request before its first
token (admission, rate limits, a full decode queue), the error to answer with.

The edge middleware (router/openai/edge.py) sets it for the request's task; the engine client
(router/openai/engine_client.py) reads it inside vLLM's call to `generate`. A context var,
so nothing is threaded through vLLM's signatures: Starlette runs the endpoint, and the
streaming body, in tasks that copy the middleware's context.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from router.openai.errors import OpenAIError


@dataclass(frozen=True)
class Caller:
    """Who sent the request, as the edge's one authentication found it (router/auth.py)."""

    tier: str
    tenant: Optional[str] = None  # None: the API is open (no keys)
    cache_salt: Optional[str] = None  # the tenant's prefix-cache salt (auth.prefix_cache isolate)


@dataclass
class RequestContext:
    tier: str
    headers: Mapping[str, str] = field(default_factory=dict)
    tenant: Optional[str] = None  # for the rate limits; authenticated once, at the edge
    cache_salt: Optional[str] = None  # the tenant's prefix-cache salt (auth.prefix_cache isolate)
    # Set once by the engine client when tandem refuses the request before its first token:
    # the middleware answers with it (status, Retry-After) instead of vLLM's stream.
    refusal: Optional[OpenAIError] = None
    extra: dict[str, Any] = field(default_factory=dict)


CURRENT: ContextVar[Optional[RequestContext]] = ContextVar("tandem_request", default=None)
