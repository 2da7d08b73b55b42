"""The router's metrics, recorded in the gateway process (Ray metrics: see cluster/metrics.py)."""

from __future__ import annotations

from cluster.metrics import Counter, Histogram

DECISIONS = Counter(
    "tandem_routing_decisions",
    "Routing decisions by pool, path (disaggregated | decode_only | prefill_only) and reason "
    "(prefix_hit, load, no_workers, index_unavailable).",
    ["tier", "path", "reason"],
)
PD_DECISIONS = Counter(
    "tandem_pd_decisions",
    "The P/D decider's verdicts (router/routing/decider.py) by path (remote | local | whole) and reason "
    "(short_uncached, prefill_ok, prefill_queue, local_faster, decode_itl_budget, decode_gap_budget, overloaded, "
    "short_output, decode_full, always, never).",
    ["tier", "path", "reason"],
)
PREDICTED_HIT_TOKENS = Counter(
    "tandem_routing_predicted_hit_tokens",
    "Prompt tokens the router predicted to be cached on the engine it chose.",
    ["tier", "pool"],
)
LORA_ROUTES = Counter(
    "tandem_lora_routes",
    "LoRA requests by the engine they were sent to, as this gateway saw it when it picked: affinity held (the "
    "engine held the adapter), free_slot (it had room to load it, or had not reported) or evicts (loading it "
    "evicts another adapter). held / all is the adapter hit rate of routing.",
    ["tier", "pool", "affinity"],
)
PROMPT_TOKENS = Counter(
    "tandem_routing_prompt_tokens", "Prompt tokens of routed requests.", ["tier"]
)
DECISION_SECONDS = Histogram(
    "tandem_routing_decision_seconds",
    "Time to decide a route (hashing, index lookup, scoring).",
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.25),
)
KV_EVENTS = Counter(
    "tandem_kv_events",
    "KV-event stream handling: batch applied, gap, replayed, reset, index_down, malformed (a frame "
    "skipped), rebuild (a worker's entries refilled from the replay buffer), restarted (a dead "
    "subscriber thread replaced).",
    ["kind"],
)
INDEX_ERRORS = Counter(
    "tandem_prefix_index_unavailable", "Lookups that fell back to load-only routing."
)
