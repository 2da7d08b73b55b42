"""loadtest/bench/decisions.py: the P/D decider's verdicts per load step, from the metrics page."""

from __future__ import annotations

from loadtest.bench.decisions import decision_counts, delta, fetch, settled

PAGE = """# HELP ray_tandem_pd_decisions_total The P/D decider's verdicts
# TYPE ray_tandem_pd_decisions_total counter
ray_tandem_pd_decisions_total{path="remote",reason="prefill_ok",tier="interactive",WorkerId="a"} 7.0
ray_tandem_pd_decisions_total{path="remote",reason="prefill_ok",tier="batch",WorkerId="a"} 1.0
ray_tandem_pd_decisions_total{path="local",reason="prefill_queue",tier="interactive",WorkerId="a"} 3.0
# HELP ray_tandem_routes_total other
# TYPE ray_tandem_routes_total counter
ray_tandem_routes_total{path="disaggregated",reason="",tier="interactive"} 11.0
"""


def test_counts_are_summed_over_tiers_and_other_families_ignored():
    assert decision_counts(PAGE) == {"remote/prefill_ok": 8.0, "local/prefill_queue": 3.0}


def test_a_step_reports_what_it_added():
    before = {"remote/prefill_ok": 8.0, "local/prefill_queue": 3.0}
    after = {"remote/prefill_ok": 10.0, "local/prefill_queue": 3.0, "local/local_faster": 4.0}
    assert delta(before, after) == {"local/local_faster": 4, "remote/prefill_ok": 2}
    assert delta({}, {}) == {}


def test_no_metrics_port_is_no_counts():
    assert fetch("http://127.0.0.1:9/metrics", timeout_s=0.5) == {}


def test_settled_reads_until_two_reads_agree():
    reads = iter([{"remote/prefill_ok": 1.0}, {"remote/prefill_ok": 3.0}, {"remote/prefill_ok": 3.0}, {"x": 9.0}])
    assert settled(lambda: next(reads), every_s=0.0) == {"remote/prefill_ok": 3.0}
