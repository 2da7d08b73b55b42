"""The CPU replay's engine speed (loadtest/sim/validate.py): the run's own engines' unloaded
steps where it has a step log, the decode step's per-stream share measured per host class
(loadtest/bench/decode_slope.py → setups.decode_stream_share), and the ranking and reason-mix
figures the score gives beside the per-cell bar."""

from __future__ import annotations

import json

import pytest

from loadtest.bench.decode_slope import fit, together
from loadtest.sim.setups import decode_stream_share
from loadtest.sim.step_time import PRIOR_STREAM_SHARE
from loadtest.sim.step_record import warm_up_decode_step_ms
from loadtest.sim.validate import OWN_ENGINES, RESULTS, _pooled_reason_mixes, _ranking, replay_run

COLS = ["t_s", "ctx_tokens", "gen_reqs", "ms", "waiting"]


def test_the_decode_step_is_the_decode_engines_own_one_stream_steps():
    warm = {"columns": COLS, "span_s": 5.0, "per_core": [], "engines": {
        "interactive-prefill-r1": [[0.1, 0, 1, 500.0, 0]],  # the prefill engine's: not counted
        "interactive-decode-r2": [[0.2, 64, 1, 300.0, 0],  # a step with a prompt: not a decode step
                                  [0.3, 0, 1, 70.0, 0], [0.4, 0, 1, 80.0, 0], [0.5, 0, 2, 95.0, 0]]}}  # two streams: not counted
    run = {"systems": {"tandem-adaptive": {"warm_up_steps": warm}, "colocated-mbt256": {"rates": []}}}
    assert warm_up_decode_step_ms(run) == 75.0
    assert warm_up_decode_step_ms({"systems": {"colocated-mbt256": {"rates": []}}}) is None


def test_the_fit_is_least_squares_and_the_share_is_of_the_one_stream_step():
    got = fit([(1, 70.0), (2, 80.0), (4, 100.0), (8, 140.0)])
    assert got == {"intercept_ms": 60.0, "slope_ms_per_stream": 10.0, "per_stream_share": round(10 / 70, 4)}
    prompts = [r.prompt for r in together(16, 64, 128, 10_000)]
    assert len(set(prompts)) == 16 and all(len(p) == 64 and max(p) < 32_000 for p in prompts)


def _slope_result(folder, name, host_class, share):
    (folder / name).write_text(json.dumps({"machine": {"host_class": host_class},
                                           "fit": {"per_stream_share": share, "slope_ms_per_stream": 6.0}}))


def test_the_share_is_the_host_classes_newest_measurement_else_the_prior(tmp_path):
    _slope_result(tmp_path, "decode_slope-2026-12-01-avx2.json", "AVX2", 0.05)
    _slope_result(tmp_path, "decode_slope-2026-12-07-avx2.json", "AVX2", 0.09)
    _slope_result(tmp_path, "decode_slope-2026-12-07-amx.json", "AMX", 0.02)
    share, source = decode_stream_share("AVX2", tmp_path)
    assert share == 0.09 and "decode_slope-2026-12-07-avx2.json" in source
    assert decode_stream_share("AMX", tmp_path)[0] == 0.02
    share, source = decode_stream_share("AVX-512 BF16", tmp_path)
    assert share == PRIOR_STREAM_SHARE and "prior" in source and "AVX-512 BF16" in source


def test_the_committed_avx2_measurement_is_what_the_replay_reads():
    share, source = decode_stream_share("AVX2")
    assert 0.05 < share < 0.15 and source.startswith("decode_slope-")


def _cells(measured: dict[str, float], simulated: dict[str, float]) -> list[dict]:
    return [{"system": s, "measured": {"goodput_rps": measured[s]}, "simulated": {"goodput_rps": simulated[s]}} for s in measured]


def test_the_ranking_at_the_bars_tolerance_orders_only_pairs_told_apart():
    # 0.35 vs 0.375 measured is no order (within 0.15 req/s); the simulated 0.45 vs 0.30 neither (0.15 is not past it).
    r = _ranking(_cells({"a": 0.35, "b": 0.375}, {"a": 0.45, "b": 0.30}))
    assert not r["same_order"] and r["same_order_at_tolerance"]
    # measured apart (0.7 vs 0.5), simulated tied: not reproduced, strictly or at the tolerance.
    r = _ranking(_cells({"a": 0.5, "b": 0.7}, {"a": 0.7333, "b": 0.7333}))
    assert not r["same_order"] and r["pairs_disagreeing_at_tolerance"] == ["a vs b"]
    # simulated apart where the measurement saw the two equal: the simulator claims an order that was not there.
    r = _ranking(_cells({"a": 0.5, "b": 0.5}, {"a": 0.9, "b": 0.5}))
    assert not r["same_order_at_tolerance"]
    assert _ranking(_cells({"a": 0.9, "b": 0.3}, {"a": 0.8, "b": 0.5}))["same_order_at_tolerance"]


def test_reason_mixes_pool_a_runs_rates_per_system():
    def cell(system, measured, simulated):
        return {"system": system, "reasons": {"counts": {"measured": measured, "simulated": simulated}}}
    runs = [{"run": "r1", "cells": [cell("tandem-adaptive", {"remote/prefill_ok": 8, "local/short_uncached": 2},
                                         {"remote/prefill_ok": 10}),
                                    cell("tandem-adaptive", {"remote/prefill_ok": 2, "local/short_uncached": 8},
                                         {"local/short_uncached": 10}),
                                    cell("tandem-always", {"remote/always": 5}, {"remote/always": 5}),  # agrees by construction
                                    {"system": "colocated-mbt256"}]}]
    (pooled,) = _pooled_reason_mixes(runs)
    assert (pooled["run"], pooled["system"], pooled["worst_points"], pooled["within_10_points"]) == ("r1", "tandem-adaptive", 0.0, True)


@pytest.mark.parametrize("speed", ["own-engines", "calibration"])
def test_a_step_log_run_replays_at_its_own_engines_speed_unless_told(speed):
    path = RESULTS / "prefill_steps" / "first" / "goodput.json"
    run = json.loads(path.read_text())
    out = replay_run(path, speed=speed)
    if speed == "calibration":
        assert out["prefill_speed"]["from"] == "calibration"
        assert out["prefill_speed"]["unloaded_step_ms"] == run["calibration"]["unloaded_step_ms"]
    else:
        assert out["prefill_speed"]["from"] == OWN_ENGINES
        assert out["prefill_speed"]["unloaded_step_ms"] == round(warm_up_decode_step_ms(run), 2)
    assert out["cells"] and "per stream" in out["step_model"]["source"]
