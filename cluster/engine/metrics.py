"""An engine's own metrics: the one reader of vLLM's in-process registry, and what is made of it.

vLLM keeps its Prometheus metrics in the replica's process. `read_vllm_metrics()` is the one
place that reads them: samples summed by (name, source label), called `Readings`. Everything
on the replica side is made from Readings, through `Engine.metrics()` (base.py), so a
FakeEngine that synthesises the same samples drives all of it:
- `engine_stats(worker_id, readings)`: the typed EngineStats (Engine.stats(), the gateway's
  health probe, tests);
- `EngineMetricsExporter`: the sums of three vLLM histograms republished exact as tandem's Ray
  counters (cluster/metrics.py) labelled tier, pool and replica, as increments since the last
  export (below: why). Every other engine metric goes out under vLLM's own name, `vllm:*`,
  through vLLM's Ray stat logger (vllm_ray_metrics.py);
- the autoscaling signals (cluster/autoscaling/signals.py) and the routing stats' mean
  token gap (replica.py), from the same Readings.

Exporter lifecycle: an engine replica makes one exporter after its engine is up and calls
`start()`; a daemon thread then calls `export_once()` every `interval_s` until `stop()`
(replica teardown). `export_once()` is also the unit-tested step.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Callable, Optional

from cluster import vllm_metrics as vm  # the vLLM metric names, one table
from cluster.metrics import Counter

log = logging.getLogger(__name__)

Readings = dict[tuple[str, Optional[str]], float]
MetricsReader = Callable[[], Readings]
LABELS = ("tier", "pool", "replica")

# vLLM's token gaps (a histogram): the routing stats' step cost (replica.py imports them here).
ITL_SUM, ITL_COUNT = vm.ITL_SUM, vm.ITL_COUNT


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of one engine's own counters (for VLLMEngine: vLLM's Prometheus metrics in
    this process, read here). Counters are cumulative since the engine started."""

    worker_id: str
    prompt_tokens_computed: float
    prompt_tokens_cached: float
    prompt_tokens_transferred: float
    kv_bytes_transferred: float
    # NIXL transfers this engine completed: vLLM's nixl_xfer_time histogram count, the same
    # count Prometheus holds as vllm:nixl_xfer_time_seconds_count.
    kv_transfers: float
    kv_failed_transfers: float
    requests_running: float
    requests_waiting: float
    kv_cache_usage: float
    # Sum of NIXL transfer durations this engine measured (vLLM's nixl_xfer_time histogram):
    # with kv_transfers, the share of TTFT spent moving KV (loadtest/bench/ttft_vs_direct.py).
    kv_transfer_seconds: float = 0.0


def read_vllm_metrics() -> Readings:
    """Sum vLLM's samples by (name, source label) from this process's Prometheus registry."""
    from prometheus_client import REGISTRY

    totals: Readings = {}
    for family in REGISTRY.collect():
        if not family.name.startswith(vm.PREFIX):
            continue
        for sample in family.samples:
            key = (sample.name, sample.labels.get("source"))
            totals[key] = totals.get(key, 0.0) + sample.value
    return totals


def engine_stats(worker_id: str, values: Readings) -> EngineStats:
    return EngineStats(
        worker_id=worker_id,
        prompt_tokens_computed=values.get(vm.PROMPT_TOKENS_COMPUTED, 0.0),
        prompt_tokens_cached=values.get(vm.PROMPT_TOKENS_CACHED, 0.0),
        prompt_tokens_transferred=values.get(vm.PROMPT_TOKENS_TRANSFERRED, 0.0),
        kv_bytes_transferred=values.get(vm.KV_BYTES_TRANSFERRED, 0.0),
        kv_transfers=values.get(vm.KV_TRANSFERS, 0.0),
        kv_failed_transfers=values.get(vm.KV_FAILED_TRANSFERS, 0.0),
        requests_running=values.get(vm.REQUESTS_RUNNING, 0.0),
        requests_waiting=values.get(vm.REQUESTS_WAITING, 0.0),
        kv_cache_usage=values.get(vm.KV_CACHE_USAGE, 0.0),
        kv_transfer_seconds=values.get(vm.KV_TRANSFER_SECONDS, 0.0),
    )

# tandem counter ← vLLM histogram sum. Every `vllm:*` series goes out through Ray under vLLM's
# own name (vllm_ray_metrics.py), but Ray's agent rebuilds a histogram's `_sum` from its bucket
# midpoints (ray/_private/telemetry/open_telemetry_metric_recorder.py,
# record_histogram_aggregated_batch): vLLM's NIXL byte buckets are 4x apart, so
# `vllm:nixl_bytes_transferred_sum` can be off by half. The sums tandem's dashboards divide go
# out exact here too. (The counts, `_count`, are exact in vLLM's series.)
COUNTERS: dict[str, tuple[str, Optional[str]]] = {
    "tandem_engine_scheduled_tokens": vm.SCHEDULED_TOKENS,
    "tandem_engine_kv_transfer_bytes": vm.KV_BYTES_TRANSFERRED,
    "tandem_engine_kv_transfer_seconds": vm.KV_TRANSFER_SECONDS,
}
_DOCS = {
    "tandem_engine_scheduled_tokens": "Tokens scheduled over all engine steps (vllm:iteration_tokens_total_sum, exact).",
    "tandem_engine_kv_transfer_bytes": "KV bytes this engine pulled over NIXL (vllm:nixl_bytes_transferred_sum, exact).",
    "tandem_engine_kv_transfer_seconds": "Seconds spent in NIXL KV transfers (vllm:nixl_xfer_time_seconds_sum, exact).",
}
_COUNTER_METRICS = {name: Counter(name, _DOCS[name], LABELS) for name in COUNTERS}


class EngineMetricsExporter:
    def __init__(self, tier: str, pool: str, replica: str, read_metrics: MetricsReader, interval_s: float = 2.0):
        self.labels = {"tier": tier, "pool": pool, "replica": replica}
        self._read = read_metrics
        self.interval_s = interval_s
        self._last: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._failed = False

    def export_once(self) -> dict[str, float]:
        """Publish one reading; returns what went out (counter increments)."""
        values = self._read()
        out: dict[str, float] = {}
        for name, key in COUNTERS.items():
            total = values.get(key, 0.0)
            # From 0 on the first reading: the engine started with this exporter.
            out[name] = max(0.0, total - self._last.get(name, 0.0))
            self._last[name] = total
            _COUNTER_METRICS[name].labels(**self.labels).inc(out[name])
        return out

    def start(self) -> "EngineMetricsExporter":
        self._thread = threading.Thread(target=self._loop, name="tandem-engine-metrics", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.export_once()
            except Exception:  # metrics must never take a replica down; say so once
                if not self._failed:
                    log.warning("engine metrics export failed; retrying quietly", exc_info=True)
                self._failed = True

    def stop(self) -> None:
        self._stop.set()
