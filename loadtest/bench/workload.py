"""The pure parts of the goodput benchmark: the seeded open-loop schedule and the goodput
arithmetic over per-request records (loadtest/measure/record.py). No Ray, no vLLM, no
network: unit-tested alone.

Workload: a mix of prefill-heavy requests (long prompt, few output tokens) and decode-heavy
ones (short prompt, many output tokens), arriving as a Poisson process. Prompts are random
token ids, distinct per request, so no prompt is served from a prefix cache; output lengths
are exact (the client sends ignore_eos with a fixed max_tokens).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Optional

from loadtest.measure.percentiles import latency_summary
from loadtest.measure.record import RequestRecord
from loadtest.measure.slo import Objective


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


def kinds_in_turn(mix: Mix, n: int, first: int, max_tokens: Optional[int] = None) -> list[ScheduledRequest]:
    """`n` of each kind, alternating, for sending one at a time; distinct fixed prompts by index."""
    kinds = [mix.prefill_heavy, mix.decode_heavy] * n
    return [ScheduledRequest(first + i, 0.0, k.name, tuple(range(1000 + 7 * (first + i), 1000 + 7 * (first + i) + k.prompt_tokens)),
                             max_tokens or k.output_tokens) for i, k in enumerate(kinds)]


def warm_up_requests(mix: Mix, server: int = 0) -> list[ScheduledRequest]:
    """What the goodput benchmark sends each server (by its index) one at a time before the
    rates: two of each kind, 16 tokens out. The simulator's replay sends tandem the same."""
    return kinds_in_turn(mix, 2, 100 * server, max_tokens=16)


def summarize(records: list[RequestRecord], slo: Objective, duration_s: float, span_s: float, cores: int) -> dict:
    """Goodput and latency of one system at one rate.

    goodput: requests meeting the SLO per second of the arrival window (`duration_s`), the
    same denominator for every system. Output tokens/s per core: tokens the client received
    over `span_s` (first arrival → last response) divided by the cores the system used."""
    ok = [r for r in records if slo.met_by(r)]
    done = [r for r in records if r.ok]
    tokens = sum(r.output_tokens for r in done)
    by_kind = {}
    for kind in sorted({r.workload for r in records}):
        mine = [r for r in records if r.workload == kind]
        by_kind[kind] = {"requests": len(mine), "met_slo": sum(slo.met_by(r) for r in mine),
                         "ttft": latency_summary([r.ttft_ms for r in mine if r.ok]),
                         "mean_itl": latency_summary([r.mean_itl_ms for r in mine
                                                      if r.ok and r.mean_itl_ms is not None])}
    return {
        "requests": len(records),
        "completed": len(done),
        "errors": len(records) - len(done),
        "met_slo": len(ok),
        "slo_attainment": round(len(ok) / len(records), 4) if records else None,
        "goodput_rps": round(len(ok) / duration_s, 4),
        "throughput_rps": round(len(done) / duration_s, 4),
        # Latencies of completed requests; failed ones count only against goodput.
        "ttft": latency_summary([r.ttft_ms for r in done]),
        # Per-request mean inter-token latency (what the SLO bounds) and the raw gaps between
        # streamed chunks (the client asks for no token ids: a chunk counts as one token).
        "mean_itl": latency_summary([r.mean_itl_ms for r in done if r.mean_itl_ms is not None]),
        "itl_chunk_gaps": latency_summary([g for r in done for g in r.token_gaps_ms]),
        "output_tokens": tokens,
        "output_tokens_per_s_per_core": round(tokens / span_s / cores, 2) if span_s > 0 else None,
        "span_s": round(span_s, 2),
        "by_kind": by_kind,
    }
