"""The latency summary every benchmark writes, so their JSON files compare field for field."""

from __future__ import annotations

import statistics


def latency_summary(values_ms: list[float], digits: int = 2) -> dict:
    """p50 (median), p90 (nearest lower rank), mean and count of latencies in ms."""
    ordered = sorted(values_ms)
    if not ordered:
        return {"n": 0}
    return {"p50_ms": round(statistics.median(ordered), digits),
            "p90_ms": round(ordered[int(0.9 * (len(ordered) - 1))], digits),
            "mean_ms": round(statistics.fmean(ordered), digits), "n": len(ordered)}
