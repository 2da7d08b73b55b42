"""The SLO gate and the percentiles it rests on (loadtest/measure/slo.py, percentiles.py,
record.py). Pure."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from loadtest.measure.percentiles import percentile, summarize
from loadtest.measure.record import RequestRecord, Samples
from loadtest.measure.slo import SLO, evaluate, parse_percentile, passed


def test_percentile_interpolates_like_numpy():
    values = [1.0, 2.0, 3.0, 4.0]
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 4.0
    assert percentile(values, 50) == 2.5
    assert percentile(values, 95) == pytest.approx(3.85)
    assert percentile([7.0], 99) == 7.0
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0  # unsorted input


def test_percentile_rejects_empty_and_out_of_range():
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_parse_percentile():
    assert parse_percentile("p50") == 50.0
    assert parse_percentile("p99.9") == 99.9
    assert parse_percentile("p100") == 100.0
    for bad in ("50", "p", "p101", "P50", "p-1"):
        with pytest.raises(ValueError):
            parse_percentile(bad)


def rec(ttft: float, e2e: float, itl: tuple[float, ...]) -> RequestRecord:
    """One token per chunk: every gap is an ITL sample as it is."""
    return RequestRecord(start_s=0.0, workload="chat", tier="interactive", prompt_tokens=8, ttft_ms=ttft,
                         e2e_ms=e2e, token_gaps_ms=itl)


def run_samples() -> Samples:
    s = Samples()
    for i in range(10):  # TTFT 100..1000 ms; 4 gaps of 10 ms; e2e = ttft + 40 ms
        s.add(rec(100.0 * (i + 1), 100.0 * (i + 1) + 40.0, (10.0,) * 4))
    return s


def test_tokens_per_s_is_the_decode_rate():
    r = rec(100.0, 140.0, (10.0,) * 4)  # 5 tokens, 4 gaps in 40 ms
    assert r.tokens_per_s == pytest.approx(100.0)
    assert rec(100.0, 100.0, ()).tokens_per_s is None  # one token: no rate


def test_failed_requests_count_as_errors_but_not_as_latency():
    s = run_samples()
    s.add(RequestRecord(workload="chat", tier="interactive", error="HTTP 500"))
    assert s.requests == 11 and s.errors == 1
    assert s.error_rate == pytest.approx(1 / 11)
    assert len(s.values("ttft_ms")) == 10
    assert len(s.values("itl_ms")) == 40


def test_slo_passes_and_fails_on_the_right_bound():
    s = run_samples()
    ok = SLO(ttft_ms={"p50": 600, "p95": 1000}, itl_ms={"p99": 10}, tokens_per_s={"p50": 90},
             max_error_rate=0.0)
    assert passed(evaluate(ok, s))
    tight = SLO(ttft_ms={"p50": 600, "p95": 900})
    verdicts = evaluate(tight, s)
    failed = [v for v in verdicts if not v.ok]
    assert [v.bound for v in failed] == ["ttft_ms p95 <= 900"]
    assert failed[0].observed == pytest.approx(955.0)
    assert "FAIL" in failed[0].line() and "955" in failed[0].line()


def test_tokens_per_s_is_a_lower_bound():
    verdicts = evaluate(SLO(tokens_per_s={"p50": 101}), run_samples())
    assert [v.bound for v in verdicts if not v.ok] == ["tokens_per_s p50 >= 101"]


def test_error_rate_and_empty_runs_fail():
    s = run_samples()
    s.add(RequestRecord(workload="chat", tier="interactive", error="boom"))
    assert [v.bound for v in evaluate(SLO(max_error_rate=0.05), s) if not v.ok] == ["error_rate <= 0.05"]
    empty = [v for v in evaluate(SLO(ttft_ms={"p50": 1}), Samples()) if not v.ok]
    assert {v.bound for v in empty} == {"successful requests >= 1", "ttft_ms p50 <= 1"}


def test_slo_model_rejects_bad_input():
    with pytest.raises(ValidationError, match="not a percentile"):
        SLO(ttft_ms={"95": 800})
    with pytest.raises(ValidationError, match="positive"):
        SLO(itl_ms={"p95": 0})
    with pytest.raises(ValidationError):
        SLO(ttft_ms={"p95": 1}, latency=3)  # unknown key
    with pytest.raises(ValidationError):
        SLO(max_error_rate=1.5)


def test_summarize():
    s = summarize([1.0, 2.0, 3.0])
    assert s.count == 3 and s.mean == 2.0 and s.percentiles[50.0] == 2.0
    assert summarize([]).count == 0
