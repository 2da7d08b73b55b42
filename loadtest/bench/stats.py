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


def rank(ordered: list[float], q: float) -> float:
    """The q-quantile (0..1) of sorted values at the nearest lower rank, the convention of
    latency_summary's p90 and workload.percentiles: with 200 gaps, p99 is the 3rd largest."""
    return ordered[int(q * (len(ordered) - 1))]


def tail_summary(values_ms: list[float], digits: int = 1) -> dict:
    """p50 (median), p90, p99, max, mean and count of latencies in ms: for stalls the tail
    and the worst case matter as much as the median."""
    ordered = sorted(values_ms)
    if not ordered:
        return {"n": 0}
    return {"p50_ms": round(statistics.median(ordered), digits), "p90_ms": round(rank(ordered, 0.9), digits),
            "p99_ms": round(rank(ordered, 0.99), digits), "max_ms": round(ordered[-1], digits),
            "mean_ms": round(statistics.fmean(ordered), digits), "n": len(ordered)}
