"""Writes the chart's Grafana dashboards (deploy/helm/tandem/dashboards/*.json).

    python deploy/helm/build_dashboards.py

The JSON is committed (the chart ships it in a ConfigMap, `tandem grafana-push` uploads it);
this script is its source, and tests/unit/test_dashboards.py checks the two agree.
Every query uses only names from the metric catalogue: tandem's Ray metrics (prefix `ray_`) and
the engines' own vLLM metrics under vLLM's names (`vllm:`, which Prometheus gets by the
relabelling in cluster/observability.py VLLM_RELABEL; the chart's PodMonitor applies it, so the
same series serve a dashboard written for `vllm serve`). Every query aggregates with `by`,
because Ray adds per-process labels (WorkerId, NodeAddress, ...).
"""

from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).parent / "tandem" / "dashboards"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
RATE = "[$__rate_interval]"
TIER = 'tier=~"$tier"'
# Serve and the autoscaler label pools by deployment name, "<tier>-<pool>".
DEPLOYMENT = 'deployment=~"($tier)-(prefill|decode)"'
DECODE, PREFILL = 'pool="decode"', 'pool="prefill"'
ERRORS, NOT_CANCELLED = 'outcome=~"error.*"', 'outcome!="cancelled"'
STATUS_429 = 'status="429"'
RECOMPUTE = 'path="fallback_recompute"'
INDEX_UNAVAILABLE = 'reason="index_unavailable"'
NO_LABELS = ""  # for the few metrics without a tier label


def rate(metric: str, *labels: str) -> str:
    """`rate(metric{labels}[$__rate_interval])`; labels default to the tier selector."""
    selector = ", ".join(labels or (TIER,))
    return f"rate({metric}{{{selector}}}{RATE})" if selector else f"rate({metric}{RATE})"


def quantile(q: float, histogram: str, by: str = "tier", *labels: str) -> str:
    by = f"le, {by}" if by else "le"
    return f"histogram_quantile({q}, sum by ({by}) ({rate(histogram + '_bucket', *labels)}))"


def target(expr: str, legend: str) -> dict:
    return {"expr": expr, "legendFormat": legend}


def panel(title: str, targets: list[dict], unit: str = "short", description: str = "",
          stacked: bool = False, max_value: float | None = None) -> dict:
    defaults: dict = {"unit": unit, "min": 0}
    if max_value is not None:
        defaults["max"] = max_value
    custom = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 20 if stacked else 0, "showPoints": "never",
              "stacking": {"mode": "normal" if stacked else "none", "group": "A"}}
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "fieldConfig": {"defaults": {**defaults, "custom": custom}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                    "tooltip": {"mode": "multi", "sort": "desc"}},
        "targets": [{**t, "datasource": DATASOURCE, "refId": chr(ord("A") + i)} for i, t in enumerate(targets)],
    }


