"""The router's Prometheus metrics, in the gateway process (exposed on the gateway /metrics)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

DECISIONS = Counter(
    "tandem_routing_decisions_total",
    "Routing decisions by pool, path (disaggregated | decode_only) and reason "
    "(prefix_hit, load, no_workers, index_unavailable).",
    ["tier", "path", "reason"],
)
PREDICTED_HIT_TOKENS = Counter(
    "tandem_routing_predicted_hit_tokens_total",
    "Prompt tokens the router predicted to be cached on the engine it chose.",
    ["tier", "pool"],
)
PROMPT_TOKENS = Counter(
    "tandem_routing_prompt_tokens_total", "Prompt tokens of routed requests.", ["tier"]
)
DECISION_SECONDS = Histogram(
    "tandem_routing_decision_seconds",
    "Time to decide a route (hashing, index lookup, scoring).",
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.25),
)
KV_EVENTS = Counter(
    "tandem_kv_events_total",
    "KV-event stream handling: batch applied, gap, replayed, reset, index_down.",
    ["kind"],
)
INDEX_ERRORS = Counter(
    "tandem_prefix_index_unavailable_total", "Lookups that fell back to load-only routing."
)
