"""vLLM's own metrics (`vllm:*`) of every engine, exported through Ray with tandem's labels.

vLLM ships a stat logger that records its Prometheus metrics as Ray metrics
(`vllm/v1/metrics/ray_wrappers.py`, RayPrometheusStatLogger, what Ray Serve LLM uses): the
families, names and labels of `vllm serve`'s /metrics, recorded once per engine step. Each
engine replica runs it, changed only through the class attributes vLLM provides for that
(`_gauge_cls`, `_counter_cls`, `_histogram_cls`, `_kv_connector_cls`, ...; UPSTREAM.md):
- every series also carries tandem's labels, `tier`, `pool` (prefill | decode: the engine's
  role) and `replica` (the engine's worker id), the labels of tandem's own engine metrics;
- every labelled counter is exported at 0 from the engine's start, as vLLM's registry shows it;
- counter increments and histogram observations are summed and recorded off the replica's
  event loop once a second, and gauges are recorded again every second (cluster/metrics.py):
  vLLM observes the token gap of every running sequence every step and one Ray record costs
  ~15-20 us; a Ray gauge not recorded within two report intervals drops out of the scrape,
  so an idle engine's `vllm:num_requests_running 0` would vanish.

Names: Ray's metric names allow no ':', so vLLM's logger records `vllm_<name>`, and Ray's agent
exports it as `ray_vllm_<name>` (its `ray_` prefix). One Prometheus relabelling
(cluster/observability.py VLLM_RELABEL; the chart's PodMonitor applies it) names them
`vllm:<name>` again, so Prometheus holds vLLM's own names and a dashboard or alert written for
`vllm serve` works on tandem unchanged.

The engine keeps vLLM's in-process Prometheus logger as well: tandem reads that registry
(cluster/engine/metrics.py read_vllm_metrics) for EngineStats, routing stats and autoscaling.
"""

from __future__ import annotations

from typing import Any, Mapping

from vllm.v1.metrics.loggers import PrometheusStatLogger
from vllm.v1.metrics.ray_wrappers import (RayCounterWrapper, RayGaugeWrapper, RayHistogramWrapper,
                                          RayKVConnectorProm, RayPerfMetricsProm, RayPrometheusMetric,
                                          RayPrometheusStatLogger, RaySpecDecodingProm)

from cluster.metrics import inc_later, observe_later, set_kept

LABELS = ("tier", "pool", "replica")


class _Labelled:
    """Over one of vLLM's Ray wrappers: tandem's labels (`extra`, set per engine by
    `stat_loggers`) become tag keys of the Ray metric and its default tags."""

    extra: Mapping[str, str] = {}
    metric: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.metric.set_default_tags(dict(self.extra))

    def _get_tag_keys(self, labelnames: list[str] | None) -> tuple[str, ...]:
        # vLLM's tag keys (its label names, then ReplicaId), then tandem's.
        return (*RayPrometheusMetric._get_tag_keys(labelnames), *self.extra)

    def _build_tags(self, *labels: Any, **labelskwargs: Any) -> dict[str, str]:
        # vLLM checks positional labels against all tag keys but its own ReplicaId, so hand it
        # them by name (vLLM's label names come first among the tag keys); the default tags
        # fill in tandem's labels.
        labelskwargs.update(zip(self.metric._tag_keys, labels))
        return {**super()._build_tags(**labelskwargs), **self.extra}


class _Gauge(_Labelled, RayGaugeWrapper):
    def set(self, value: float) -> None:
        set_kept(self.metric, self._tags, value)


class _Counter(_Labelled, RayCounterWrapper):
    def labels(self, *labels: Any, **labelskwargs: Any) -> Any:
        # At 0 from the start, as in vLLM's own registry: Ray exports a counter only from its
        # first record, and Prometheus' rate()/increase() miss the first event of a series
        # that appears at 1 (an alert on vllm:nixl_num_failed_transfers would not fire on the
        # first failure). Ray's public inc() refuses 0 (UPSTREAM.md row 22).
        bound = super().labels(*labels, **labelskwargs)
        bound.metric._record(0.0, tags=bound._tags)
        return bound

    def inc(self, value: float = 1.0) -> None:
        if value:
            inc_later(self.metric, self._tags, value)


class _Histogram(_Labelled, RayHistogramWrapper):
    def observe(self, value: float) -> None:
        observe_later(self.metric, self._tags, value)


def stat_loggers(tier: str, pool: str, replica: str) -> list[type]:
    """AsyncLLM's `stat_loggers` for one engine: vLLM's Ray logger with tandem's labels, then
    vLLM's in-process Prometheus logger (with a custom Prometheus logger vLLM adds none itself).
    In this order: every PrometheusStatLogger's constructor first unregisters all `vllm:`
    collectors from the process's registry, so the one tandem reads must be made last."""
    extra = {"tier": tier, "pool": pool, "replica": replica}
    gauge = type("TandemRayGauge", (_Gauge,), {"extra": extra})
    counter = type("TandemRayCounter", (_Counter,), {"extra": extra})
    histogram = type("TandemRayHistogram", (_Histogram,), {"extra": extra})
    classes = {"_gauge_cls": gauge, "_counter_cls": counter, "_histogram_cls": histogram}
    logger = type("TandemRayStatLogger", (RayPrometheusStatLogger,), {
        **classes,
        "_kv_connector_cls": type("TandemRayKVConnectorProm", (RayKVConnectorProm,), classes),
        "_spec_decoding_cls": type("TandemRaySpecDecodingProm", (RaySpecDecodingProm,), classes),
        "_perf_metrics_cls": type("TandemRayPerfMetricsProm", (RayPerfMetricsProm,), classes),
    })
    return [logger, PrometheusStatLogger]
