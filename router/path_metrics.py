"""The P/D path's metrics (router/pd/), Ray metrics of the gateway process; created at 0 per
tier by router/request_metrics.py declare_series. The path a request took is counted through
`count_route` only, under the labels of router/routing/types.py RouteLabel."""

from __future__ import annotations

from typing import Optional

from cluster.metrics import Counter, Histogram
from router.routing.types import RouteLabel

ROUTES = Counter(
    "tandem_route",
    "Requests by serving path (disaggregated, decode_only, prefill_only, fallback_recompute with why, router_error).",
    ["tier", "path", "reason"],
)
DECODE_RETRIES = Counter("tandem_decode_retries", "Decode hops retried before the first token.", ["tier"])
PREFILL_HOP_SECONDS = Histogram(
    "tandem_prefill_hop_seconds",
    "The prefill hop: gateway to prefill replica, which computes the prompt's KV, and the handoff back (successful hops).",
    ["tier"],
)
DECODE_FIRST_TOKEN_SECONDS = Histogram(
    "tandem_decode_first_token_seconds",
    "The decode hop until its first token: the KV pull over NIXL (path disaggregated) or the prompt's "
    "computation on decode (decode_only, fallback_recompute), plus one decode step.",
    ["tier", "path"],
)

DECODE_REFUSED = Counter(
    "tandem_decode_refused",
    "Decode hops refused with a 429: no first token within the deadline, or Serve's queue full.",
    ["tier", "reason"],
)

HEALTH_PROBES = Counter(
    "tandem_health_probes",
    "Readiness probes of every pool (each asks every engine for its stats); /health answers from a cache "
    "refreshed at most once per gateway.health_interval_s.",
)

FIRST_TOKEN = Counter(
    "tandem_first_token",
    "Disaggregated requests by where their first token was sampled: path prefill (reused, "
    "kv_transfer/first_token.py) or decode, with the reason the prefill's token could not be used.",
    ["tier", "path", "reason"],
)

MIGRATIONS = Counter(
    "tandem_migrations",
    "Answers whose stream broke after tokens reached the client: continued on another replica "
    "(result continued, reason what broke) or not (result refused, reason the rule that refused; "
    "router/pd/migration.py).",
    ["tier", "reason", "result"],
)


def count_route(tier: str, route: RouteLabel, reason: str = "") -> None:
    ROUTES.labels(tier=tier, path=route, reason=reason).inc()


def count_prefilled(tier: str, failed: Optional[str]) -> RouteLabel:
    """Count a request whose prefill hop has ended: disaggregated, or recomputed on decode
    because the hop `failed` (its reason); the route it takes on decode."""
    route: RouteLabel = "disaggregated" if failed is None else "fallback_recompute"
    count_route(tier, route, failed or "")
    return route
