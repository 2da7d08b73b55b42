"""Percentiles and latency summaries: one convention for the SLO gate, the load-test report
and every benchmark's JSON, so their figures compare.

The convention is linear interpolation between ranks (numpy's default, "method=linear"): p50
is the median, p100 the maximum. Benchmark results recorded before loadtest/measure/ existed
took p90/p99 at the nearest lower rank instead (loadtest/bench/RESULTS.md says which).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

REPORT_PERCENTILES = (50.0, 90.0, 95.0, 99.0)  # the load-test report's columns
LATENCY_PERCENTILES = (50.0, 90.0, 99.0)  # what a benchmark's latency summary holds


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of `values`, interpolating linearly between ranks."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile {q} is outside 0..100")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(rank), math.ceil(rank)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


@dataclass(frozen=True)
class Summary:
    """Count, mean, max and the asked percentiles of some values (None / {} without values)."""

    count: int
    mean: float | None
    max: float | None
    percentiles: dict[float, float]


def summarize(values: Iterable[float], qs: Sequence[float] = REPORT_PERCENTILES) -> Summary:
    vals = list(values)
    if not vals:
        return Summary(0, None, None, {})
    return Summary(len(vals), math.fsum(vals) / len(vals), max(vals), {q: percentile(vals, q) for q in qs})


def latency_summary(values_ms: Iterable[float], digits: int = 1,
                    qs: Sequence[float] = LATENCY_PERCENTILES) -> dict:
    """The latency block every benchmark writes: {"p50_ms", "p90_ms", "p99_ms", "max_ms",
    "mean_ms", "n"}, rounded to `digits`; {"n": 0} without values."""
    s = summarize(values_ms, qs)
    if not s.count:
        return {"n": 0}
    out = {f"p{q:g}_ms": round(v, digits) for q, v in s.percentiles.items()}
    return {**out, "max_ms": round(s.max, digits), "mean_ms": round(s.mean, digits), "n": s.count}
