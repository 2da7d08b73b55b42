"""Service-level objectives over RequestRecords, asked two ways:

- `SLO`: percentile bounds over a whole run (the load test's pass/fail gate). In YAML, inside
  a load file (loadtest/spec.py), so a pydantic model:

      slo:
        ttft_ms: {p50: 300, p95: 800}     # upper bounds, milliseconds
        itl_ms: {p95: 50}                 # every inter-token gap (RequestRecord.itl_ms)
        e2e_ms: {p99: 20000}
        tokens_per_s: {p50: 30}           # LOWER bounds: per-stream decode rate
        max_error_rate: 0.01              # failed requests / all requests
        min_requests: 5

- `Objective`: bounds one request meets or misses (goodput counts the requests that meet
  it: loadtest/bench/goodput.py). Made from command-line flags, so a frozen dataclass.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator

from loadtest.measure.percentiles import percentile
from loadtest.measure.record import RequestRecord, Samples

_PCT = re.compile(r"^p(\d{1,2}(\.\d+)?|100)$")


def parse_percentile(key: str) -> float:
    """'p95' -> 95.0, 'p99.9' -> 99.9."""
    m = _PCT.match(key)
    if not m:
        raise ValueError(f"{key!r} is not a percentile; write p50, p95, p99.9 ...")
    return float(m.group(1))


def _check_bounds(v: dict[str, float]) -> dict[str, float]:
    for key, bound in v.items():
        parse_percentile(key)
        if bound <= 0:
            raise ValueError(f"{key}: the bound must be positive, got {bound}")
    return v


class SLO(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    ttft_ms: dict[str, float] = Field(default_factory=dict)
    itl_ms: dict[str, float] = Field(default_factory=dict)
    e2e_ms: dict[str, float] = Field(default_factory=dict)
    tokens_per_s: dict[str, float] = Field(default_factory=dict)
    max_error_rate: float = Field(0.0, ge=0.0, le=1.0)
    min_requests: int = Field(1, ge=1, description="fewer successful requests than this fails the gate")

    _check = field_validator("ttft_ms", "itl_ms", "e2e_ms", "tokens_per_s")(_check_bounds)


@dataclass(frozen=True)
class Verdict:
    """One bound checked against the run. `observed` is None when there were no samples."""

    bound: str  # e.g. "ttft_ms p95 <= 800"
    observed: Optional[float]
    ok: bool

    def line(self) -> str:
        seen = "no samples" if self.observed is None else f"{self.observed:.4g}"
        return f"{'PASS' if self.ok else 'FAIL'}  {self.bound}  (observed {seen})"


def evaluate(slo: SLO, samples: Samples) -> list[Verdict]:
    """Every bound of the SLO, checked against the run's exact samples (Locust's own
    percentiles are bucketed: fine for its UI, not for a gate)."""
    verdicts: list[Verdict] = []
    ok_requests = samples.requests - samples.errors
    verdicts.append(Verdict(f"successful requests >= {slo.min_requests}", float(ok_requests),
                            ok_requests >= slo.min_requests))
    verdicts.append(Verdict(f"error_rate <= {slo.max_error_rate:g}", samples.error_rate,
                            samples.error_rate <= slo.max_error_rate))
    for metric, upper in (("ttft_ms", True), ("itl_ms", True), ("e2e_ms", True), ("tokens_per_s", False)):
        values = samples.values(metric)
        for key, bound in getattr(slo, metric).items():
            text = f"{metric} {key} {'<=' if upper else '>='} {bound:g}"
            if not values:
                verdicts.append(Verdict(text, None, False))
                continue
            seen = percentile(values, parse_percentile(key))
            verdicts.append(Verdict(text, seen, seen <= bound if upper else seen >= bound))
    return verdicts


def passed(verdicts: list[Verdict]) -> bool:
    return all(v.ok for v in verdicts)


@dataclass(frozen=True)
class Objective:
    """What one request must meet (bounds inclusive): TTFT, its mean inter-token latency
    and, optionally, every gap between its tokens: a stall (another request's prefill in the
    same engine step) breaks that even when the mean stays low."""

    ttft_ms: float
    mean_itl_ms: float
    max_gap_ms: Optional[float] = None

    def met_by(self, r: RequestRecord) -> bool:
        if not r.ok or r.ttft_ms is None or r.ttft_ms > self.ttft_ms:
            return False
        if self.max_gap_ms is not None and r.max_gap_ms > self.max_gap_ms:
            return False
        itl = r.mean_itl_ms
        return itl is None or itl <= self.mean_itl_ms
