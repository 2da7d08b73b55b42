"""`python -m loadtest.sim matrix` (loadtest/sim/matrix.py, matrix_verdicts.py): the verdict step
by step on hand-made numbers, the decider's reasons counted, and one tiny matrix run (one cell,
two KV links) that must be byte-identical twice and carry its provenance."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtest.bench.workload import poisson_schedule
from loadtest.sim.control_plane import from_benchmark
from loadtest.sim.matrix import Cell, Grid, Workload, prepare, run_matrix
from loadtest.sim.matrix_verdicts import (AHEAD, BEHIND, NO_SIGN, REASONS, REUSE_DECLINED, best_per_setting,
                                          cell_verdicts, count_reasons, decider_literals, rule_report, verdict)

DECIDER = Path(__file__).resolve().parents[2] / "router" / "routing" / "decider.py"


def test_ahead_only_when_every_setting_is_ahead_by_more_than_the_margin():
    v = verdict([(1.2, 1.0), (1.5, 1.0)])
    assert v.label == AHEAD and (v.ratio_min, v.ratio_max) == (1.2, 1.5) and v.settings == 2
    assert verdict([(0.5, 1.0), (0.9, 1.0)]).label == BEHIND


def test_one_setting_within_the_margin_breaks_the_verdict():
    v = verdict([(1.2, 1.0), (1.04, 1.0)])
    assert v.label == NO_SIGN and "5% or less at 1 of 2" in v.why and (v.ratio_min, v.ratio_max) == (1.04, 1.2)


def test_the_margin_is_relative_to_the_winner_and_must_exceed_five_percent():
    assert verdict([(100.0, 95.0)]).label == NO_SIGN  # exactly 5% of the winner: noise
    assert verdict([(1.06, 1.0)]).label == AHEAD  # 0.06 / 1.06 = 5.7%
    assert verdict([(1.0, 1.052)]).label == NO_SIGN  # 0.052 / 1.052 = 4.9%
    assert verdict([(1.0, 1.06)]).label == BEHIND
    assert verdict([(1.2, 1.0)], margin=0.2).label == NO_SIGN  # 16.7% < 20%


def test_signs_that_differ_give_no_verdict_and_the_range():
    v = verdict([(1.2, 1.0), (0.8, 1.0), (1.0, 1.0)])
    assert v.label == NO_SIGN and "ahead at 1, behind at 1, equal at 1 of 3" in v.why
    assert (v.ratio_min, v.ratio_max) == (0.8, 1.2)
    assert verdict([(1.0, 1.0)]).label == NO_SIGN


def test_zero_goodput_sides():
    v = verdict([(2.0, 0.0), (3.0, 0.0)])  # the other met the SLO at no load: adaptive ahead, no ratio
    assert v.label == AHEAD and v.ratio_min is None and "no setting" in v.why
    assert verdict([(0.0, 0.0), (0.0, 0.0)]).label == NO_SIGN
    assert verdict([(0.0, 0.0), (2.0, 1.0)]).label == NO_SIGN  # equal at one, ahead at the other
    with pytest.raises(ValueError):
        verdict([])


def _row(system, candidate, rate, goodput, bw=None, cp=None, reasons=None, declined=0):
    return {"system": system, "candidate": candidate, "rate_rps": rate, "goodput_rps": goodput, "bandwidth_gbps": bw,
            "cp_scale": cp, "reasons": reasons or {}, "reuse_declined": declined}


def test_best_per_setting_takes_loads_and_splits_and_shares_the_colocated_run():
    rows = [_row("colocated", "colocated x4", 1.0, 1.0), _row("colocated", "colocated x4", 2.0, 1.5)]
    for bw, g in ((25.0, 1.0), (400.0, 2.0)):
        rows += [_row("adaptive", "adaptive 1P:3D", 1.0, g, bw, 1.0), _row("adaptive", "adaptive 2P:2D", 2.0, g + 0.5, bw, 1.0),
                 _row("always", "always 1P:3D", 2.0, g * 0.5, bw, 1.0)]
    best = best_per_setting(rows)
    assert list(best) == [(25.0, 1.0), (400.0, 1.0)]
    assert best[(25.0, 1.0)]["colocated"].goodput_rps == best[(400.0, 1.0)]["colocated"].goodput_rps == 1.5
    assert best[(400.0, 1.0)]["adaptive"].candidate == "adaptive 2P:2D" and best[(400.0, 1.0)]["adaptive"].goodput_rps == 2.5
    out = cell_verdicts(rows, top_rate=2.0)
    assert out["verdicts"]["adaptive vs always"]["label"] == AHEAD  # 1.5 vs 0.5, 2.5 vs 1.0
    # 25 Gbit/s: adaptive 1.5 ties colocated's 1.5; 400 Gbit/s: 2.5 vs 1.5. A tie breaks the sign.
    v = out["verdicts"]["adaptive vs colocated"]
    assert v["label"] == NO_SIGN and (v["ratio_min"], v["ratio_max"]) == (1.0, 1.6667)
    rows[1]["goodput_rps"] = 1.2  # colocated's best now 1.2 everywhere: ahead at both, by 20% and 52%
    assert cell_verdicts(rows, 2.0)["verdicts"]["adaptive vs colocated"]["label"] == AHEAD
    assert out["per_setting"][0]["adaptive"]["at_top_load"] is True  # its best came at the highest load


def test_reasons_cover_every_verdict_the_decider_can_return():
    assert decider_literals(DECIDER) == set(REASONS)


def test_rules_are_counted_per_mode_and_the_silent_ones_listed():
    rows = [_row("colocated", "colocated x2", 1.0, 1.0),
            _row("adaptive", "adaptive 1P:1D", 1.0, 1.0, 25.0, 1.0, {"remote/prefill_ok": 3, "local/prefill_queue": 1}, 2),
            _row("adaptive", "adaptive 1P:1D", 2.0, 1.0, 25.0, 1.0, {"remote/prefill_ok": 4}),
            _row("always", "always 1P:1D", 1.0, 1.0, 25.0, 1.0, {"remote/always": 5})]
    counts = count_reasons(rows)
    assert counts == {"adaptive": {"local/prefill_queue": 1, "remote/prefill_ok": 7, REUSE_DECLINED: 2},
                      "always": {"remote/always": 5}}
    report = rule_report(counts, measured=["whole/short_output"], replayed=["local/short_uncached"])
    assert report["rules"]["remote/prefill_ok"]["matrix_decisions"] == 7
    assert report["rules"]["whole/short_output"]["cpu_validation_measured"] is True
    assert report["rule_9"]["matrix_decisions"] == 2
    assert set(report["never_fired"]) == set(REASONS) - {"remote/prefill_ok", "local/prefill_queue", "remote/always",
                                                         "whole/short_output", "local/short_uncached"}
    assert report["unknown_reasons_seen"] == []


def test_the_control_plane_scale_multiplies_every_part():
    cost = from_benchmark("tandem")
    four = cost.scaled(4)
    assert cost.scaled(1) is cost
    assert four.per_token_cpu_s == pytest.approx(4 * cost.per_token_cpu_s) and four.hop_s == pytest.approx(4 * cost.hop_s)
    assert four.baseline_cores == pytest.approx(4 * cost.baseline_cores) and "x4" in four.source
    with pytest.raises(ValueError):
        cost.scaled(0)


TINY = Grid((Cell(8, "llama-3.1-70b", 4, Workload("tiny", 512, 16), 1.0, (0.5,), 1),), (25.0, 400.0), (1.0,), seed=3)


@pytest.fixture(scope="module")
def tiny():
    return run_matrix(TINY), run_matrix(TINY)


def test_a_tiny_matrix_is_deterministic_and_carries_its_provenance(tiny):
    (m1, r1), (m2, r2) = tiny
    assert json.dumps(m1, sort_keys=True) == json.dumps(m2, sort_keys=True)
    assert json.dumps(r1, sort_keys=True) == json.dumps(r2, sort_keys=True)
    assert m1["label"] == r1["label"] == "SIMULATED"
    prov = m1["provenance"]
    assert prov["step_time"]["llama-3.1-70b TP4"]["kind"] == "aiconfigurator_table"
    assert "validation" in prov["step_time"]["llama-3.1-70b TP4"]
    assert prov["kv_link"]["bandwidths_gbps"] == [25.0, 400.0] and "control_plane-issue27.json" in prov["control_plane"]["tandem"]
    assert m1["grid"]["seed"] == 3 and m1["grid"]["cp_scales"] == [1.0]
    cell = m1["cells"][0]
    assert cell["splits"] == ["colocated x2", "1P:1D"] and len(cell["rows"]) == 1 + 2 * 2  # colocated + 2 links x 2 modes
    assert set(cell["verdicts"]) == {"adaptive vs colocated", "adaptive vs always"}
    assert [(s["bandwidth_gbps"], s["cp_scale"]) for s in cell["per_setting"]] == [(25.0, 1.0), (400.0, 1.0)]
    assert m1["summary"][0]["cell"] == cell["cell"]


def test_every_tiny_request_has_one_decider_reason(tiny):
    (matrix, rules), _ = tiny
    cell = matrix["cells"][0]
    n = len(poisson_schedule(TINY.cells[0].workload.mix(), prepare(TINY, TINY.cells[0]).rates[0], 1.0, TINY.seed))
    for row in cell["rows"]:
        if row["system"] != "colocated":
            assert sum(row["reasons"].values()) == n
    assert rules["matrix_by_mode"]["always"] == {"remote/always": 2 * n}
    assert sum(v for k, v in rules["matrix_by_mode"]["adaptive"].items() if k != REUSE_DECLINED) == 2 * n
    assert rules["rules"]["remote/always"]["matrix_decisions"] == 2 * n
    assert set(rules["never_fired"]) <= set(REASONS)
