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
every gauge set here is recorded again each second by one daemon thread per process. The same
thread records the counters' increments and the histograms' observations made since its last
pass (`_Pending`: off the event loop, a counter's second summed into one record).

Outside a Ray worker (unit tests) recording is a silent no-op.

The classes mirror prometheus_client's call style, `METRIC.labels(tier=..).inc()`, so call
sites read the same as any Prometheus code.
"""

from __future__ import annotations

import atexit
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
        the first event); Ray's public `inc` refuses 0, so that one goes through `_record`.
        Other increments are summed here and recorded once a second (`_Pending`)."""
        if amount < 0:
            raise ValueError(f"a counter only goes up, got {amount}")
        if amount == 0:
            self._metric._record(0.0, tags=self._tags)
        else:
            _PENDING.inc(self._metric, self._tags, amount)


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
        _PENDING.observe(self._metric, self._tags, value)


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


class _Pending:
    """Counter increments and histogram observations of this process since the last flush.

    Why: one Ray record costs ~15-20 us of CPU (its tags cross into Ray's core each time), and
    the gateway counts every streamed token (tandem_output_tokens, tandem_itl_seconds): at GPU
    token rates that was a tenth of its event loop. Here a record is a dict update under a lock;
    the keeper thread records a counter's sum once per flush and the observations off the event
    loop. Ray exports every 10 s by default, so a second's delay is not seen."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[int, tuple], tuple[object, dict[str, str], float]] = {}
        self._observed: list[tuple[object, dict[str, str], float]] = []

    def inc(self, metric, tags: dict[str, str], amount: float) -> None:
        key = (id(metric), tuple(tags.items()))
        with self._lock:
            entry = self._counts.get(key)
            self._counts[key] = (metric, tags, amount if entry is None else entry[2] + amount)
            if entry is None and len(self._counts) == 1 and not self._observed:
                _KEEPER.start()

    def observe(self, metric, tags: dict[str, str], value: float) -> None:
        with self._lock:
            self._observed.append((metric, tags, value))
            if len(self._observed) == 1 and not self._counts:
                _KEEPER.start()

    def flush(self) -> None:
        with self._lock:
            counts, self._counts = self._counts, {}
            observed, self._observed = self._observed, []
        for metric, tags, amount in counts.values():
            metric.inc(amount, tags=tags)
        for metric, tags, value in observed:
            metric.observe(value, tags=tags)


_PENDING = _Pending()


class _GaugeKeeper:
    """Records every value of the gauges it watches again each REPUBLISH_INTERVAL_S, and the
    values of raw Ray gauges kept through `set_kept` (vLLM's, cluster/engine/vllm_ray_metrics.py)."""

    def __init__(self) -> None:
        self._gauges: list[Gauge] = []
        self._kept: dict[tuple[int, tuple], tuple[object, dict[str, str], float]] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def keep(self, metric, tags: dict[str, str], value: float) -> None:
        with self._lock:
            self._kept[(id(metric), tuple(tags.items()))] = (metric, tags, value)
        if self._thread is None:
            self.start()

    def watch(self, gauge: "Gauge") -> None:
        with self._lock:
            self._gauges.append(gauge)
        self.start()

    def start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="tandem-gauge-keeper", daemon=True)
                self._thread.start()
                atexit.register(_PENDING.flush)

    def _run(self) -> None:
        while True:
            time.sleep(REPUBLISH_INTERVAL_S)
            with self._lock:
                gauges, kept = list(self._gauges), list(self._kept.values())
            for gauge in gauges:
                gauge.republish()
            for metric, tags, value in kept:
                metric.set(value, tags=tags)
            _PENDING.flush()


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


# For Ray metrics made elsewhere (vLLM's Ray stat logger, cluster/engine/vllm_ray_metrics.py): the
# same off-the-caller's-thread recording as the classes above, for a raw `ray.util.metrics` metric.
def inc_later(metric: ray_metrics.Counter, tags: dict[str, str], amount: float) -> None:
    """Add `amount` to a Ray counter within a second, summed with this second's other increments."""
    _PENDING.inc(metric, tags, amount)


def observe_later(metric: ray_metrics.Histogram, tags: dict[str, str], value: float) -> None:
    """Observe `value` on a Ray histogram within a second, from the keeper thread."""
    _PENDING.observe(metric, tags, value)


def set_kept(metric: ray_metrics.Gauge, tags: dict[str, str], value: float) -> None:
    """Set a Ray gauge within a second, and record it again every second after (Ray's TTL)."""
    _KEEPER.keep(metric, tags, value)
