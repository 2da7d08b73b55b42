"""Per-request measurements and their percentiles. Pure: no Locust, no I/O.

Locust's own percentiles are bucketed (rounded response times), which is fine for its UI but
not for a pass/fail gate, so the gate works on the exact samples kept here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence

# The metrics an SLO can bound; all per request except itl_ms (one sample per token gap).
METRICS = ("ttft_ms", "itl_ms", "e2e_ms", "tokens_per_s")
REPORT_PERCENTILES = (50.0, 90.0, 95.0, 99.0)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between ranks (numpy's default)."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile {q} is outside 0..100")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(rank), math.ceil(rank)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


@dataclass(frozen=True)
class RequestRecord:
    """One streamed request as the client saw it. Times are seconds since the run started.

    `itl_ms` holds every inter-token gap: a chunk that carries k tokens after a gap g counts
    as k gaps of g/k, so the mean ITL equals (e2e - ttft) / (tokens - 1), as aiperf reports it.
    `tokens_per_s` is the stream's decode rate, (tokens - 1) / (last token - first token).
    """

    start_s: float
    workload: str
    tier: str
    ok: bool
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft_ms: Optional[float] = None
    e2e_ms: Optional[float] = None
    itl_ms: tuple[float, ...] = ()
    error: str = ""

    @property
    def tokens_per_s(self) -> Optional[float]:
        if self.ttft_ms is None or self.e2e_ms is None or self.output_tokens < 2:
            return None
        decode_s = (self.e2e_ms - self.ttft_ms) / 1000.0
        return (self.output_tokens - 1) / decode_s if decode_s > 0 else None


@dataclass
class Samples:
    """All records of a run, in completion order."""

    records: list[RequestRecord] = field(default_factory=list)

    def add(self, record: RequestRecord) -> None:
        self.records.append(record)

    def values(self, metric: str, workload: Optional[str] = None) -> list[float]:
        """Samples of one metric over the successful requests (optionally one workload)."""
        if metric not in METRICS:
            raise ValueError(f"unknown metric {metric!r}; one of {', '.join(METRICS)}")
        out: list[float] = []
        for r in self.records:
            if not r.ok or (workload is not None and r.workload != workload):
                continue
            if metric == "itl_ms":
                out.extend(r.itl_ms)
            else:
                v = getattr(r, metric)
                if v is not None:
                    out.append(v)
        return out

    @property
    def requests(self) -> int:
        return len(self.records)

    @property
    def errors(self) -> int:
        return sum(1 for r in self.records if not r.ok)

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.records else 0.0

    def workloads(self) -> list[str]:
        return sorted({r.workload for r in self.records})


@dataclass(frozen=True)
class MetricSummary:
    metric: str
    count: int
    mean: Optional[float]
    percentiles: dict[float, float]


def summarize(values: Iterable[float], metric: str, qs: Sequence[float] = REPORT_PERCENTILES) -> MetricSummary:
    vals = list(values)
    if not vals:
        return MetricSummary(metric, 0, None, {})
    return MetricSummary(metric, len(vals), sum(vals) / len(vals), {q: percentile(vals, q) for q in qs})
