"""tandem's Prometheus metrics, recorded as Ray metrics.

Every process of the cluster (the gateway, each engine replica, Serve's controller running the
autoscaling policy) records through `ray.util.metrics`; each Ray node's metrics agent exports
what its processes recorded on one port (`ray.metrics_export_port`, 8080 by default, the
port KubeRay's pods name `metrics`). So one scrape target per node sees every replica, however
many gateway or engine replicas Serve runs, and nothing is served on the public API port.

Ray prefixes every name with `ray_` and adds `_total` to counters: the counter declared here as
`tandem_route` is scraped as `ray_tandem_route_total`. Ray also adds labels of its own
(WorkerId, NodeAddress, SessionName, ...): aggregate with `sum by (...)`. Values reach the
metrics port within Ray's report interval (`RAY_metrics_report_interval_ms`, 10 s default).

Ray's exporter drops a gauge series that is not recorded again within two report intervals
(its stale-series TTL), so a gauge holding still (a queue at 0) would vanish from the scrape;
every gauge set here is recorded again each second by one daemon thread per process.

Outside a Ray worker (unit tests) recording is a silent no-op.

The classes mirror prometheus_client's call style, `METRIC.labels(tier=..).inc()`, so call
sites read the same as any Prometheus code.
"""

from __future__ import annotations

import threading
import time
from typing import Sequence

from ray.util import metrics as ray_metrics

# Seconds: from 5 ms (an inter-token gap on a GPU) to two minutes (a long prompt queued on CPU).
LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0,
                     5.0, 7.5, 10.0, 20.0, 30.0, 60.0, 120.0)


class _Metric:
    def __init__(self, labelnames: Sequence[str]):
        self.labelnames = tuple(labelnames)

    def _tags(self, values: Sequence[str], kwargs: dict[str, str]) -> dict[str, str]:
        if values:
            if len(values) != len(self.labelnames):
                raise ValueError(f"expected labels {self.labelnames}, got {values}")
            kwargs = dict(zip(self.labelnames, values))
        if set(kwargs) != set(self.labelnames):
            raise ValueError(f"expected labels {self.labelnames}, got {sorted(kwargs)}")
        return {k: str(v) for k, v in kwargs.items()}


class Counter(_Metric):
    """A monotonically increasing count; exported as `ray_<name>_total`."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = ()):
        super().__init__(labelnames)
        self._metric = ray_metrics.Counter(name, documentation, tag_keys=self.labelnames)

    def labels(self, *values: str, **kwargs: str) -> "_BoundCounter":
        return _BoundCounter(self._metric, self._tags(values, kwargs))

    def inc(self, amount: float = 1.0) -> None:
        self.labels().inc(amount)


class _BoundCounter:
    def __init__(self, metric, tags: dict[str, str]):
        self._metric, self._tags = metric, tags

    def inc(self, amount: float = 1.0) -> None:
        """`inc(0)` creates the series at 0 (dashboards and alerts see 0, not "no data", before
        the first event); Ray's public `inc` refuses 0, so that one goes through `_record`."""
        if amount < 0:
            raise ValueError(f"a counter only goes up, got {amount}")
        if amount == 0:
            self._metric._record(0.0, tags=self._tags)
        else:
            self._metric.inc(amount, tags=self._tags)


class Histogram(_Metric):
    """A distribution; exported as `ray_<name>_bucket`, `_sum` and `_count`."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = (),
                 buckets: Sequence[float] = LATENCY_BUCKETS_S):
        super().__init__(labelnames)
        self._metric = ray_metrics.Histogram(name, documentation, boundaries=list(buckets),
                                             tag_keys=self.labelnames)

    def labels(self, *values: str, **kwargs: str) -> "_BoundHistogram":
        return _BoundHistogram(self._metric, self._tags(values, kwargs))

    def observe(self, value: float) -> None:
        self.labels().observe(value)


class _BoundHistogram:
    def __init__(self, metric, tags: dict[str, str]):
        self._metric, self._tags = metric, tags

    def observe(self, value: float) -> None:
        self._metric.observe(value, tags=self._tags)


class Gauge(_Metric):
    """A value that goes up and down. Ray's gauge only sets, so inc/dec keep the value here,
    per label set, in this process (one event loop: no lock needed)."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = ()):
        super().__init__(labelnames)
        self._metric = ray_metrics.Gauge(name, documentation, tag_keys=self.labelnames)
        self._values: dict[tuple[tuple[str, str], ...], float] = {}

    def labels(self, *values: str, **kwargs: str) -> "_BoundGauge":
        return _BoundGauge(self, self._tags(values, kwargs))

    def set(self, value: float) -> None:
        self.labels().set(value)

    def republish(self) -> None:
        """Record every label set's current value again (the keeper thread calls this)."""
        for key, value in list(self._values.items()):
            self._metric.set(value, tags=dict(key))


REPUBLISH_INTERVAL_S = 1.0  # under the TTL at Ray's fastest report interval (2 x 1 s)


class _GaugeKeeper:
    """Records every value of the gauges it watches again each REPUBLISH_INTERVAL_S."""

    def __init__(self) -> None:
        self._gauges: list[Gauge] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def watch(self, gauge: "Gauge") -> None:
        with self._lock:
            self._gauges.append(gauge)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="tandem-gauge-keeper", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(REPUBLISH_INTERVAL_S)
            with self._lock:
                gauges = list(self._gauges)
            for gauge in gauges:
                gauge.republish()


_KEEPER = _GaugeKeeper()


class _BoundGauge:
    def __init__(self, gauge: Gauge, tags: dict[str, str]):
        self._gauge, self._tags = gauge, tags
        self._key = tuple(sorted(tags.items()))

    def set(self, value: float) -> None:
        if not self._gauge._values:
            _KEEPER.watch(self._gauge)  # the first value of this gauge in this process
        self._gauge._values[self._key] = value
        self._gauge._metric.set(value, tags=self._tags)

    def inc(self, amount: float = 1.0) -> None:
        self.set(self._gauge._values.get(self._key, 0.0) + amount)

    def dec(self, amount: float = 1.0) -> None:
        self.inc(-amount)