def dashboard(uid: str, title: str, description: str, panels: list[dict]) -> dict:
    laid_out = []
    for i, p in enumerate(panels):  # two columns, in reading order
        laid_out.append({"id": i + 1, "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)}, **p})
    tier_query = "label_values(ray_tandem_requests_total, tier)"
    return {
        "uid": uid,
        "title": f"tandem / {title}",
        "description": description,
        "tags": ["tandem"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "annotations": {"list": []},
        "links": [{"type": "dashboards", "tags": ["tandem"], "asDropdown": True, "title": "tandem"}],
        "templating": {"list": [
            {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
             "current": {}, "hide": 0, "includeAll": False, "multi": False, "options": [], "refresh": 1, "regex": ""},
            {"name": "tier", "label": "Tier", "type": "query", "datasource": DATASOURCE,
             "definition": tier_query, "query": {"query": tier_query, "refId": "tier"},
             "current": {}, "hide": 0, "includeAll": True, "allValue": ".*", "multi": True, "options": [],
             "refresh": 2, "regex": "", "sort": 1},
        ]},
        "panels": laid_out,
    }


def slo() -> dict:
    def quantiles(histogram: str, qs=(0.5, 0.95, 0.99)) -> list[dict]:
        return [target(quantile(q, histogram), f"{{{{tier}}}} p{round(q * 100)}") for q in qs]

    requests = "ray_tandem_requests_total"
    return dashboard("tandem-slo", "SLO overview", "Latency, throughput and errors as clients see them, per tier.", [
        panel("Time to first token", quantiles("ray_tandem_ttft_seconds"), "s",
              "As the client sees it, including the gateway's admission queue."),
        panel("Inter-token latency", quantiles("ray_tandem_itl_seconds"), "s"),
        panel("End-to-end latency p95", quantiles("ray_tandem_e2e_seconds", (0.95,)), "s", "Requests that ended ok."),
        panel("Requests by outcome", [target(f"sum by (tier, outcome) ({rate(requests)})", "{{tier}} {{outcome}}")],
              "reqps", stacked=True),
        panel("Error ratio", [target(
            f"sum by (tier) ({rate(requests, TIER, ERRORS)})\n"
            f"/ sum by (tier) ({rate(requests, TIER, NOT_CANCELLED)})", "{{tier}}")],
            "percentunit", "Server-side errors of all requests that were not cancelled; 429s are not errors."),
        panel("Rejected with 429", [
            target(f"sum by (tier, reason) ({rate('ray_tandem_admission_rejected_total')})", "{{tier}} {{reason}}"),
            target(f"sum by (route) ({rate('ray_tandem_http_responses_total', STATUS_429)})", "HTTP 429 {{route}}"),
        ], "reqps", "Admission control: the tier's queue was full or a request waited too long."),
        panel("Output tokens per second", [
            target(f"sum by (tier) ({rate('ray_tandem_output_tokens_total')})", "{{tier}}")], "short"),
        panel("Prompt tokens per second", [
            target(f"sum by (tier) ({rate('ray_tandem_prompt_tokens_total')})", "{{tier}}")], "short"),
        panel("Requests waiting for the pools to be ready", [
            target(f"sum by (result) ({rate('ray_tandem_ready_waits_total', NO_LABELS)})", "{{result}}"),
        ], "reqps", "Arrivals before every pool was ready (a cold start, a redeploy replacing a pool stop-first): "
                    "served after the wait, or 503 model_loading (timed_out, full; off: gateway.ready_wait_s 0)."),
    ])


def pools() -> dict:
    def engine(metric: str, by: str = "tier, pool") -> str:
        return f"sum by ({by}) ({rate(metric)})"

    return dashboard("tandem-pools", "Pools", "Each engine pool (tier and prefill/decode): queues, batches, KV cache, replicas.", [
        panel("Queued requests", [
            target(f"sum by (tier, pool) (vllm:num_requests_waiting{{{TIER}}})", "{{tier}}-{{pool}} engine waiting"),
            target(f"sum by (tier) (ray_tandem_admission_queued{{{TIER}}})", "{{tier}} gateway admission queue"),
        ], "short", "Engines' waiting queues and the gateway's per-tier admission queue."),
        panel("Running sequences (batch size)", [
            target(f"sum by (tier, pool) (vllm:num_requests_running{{{TIER}}})", "{{tier}}-{{pool}}"),
            target(f"sum by (tier) (ray_tandem_admission_running{{{TIER}}})", "{{tier}} admitted by the gateway"),
            target(f"sum by (tier) (ray_tandem_admission_limit{{{TIER}}})", "{{tier}} places the gateway offers"),
        ], "short", "The gateway's places adapt to the tier's TTFT target (admission.target_ttft_s)."),
        panel("Batch size in tokens per engine step", [target(
            f"{engine('ray_tandem_engine_scheduled_tokens_total')}\n/ {engine('vllm:iteration_tokens_total_count')}",
            "{{tier}}-{{pool}}")], "short", "Tokens scheduled per forward pass, averaged over the pool."),
        panel("KV cache usage per replica", [target(
            f"max by (tier, pool, replica) (vllm:kv_cache_usage_perc{{{TIER}}})", "{{replica}}")],
            "percentunit", max_value=1),
        panel("Replicas per pool", [
            target(f'sum by (deployment) (ray_serve_deployment_replica_healthy{{application="tandem", {DEPLOYMENT}}})',
                   "{{deployment}} healthy"),
            target(f"max by (deployment) (ray_tandem_autoscaling_current_replicas{{{DEPLOYMENT}}})",
                   "{{deployment}} current"),
            target(f"max by (deployment) (ray_tandem_autoscaling_target_replicas{{{DEPLOYMENT}}})",
                   "{{deployment}} target"),
        ], "short", "Healthy replicas (Serve); current and target replicas (autoscaled pools only)."),
        panel("Autoscaling decisions", [target(
            f"sum by (deployment, direction) (increase(ray_tandem_autoscaling_decisions_total{{{DEPLOYMENT}}}{RATE}))",
            "{{deployment}} {{direction}}")], "short", stacked=True),
        panel("Output tokens per second per replica", [
            target(engine("vllm:generation_tokens_total", "tier, pool, replica"), "{{replica}}")], "short"),
        panel("Preemptions per second", [
            target(engine("vllm:num_preemptions_total", "tier, pool, replica"), "{{replica}}")], "short",
            "Requests preempted for lack of KV cache."),
    ])


def kv_transfer() -> dict:
    def per_tier(metric: str) -> str:
        return f"sum by (tier) ({rate(metric, TIER, DECODE)})"

    by_source = "vllm:prompt_tokens_by_source_total"
    transfers = "vllm:nixl_xfer_time_seconds_count"
    return dashboard("tandem-kv-transfer", "KV transfer", "Prefill-to-decode KV cache handoff over NIXL (decode side pulls).", [
        panel("KV bytes pulled per second", [target(
            f"sum by (tier, replica) ({rate('ray_tandem_engine_kv_transfer_bytes_total', TIER, DECODE)})", "{{replica}}")],
            "Bps"),
        panel("KV transfers per second", [target(per_tier(transfers), "{{tier}}")], "short"),
        panel("Mean KV transfer time", [target(
            f"{per_tier('ray_tandem_engine_kv_transfer_seconds_total')}\n/ {per_tier(transfers)}",
            "{{tier}}")], "s"),
        panel("KV transfer failures and expired handoffs per second", [
            target(per_tier("vllm:nixl_num_failed_transfers_total"), "{{tier}} NIXL transfers failed"),
            target(f"sum by (tier) ({rate('ray_tandem_handoffs_expired_total')})", "{{tier}} handoffs expired"),
            target(f"sum by (tier) ({rate('ray_tandem_handoffs_mismatched_total')})", "{{tier}} handoffs mismatched"),
        ], "short", "All recompute the prompt on decode. Expired: the handoff reached decode after the "
                    "prefill engine's KV lease, so its blocks were never pulled. Mismatched: KV from an engine "
                    "of another model, dtype or block size, or computed with another LoRA adapter."),
        panel("Recomputed on decode (fallback)", [target(
            f"sum by (tier, reason) ({rate('ray_tandem_route_total', TIER, RECOMPUTE)})",
            "{{tier}} {{reason}}")], "reqps", "Requests whose prefill hop failed, so decode computed the prompt itself.",
            stacked=True),
        panel("Prefill hop latency", [
            target(quantile(q, "ray_tandem_prefill_hop_seconds"), f"{{{{tier}}}} p{round(q * 100)}") for q in (0.5, 0.95)
        ], "s", "Prefill computes the KV and hands it off."),
        panel("Decode hop to first token", [
            target(quantile(q, "ray_tandem_decode_first_token_seconds", "tier, path"),
                   f"{{{{tier}}}} {{{{path}}}} p{round(q * 100)}") for q in (0.5, 0.95)
        ], "s", "Decode pulls the KV and runs one step."),
        panel("Decode pool: where prompt tokens came from", [target(
            f"sum by (tier, source) ({rate(by_source, TIER, DECODE)})\n"
            f"/ ignoring (source) group_left sum by (tier) ({rate(by_source, TIER, DECODE)})", "{{tier}} {{source}}")
        ], "percentunit", "Share of the decode engines' prompt tokens: transferred over NIXL, computed, or prefix-cached.",
            stacked=True, max_value=1),
    ])


def router() -> dict:
    predicted = (f"sum by (tier) ({rate('ray_tandem_routing_predicted_hit_tokens_total', TIER, PREFILL)})"
                 f"\n/ sum by (tier) ({rate('ray_tandem_routing_prompt_tokens_total')})")
    engine = (f"sum by (tier) ({rate('vllm:prefix_cache_hits_total', TIER, PREFILL)})"
              f"\n/ sum by (tier) ({rate('vllm:prefix_cache_queries_total', TIER, PREFILL)})")

    def by_path(metric: str) -> list[dict]:
        return [target(f"sum by (tier, path, reason) ({rate(metric)})", "{{tier}} {{path}} {{reason}}")]

    return dashboard("tandem-router", "Router", "P/D decisions, prefix-aware routing, predicted vs real cache hits, KV events.", [
        panel("Serving path by reason", by_path("ray_tandem_route_total"), "reqps",
              "The path each request took: disaggregated, decode_only, prefill_only, fallback_recompute (with "
              "why the prefill hop failed), router_error.", stacked=True),
        panel("P/D decider verdicts", by_path("ray_tandem_pd_decisions_total"), "reqps",
              "remote (prefill then decode), local (decode computes the prompt) or whole (all on prefill), "
              "with the rule that decided.", stacked=True),
        panel("First token source", by_path("ray_tandem_first_token_total"), "reqps",
              "Disaggregated requests by where the first token was sampled: prefill (reused) or decode, with "
              "what kept the prefill's token from being used.", stacked=True),
        panel("Decode hops refused or retried", [
            target(f"sum by (tier, reason) ({rate('ray_tandem_decode_refused_total')})", "{{tier}} refused {{reason}}"),
            target(f"sum by (tier) ({rate('ray_tandem_decode_retries_total')})", "{{tier}} retried"),
        ], "reqps", "Refused (429): no first token within the deadline or Serve's queue full; retried before "
                    "the first token."),
        panel("Streams migrated mid-answer", [
            target(f"sum by (tier, reason, result) ({rate('ray_tandem_migrations_total')})",
                   "{{tier}} {{result}} {{reason}}"),
        ], "reqps", "A decode hop that broke after tokens reached the client: continued on another replica "
                    "(with what broke) or refused (with why the answer could not be continued exactly).",
              stacked=True),
        panel("Routing decisions", by_path("ray_tandem_routing_decisions_total"), "reqps",
              "Which engines the prefix-aware router picked, by pool.", stacked=True),
        panel("Prefix hit rate: router-predicted vs engine-reported", [
            target(predicted, "{{tier}} predicted by the router"),
            target(engine, "{{tier}} prefill engines"),
        ], "percentunit", "Prompt tokens the router expected cached on the chosen prefill engine, and what the "
                          "prefill engines really found in their prefix cache.", max_value=1),
        panel("Routing decision latency", [
            target(quantile(q, "ray_tandem_routing_decision_seconds", "", NO_LABELS), f"p{round(q * 100)}")
            for q in (0.5, 0.99)
        ], "s"),
        panel("KV cache events", [target(f"sum by (kind) ({rate('ray_tandem_kv_events_total', NO_LABELS)})", "{{kind}}")],
              "short", "The router's handling of the engines' KV-event streams: batches applied, gaps, "
              "replays, resets, index down.", stacked=True),
        panel("Prefix index unavailable", [
            target(f"sum({rate('ray_tandem_prefix_index_unavailable_total', NO_LABELS)})", "index lookups failed"),
            target(f"sum by (tier) ({rate('ray_tandem_routing_decisions_total', TIER, INDEX_UNAVAILABLE)})",
                   "{{tier}} routed without the index"),
        ], "short", "The router fell back to load-only routing because the prefix index did not answer."),
        *lora_panels(),
    ])


HELD = 'affinity="held"'


def lora_panels() -> list[dict]:
    """By LoRA adapter (model.lora_adapters; no data without adapters): `adapter` is a configured
    name or "base"."""
    by_adapter = "tier, adapter"
    return [
        panel("LoRA: requests by adapter", [
            target(f"sum by (tier, adapter, outcome) ({rate('ray_tandem_adapter_requests_total')})",
                   "{{tier}} {{adapter}} {{outcome}}")], "reqps", "Requests naming each adapter by `model`, and "
                   "the base model's, by outcome.", stacked=True),
        panel("LoRA: time to first token by adapter", [
            target(quantile(q, "ray_tandem_adapter_ttft_seconds", by_adapter), f"{{{{tier}}}} {{{{adapter}}}} "
                   f"p{round(q * 100)}") for q in (0.5, 0.95)], "s",
              "As the client sees it; an adapter's prompt costs more compute than the base's."),
        panel("LoRA: tokens per second by adapter", [
            target(f"sum by ({by_adapter}) ({rate('ray_tandem_adapter_output_tokens_total')})",
                   "{{tier}} {{adapter}} output"),
            target(f"sum by ({by_adapter}) ({rate('ray_tandem_adapter_prompt_tokens_total')})",
                   "{{tier}} {{adapter}} prompt"),
        ], "short"),
        panel("LoRA: adapters evicted", [
            target(f"sum by (tier, pool) ({rate('ray_tandem_lora_evictions_total')})", "{{tier}} {{pool}}")],
              "short", "Adapters vLLM dropped from an engine's adapter cache (model.max_loras) to load another; "
                       "each costs a reload when it is named again. Seen once a second: a lower bound."),
        panel("LoRA: routing's adapter hit rate", [
            target(f"sum by (tier, pool) ({rate('ray_tandem_lora_routes_total', TIER, HELD)}) / "
                   f"sum by (tier, pool) ({rate('ray_tandem_lora_routes_total')})", "{{tier}} {{pool}}")],
              "percentunit", "Of the LoRA requests sent to a pool, the share whose engine held the adapter when the "
                             "gateway picked it (routing.weights.lora); the rest loaded it into a free slot or "
                             "evicted another adapter."),
    ]


DASHBOARDS = {"tandem-slo.json": slo, "tandem-pools.json": pools, "tandem-kv-transfer.json": kv_transfer,
              "tandem-router.json": router}


def render() -> dict[str, str]:
    return {name: json.dumps(build(), indent=2) + "\n" for name, build in DASHBOARDS.items()}


if __name__ == "__main__":
    OUT.mkdir(parents=True, exist_ok=True)
    for name, text in render().items():
        (OUT / name).write_text(text)
        print(OUT / name)
