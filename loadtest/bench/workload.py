"""The pure parts of the goodput benchmark: the seeded open-loop schedule and the goodput
arithmetic over per-request records. No Ray, no vLLM, no network: unit-tested alone.

Workload: a mix of prefill-heavy requests (long prompt, few output tokens) and decode-heavy
ones (short prompt, many output tokens), arriving as a Poisson process. Prompts are random
token ids, distinct per request, so no prompt is served from a prefix cache; output lengths
are exact (the client sends ignore_eos with a fixed max_tokens).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class RequestKind:
    name: str
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class Mix:
    prefill_heavy: RequestKind
    decode_heavy: RequestKind
    prefill_share: float  # probability that a request is prefill-heavy

    def __post_init__(self):
        if not 0.0 <= self.prefill_share <= 1.0:
            raise ValueError(f"prefill_share must lie in [0, 1], got {self.prefill_share}")


@dataclass(frozen=True)
class ScheduledRequest:
    index: int
    at_s: float  # arrival offset from the start of the run
    kind: str
    prompt: tuple[int, ...]
    max_tokens: int


@dataclass(frozen=True)
class SLO:
    ttft_s: float
    itl_s: float  # bound on a request's mean inter-token latency (decode time / (tokens - 1))
    # Optional bound on every gap between streamed chunks: a stall (another request's prefill
    # run in the same engine step) breaks it even when the mean ITL stays low.
    max_gap_s: Optional[float] = None


@dataclass(frozen=True)
class RequestRecord:
    """What the client saw of one request. `error` set: it failed (counts against goodput)."""

    index: int
    kind: str
    ttft_s: Optional[float]
    chunk_gaps_s: tuple[float, ...]  # time between consecutive streamed token chunks
    decode_s: Optional[float]  # first token → last token
    output_tokens: int
    error: Optional[str] = None

    @property
    def mean_itl_s(self) -> Optional[float]:
        if self.decode_s is None or self.output_tokens < 2:
            return None
        return self.decode_s / (self.output_tokens - 1)

    def meets(self, slo: SLO) -> bool:
        if self.error is not None or self.ttft_s is None or self.ttft_s > slo.ttft_s:
            return False
        if slo.max_gap_s is not None and max(self.chunk_gaps_s, default=0.0) > slo.max_gap_s:
            return False
        itl = self.mean_itl_s
        return itl is None or itl <= slo.itl_s


def poisson_schedule(mix: Mix, rate: float, duration_s: float, seed: int,
                     vocab: tuple[int, int] = (1000, 40000)) -> list[ScheduledRequest]:
    """Arrivals of a Poisson process of `rate` requests/s within [0, duration_s). The same
    (mix, rate, duration, seed) always gives the same requests, so every system serves the
    same trace at a given rate."""
    if rate <= 0 or duration_s <= 0:
        raise ValueError(f"rate and duration must be positive, got {rate} and {duration_s}")
    # The rate enters the seed so that different rates are independent traces.
    rng = random.Random(f"{seed}:{rate}")
    out: list[ScheduledRequest] = []
    at = rng.expovariate(rate)
    while at < duration_s:
        kind = mix.prefill_heavy if rng.random() < mix.prefill_share else mix.decode_heavy
        prompt = tuple(rng.randrange(*vocab) for _ in range(kind.prompt_tokens))
        out.append(ScheduledRequest(len(out), at, kind.name, prompt, kind.output_tokens))
        at += rng.expovariate(rate)
    return out


def percentiles(values: list[float], scale: float = 1000.0, digits: int = 1) -> dict:
    """p50 (median), p90 and p99 (nearest lower rank, as loadtest/bench/stats.py) in ms."""
    ordered = sorted(values)
    if not ordered:
        return {"n": 0}
    n = len(ordered)
    mid = (ordered[(n - 1) // 2] + ordered[n // 2]) / 2
    return {"p50_ms": round(mid * scale, digits),
            "p90_ms": round(ordered[int(0.9 * (n - 1))] * scale, digits),
            "p99_ms": round(ordered[int(0.99 * (n - 1))] * scale, digits), "n": n}


def summarize(records: list[RequestRecord], slo: SLO, duration_s: float, span_s: float, cores: int) -> dict:
    """Goodput and latency of one system at one rate.

    goodput: requests meeting the SLO per second of the arrival window (`duration_s`), the
    same denominator for every system. Output tokens/s per core: tokens the client received
    over `span_s` (first arrival → last response) divided by the cores the system used."""
    ok = [r for r in records if r.meets(slo)]
    done = [r for r in records if r.error is None]
    tokens = sum(r.output_tokens for r in done)
    by_kind = {}
    for kind in sorted({r.kind for r in records}):
        mine = [r for r in records if r.kind == kind]
        by_kind[kind] = {"requests": len(mine), "met_slo": sum(r.meets(slo) for r in mine),
                         "ttft": percentiles([r.ttft_s for r in mine if r.error is None]),
                         "mean_itl": percentiles([r.mean_itl_s for r in mine
                                                  if r.error is None and r.mean_itl_s is not None])}
    return {
        "requests": len(records),
        "completed": len(done),
        "errors": len(records) - len(done),
        "met_slo": len(ok),
        "slo_attainment": round(len(ok) / len(records), 4) if records else None,
        "goodput_rps": round(len(ok) / duration_s, 4),
        "throughput_rps": round(len(done) / duration_s, 4),
        # Latencies of completed requests; failed ones count only against goodput.
        "ttft": percentiles([r.ttft_s for r in done]),
        # Per-request mean inter-token latency (what the SLO bounds) and raw chunk gaps.
        "mean_itl": percentiles([r.mean_itl_s for r in done if r.mean_itl_s is not None]),
        "itl_chunk_gaps": percentiles([g for r in done for g in r.chunk_gaps_s]),
        "output_tokens": tokens,
        "output_tokens_per_s_per_core": round(tokens / span_s / cores, 2) if span_s > 0 else None,
        "span_s": round(span_s, 2),
        "by_kind": by_kind,
    }
