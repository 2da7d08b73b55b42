"""The vLLM Prometheus samples tandem reads, in one table (UPSTREAM.md, "vLLM metric names").

vLLM keeps its metrics in the engine replica's process; cluster/engine/metrics.py reads them
into Readings keyed by (sample name, "source" label), and the engine's stats, the exporter of
three exact sums, the autoscaling signals, the routing stats and FakeEngine all use the keys
below: only what tandem itself reads. (Prometheus and the dashboards get every vLLM series
under vLLM's own name from vLLM's Ray stat logger, cluster/engine/vllm_ray_metrics.py, with
no table.) Why one table: a metric that vLLM renames reads 0, not an error, and the decider
and autoscaling go blind silently. tests/unit/test_upstream_seams.py checks every family here against the vLLM
source that defines it, and tests/integration/test_vllm_metric_names.py against a live
engine's registry.

Written for vLLM 0.32.0. Sample names follow prometheus_client: a gauge's sample is the
family's name, a counter's adds "_total", a histogram's "_sum" and "_count".
"""

from __future__ import annotations

from typing import Optional

Sample = tuple[str, Optional[str]]  # (sample name, value of its "source" label or None)

# Where vLLM 0.32.0 defines each family (relative to the vllm package); the unit test reads them there.
LOGGERS = "v1/metrics/loggers.py"
NIXL_STATS = "distributed/kv_transfer/kv_connector/v1/nixl/stats.py"
FAMILIES: dict[str, str] = {
    "vllm:num_requests_running": LOGGERS,
    "vllm:num_requests_waiting": LOGGERS,
    "vllm:kv_cache_usage_perc": LOGGERS,
    "vllm:prompt_tokens_by_source": LOGGERS,
    "vllm:iteration_tokens_total": LOGGERS,
    "vllm:time_to_first_token_seconds": LOGGERS,
    "vllm:inter_token_latency_seconds": LOGGERS,
    "vllm:nixl_xfer_time_seconds": NIXL_STATS,
    "vllm:nixl_bytes_transferred": NIXL_STATS,
    "vllm:nixl_num_failed_transfers": NIXL_STATS,
}

# Gauges.
REQUESTS_RUNNING: Sample = ("vllm:num_requests_running", None)
REQUESTS_WAITING: Sample = ("vllm:num_requests_waiting", None)
KV_CACHE_USAGE: Sample = ("vllm:kv_cache_usage_perc", None)

# Counters. Prompt tokens by where their KV came from (vLLM's PromptTokenStats sources).
PROMPT_TOKENS_BY_SOURCE = "vllm:prompt_tokens_by_source_total"
PROMPT_TOKENS_COMPUTED: Sample = (PROMPT_TOKENS_BY_SOURCE, "local_compute")
PROMPT_TOKENS_CACHED: Sample = (PROMPT_TOKENS_BY_SOURCE, "local_cache_hit")
PROMPT_TOKENS_TRANSFERRED: Sample = (PROMPT_TOKENS_BY_SOURCE, "external_kv_transfer")
KV_FAILED_TRANSFERS: Sample = ("vllm:nixl_num_failed_transfers_total", None)

# Histograms (sum and count).
SCHEDULED_TOKENS: Sample = ("vllm:iteration_tokens_total_sum", None)
TTFT_SUM: Sample = ("vllm:time_to_first_token_seconds_sum", None)
TTFT_COUNT: Sample = ("vllm:time_to_first_token_seconds_count", None)
ITL_SUM: Sample = ("vllm:inter_token_latency_seconds_sum", None)
ITL_COUNT: Sample = ("vllm:inter_token_latency_seconds_count", None)
KV_BYTES_TRANSFERRED: Sample = ("vllm:nixl_bytes_transferred_sum", None)
# One definition of a KV transfer: a completed NIXL transfer, counted by the transfer-time
# histogram (whose sum is the time spent transferring).
KV_TRANSFERS: Sample = ("vllm:nixl_xfer_time_seconds_count", None)
KV_TRANSFER_SECONDS: Sample = ("vllm:nixl_xfer_time_seconds_sum", None)

# Every sample above, for the checks against vLLM's source and a live registry.
SAMPLES: tuple[Sample, ...] = (
    REQUESTS_RUNNING, REQUESTS_WAITING, KV_CACHE_USAGE,
    PROMPT_TOKENS_COMPUTED, PROMPT_TOKENS_CACHED, PROMPT_TOKENS_TRANSFERRED, KV_FAILED_TRANSFERS,
    SCHEDULED_TOKENS, TTFT_SUM, TTFT_COUNT, ITL_SUM, ITL_COUNT,
    KV_BYTES_TRANSFERRED, KV_TRANSFERS, KV_TRANSFER_SECONDS,
)
# The prefix every vLLM family has: the reader keeps only these from the process's registry.
PREFIX = "vllm:"
