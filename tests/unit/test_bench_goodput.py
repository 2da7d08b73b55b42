"""The pure parts of the goodput benchmark (loadtest/bench/workload.py): the seeded Poisson
schedule and goodput from per-request records against a request Objective. No Ray, no vLLM."""

import statistics

import pytest

from loadtest.bench.workload import Mix, RequestKind, poisson_schedule, summarize
from loadtest.measure.percentiles import latency_summary
from loadtest.measure.record import RequestRecord
from loadtest.measure.slo import Objective


def SLO(ttft_s: float, itl_s: float, max_gap_s: float | None = None) -> Objective:
    """The benchmark's flags are seconds; the Objective is in ms."""
    return Objective(ttft_s * 1000, itl_s * 1000, None if max_gap_s is None else max_gap_s * 1000)

MIX = Mix(RequestKind("prefill-heavy", 40, 2), RequestKind("decode-heavy", 4, 30), prefill_share=0.7)


def test_schedule_is_seeded_and_distinct_per_seed_and_rate():
    a = poisson_schedule(MIX, 2.0, 50.0, seed=3)
    assert a == poisson_schedule(MIX, 2.0, 50.0, seed=3)
    assert a != poisson_schedule(MIX, 2.0, 50.0, seed=4)
    assert [r.at_s for r in a] != [r.at_s for r in poisson_schedule(MIX, 2.5, 50.0, seed=3)][:len(a)]


def test_schedule_is_a_poisson_process_of_the_mix():
    sched = poisson_schedule(MIX, 4.0, 500.0, seed=1)
    times = [r.at_s for r in sched]
    assert times == sorted(times) and 0 < times[0] and times[-1] < 500.0
    assert [r.index for r in sched] == list(range(len(sched)))
    # ~2000 arrivals: count within 5 sigma, exponential gaps with mean 1/rate
    assert abs(len(sched) - 2000) < 5 * 2000 ** 0.5
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert statistics.fmean(gaps) == pytest.approx(0.25, rel=0.06)
    assert statistics.pstdev(gaps) == pytest.approx(0.25, rel=0.1)  # exponential: sd = mean
    heavy = [r for r in sched if r.kind == "prefill-heavy"]
    assert len(heavy) / len(sched) == pytest.approx(0.7, abs=0.04)
    assert all(len(r.prompt) == 40 and r.max_tokens == 2 for r in heavy)
    assert all(len(r.prompt) == 4 and r.max_tokens == 30 for r in sched if r.kind == "decode-heavy")
    assert len({r.prompt for r in sched}) == len(sched)  # no prompt repeats: no prefix-cache hits


def test_schedule_rejects_bad_arguments():
    with pytest.raises(ValueError, match="positive"):
        poisson_schedule(MIX, 0.0, 10.0, seed=0)
    with pytest.raises(ValueError, match="prefill_share"):
        Mix(MIX.prefill_heavy, MIX.decode_heavy, 1.5)


def rec(i, ttft, decode_s, tokens, kind="decode-heavy", error=None):
    gaps = (decode_s * 1000 / (tokens - 1),) * (tokens - 1) if decode_s is not None and tokens > 1 else ()
    return RequestRecord(index=i, workload=kind, ttft_ms=None if ttft is None else ttft * 1000, token_gaps_ms=gaps,
                         usage_tokens=tokens, error=error or "")


def test_goodput_counts_only_requests_meeting_both_bounds():
    slo = SLO(ttft_s=1.0, itl_s=0.1)
    records = [
        rec(0, 0.5, 1.0, 11),  # ITL 0.1: meets (bounds are inclusive)
        rec(1, 1.0, 0.5, 11),  # TTFT exactly 1.0, ITL 0.05: meets
        rec(2, 1.2, 0.5, 11),  # TTFT too high
        rec(3, 0.3, 2.0, 11),  # ITL 0.2 too high
        rec(4, 0.3, None, 1, kind="prefill-heavy"),  # one token: no ITL, TTFT decides
        rec(5, None, None, 0, error="HTTP 500"),
        rec(6, 0.2, 0.0, 2, kind="prefill-heavy", error="unfinished"),
    ]
    s = summarize(records, slo, duration_s=10.0, span_s=12.0, cores=2)
    assert s["met_slo"] == 3 and s["requests"] == 7
    assert s["goodput_rps"] == pytest.approx(0.3)
    assert s["slo_attainment"] == pytest.approx(3 / 7, abs=1e-4)
    assert s["errors"] == 2 and s["completed"] == 5
    assert s["throughput_rps"] == pytest.approx(0.5)
    assert s["output_tokens"] == 11 * 4 + 1
    assert s["output_tokens_per_s_per_core"] == pytest.approx(45 / 12 / 2, abs=0.01)
    assert (s["by_kind"]["prefill-heavy"]["requests"], s["by_kind"]["prefill-heavy"]["met_slo"]) == (2, 1)
    assert s["by_kind"]["decode-heavy"]["met_slo"] == 2
    assert s["ttft"]["n"] == 5 and s["mean_itl"]["n"] == 4  # failed requests add no latency


def test_latency_summary_interpolates_between_ranks():
    values = [float(i) for i in range(1, 101)]  # 1..100 ms
    assert latency_summary(values) == {"p50_ms": 50.5, "p90_ms": 90.1, "p99_ms": 99.0, "max_ms": 100.0,
                                       "mean_ms": 50.5, "n": 100}
    assert latency_summary([]) == {"n": 0}


def test_max_gap_bound_catches_a_stall_the_mean_hides():
    gaps = (40.0,) * 100 + (800.0,)  # one 800 ms stall in 102 tokens: mean ITL ~47 ms
    stalled = RequestRecord(ttft_ms=200.0, token_gaps_ms=gaps, usage_tokens=102)
    assert SLO(1.0, 0.1).met_by(stalled)
    assert not SLO(1.0, 0.1, max_gap_s=0.25).met_by(stalled)
    assert SLO(1.0, 0.1, max_gap_s=0.25).met_by(rec(1, 0.2, 0.4, 11))
