"""An engine's own metrics: the one reader of vLLM's in-process registry, and what is made of it.

vLLM keeps its Prometheus metrics in the replica's process. `read_vllm_metrics()` is the one
place that reads them: samples summed by (name, source label), called `Readings`. Everything
on the replica side is made from Readings, through `Engine.metrics()` (base.py), so a
FakeEngine that synthesises the same samples drives all of it:
- `engine_stats(worker_id, readings)`: the typed EngineStats (Engine.stats(), the gateway's
  health probe, tests);
- `EngineMetricsExporter`: a fixed set republished as tandem's Ray metrics
  (cluster/metrics.py) with the labels vLLM cannot know: tier, pool and replica. Gauges are
  copied; vLLM's cumulative counters go out as increments since the last export;
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
from cluster.metrics import Counter, Gauge

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
    # count the exporter publishes as tandem_engine_kv_transfers (below).
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

# tandem gauge ← vLLM sample (name, source label)
GAUGES: dict[str, tuple[str, Optional[str]]] = {
    "tandem_engine_requests_running": vm.REQUESTS_RUNNING,
    "tandem_engine_requests_waiting": vm.REQUESTS_WAITING,
    "tandem_engine_kv_cache_usage": vm.KV_CACHE_USAGE,
}
# tandem counter ← vLLM cumulative sample
COUNTERS: dict[str, tuple[str, Optional[str]]] = {
    "tandem_engine_generation_tokens": vm.GENERATION_TOKENS,
    "tandem_engine_prompt_tokens_computed": vm.PROMPT_TOKENS_COMPUTED,
    "tandem_engine_prompt_tokens_cached": vm.PROMPT_TOKENS_CACHED,
    "tandem_engine_prompt_tokens_transferred": vm.PROMPT_TOKENS_TRANSFERRED,
    "tandem_engine_prefix_cache_queries": vm.PREFIX_CACHE_QUERIES,
    "tandem_engine_prefix_cache_hits": vm.PREFIX_CACHE_HITS,
    "tandem_engine_scheduled_tokens": vm.SCHEDULED_TOKENS,
    "tandem_engine_steps": vm.STEPS,
    "tandem_engine_preemptions": vm.PREEMPTIONS,
    "tandem_engine_requests_finished": vm.REQUESTS_FINISHED,
    "tandem_engine_kv_transfer_bytes": vm.KV_BYTES_TRANSFERRED,
    "tandem_engine_kv_transfers": vm.KV_TRANSFERS,
    "tandem_engine_kv_transfer_seconds": vm.KV_TRANSFER_SECONDS,
    "tandem_engine_kv_transfer_failures": vm.KV_FAILED_TRANSFERS,
}
_DOCS = {
    "tandem_engine_requests_running": "Sequences in the engine's running batch (decode: the batch size).",
    "tandem_engine_requests_waiting": "Requests queued inside the engine.",
    "tandem_engine_kv_cache_usage": "Fraction of the engine's KV cache blocks in use (0-1).",
    "tandem_engine_generation_tokens": "Tokens generated (tokens/s per replica: the basis of tokens per dollar).",
    "tandem_engine_prompt_tokens_computed": "Prompt tokens this engine computed itself.",
    "tandem_engine_prompt_tokens_cached": "Prompt tokens served from this engine's prefix cache.",
    "tandem_engine_prompt_tokens_transferred": "Prompt tokens whose KV arrived over NIXL.",
    "tandem_engine_prefix_cache_queries": "Prompt tokens looked up in the prefix cache.",
    "tandem_engine_prefix_cache_hits": "Prompt tokens found in the prefix cache.",
    "tandem_engine_scheduled_tokens": "Tokens scheduled over all engine steps (divided by steps: the batch size in tokens).",
    "tandem_engine_steps": "Engine steps (forward passes).",
    "tandem_engine_preemptions": "Requests preempted for lack of KV cache.",
    "tandem_engine_requests_finished": "Requests the engine finished.",
    "tandem_engine_kv_transfer_bytes": "KV bytes this engine pulled over NIXL.",
    "tandem_engine_kv_transfers": "NIXL KV transfers this engine completed.",
    "tandem_engine_kv_transfer_seconds": "Seconds spent in NIXL KV transfers.",
    "tandem_engine_kv_transfer_failures": "NIXL KV transfers that failed (vLLM then recomputes).",
}
_GAUGE_METRICS = {name: Gauge(name, _DOCS[name], LABELS) for name in GAUGES}
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
        """Publish one reading; returns what went out (gauge values, counter increments)."""
        values = self._read()
        out: dict[str, float] = {}
        for name, key in GAUGES.items():
            out[name] = values.get(key, 0.0)
            _GAUGE_METRICS[name].labels(**self.labels).set(out[name])
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
