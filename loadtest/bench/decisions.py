"""How many requests tandem's P/D decider sent remote, local or whole to prefill, and why, per
load step of a benchmark: the gateway's `tandem_pd_decisions` counter (router/routing/metrics.py)
and, as `route:path/reason`, the path each request took in the end (`tandem_route`,
router/path_metrics.py: a fallback to recompute shows there), read from the local Ray's metrics
port before and after the step. Pure parsing and arithmetic, and one
fetch that answers {} when the port does not (a system without tandem's gateway)."""

from __future__ import annotations

import time
import urllib.request
from typing import Callable, Mapping

from prometheus_client.parser import text_string_to_metric_families

# As Ray's metrics agent exports the gateway's counters → the prefix of their keys.
FAMILIES = {"ray_tandem_pd_decisions": "", "ray_tandem_route": "route:"}


def decision_counts(text: str) -> dict[str, float]:
    """{"path/reason": count} summed over tiers and replicas, from a Prometheus text page."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        prefix = FAMILIES.get(family.name)
        if prefix is None:
            continue
        for sample in family.samples:
            if sample.name.endswith("_total"):
                key = f"{prefix}{sample.labels.get('path', '?')}/{sample.labels.get('reason', '?')}"
                out[key] = out.get(key, 0.0) + sample.value
    return out


def delta(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, int]:
    """What the step added, keys with nothing added left out."""
    return {k: int(round(v - before.get(k, 0.0))) for k, v in sorted(after.items()) if v - before.get(k, 0.0) >= 0.5}


def fetch(url: str, timeout_s: float = 5.0) -> dict[str, float]:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return decision_counts(resp.read().decode("utf-8", "replace"))
    except OSError:
        return {}


REPORT_INTERVAL_S = 10.0  # Ray's RAY_metrics_report_interval_ms default, which tandem keeps


def settled(read: Callable[[], dict[str, float]], every_s: float = REPORT_INTERVAL_S + 1,
            timeout_s: float = 60.0) -> dict[str, float]:
    """`read()` once two reads `every_s` apart agree: Ray's metrics agent passes a replica's
    counters on once per report interval, so a read right after a load step can miss its last
    verdicts (and count them in the next step); reads closer than the interval can agree on a
    stale page."""
    last = read()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(every_s)
        now = read()
        if now == last:
            return now
        last = now
    return last
