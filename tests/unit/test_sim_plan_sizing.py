"""`tandem plan --gpus`: the budget's parsing, its splits, the sized configs and the pick
(loadtest/sim/plan_sizing.py, plan_gpus.py), and one small end-to-end plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cluster.cli import main
from cluster.config import ClusterConfig
from cluster.config.pools import AutoscalingConfig
from loadtest.sim.plan_gpus import gpu_kv_bytes, sized_config
from loadtest.sim.plan_search import Bisection, Capacity, Search, capacity
from loadtest.sim.plan_sizing import (GpuBudget, Split, TensorParallel, auto_rates, capacity_rps, drain_s, fit_duration,
                                      recommend, score, splits)
from loadtest.sim.step_table import TableStepTime

CONFIGS = Path(__file__).resolve().parents[2] / "loadtest" / "sim" / "configs"


def search(spec: Search, run) -> list[dict]:
    """One candidate's whole search as plan_gpus drives it, a run at a time: the rows in order."""
    b = Bisection(spec)
    while (x := b.next_load()) is not None:
        b.add(x, run(x))
    return b.rows


@pytest.mark.parametrize("text,count,gpu", [("16xH200", 16, "H200"), (" 8 x h100 ", 8, "H100"), ("64×H200", 64, "H200"),
                                            ("4*H100", 4, "H100")])
def test_gpu_budget_parses(text, count, gpu):
    assert GpuBudget.parse(text) == GpuBudget(count, gpu)


@pytest.mark.parametrize("text", ["H200", "16", "0xH200", "16xA100", "16x", "x16H200", "-2xH200"])
def test_gpu_budget_rejects(text):
    with pytest.raises(ValueError):
        GpuBudget.parse(text)


def test_engines_are_whole_tp_groups():
    assert splits(16, TensorParallel.uniform(4), 7)[0] == Split(0, 4, 4, 4)
    ten = splits(10, TensorParallel.uniform(4), 7)  # 2 GPUs left idle
    assert [(s.label, s.gpus) for s in ten] == [("colocated x2", 8), ("1P:1D", 8)]
    with pytest.raises(ValueError, match="2 GPUs hold no whole engine of TP4"):
        splits(2, TensorParallel.uniform(4), 7)
    with pytest.raises(ValueError, match="--decode-tp must be >= 1"):
        TensorParallel(1, 1, 0)


def test_splits_use_every_engine_colocated_first():
    got = splits(16, TensorParallel.uniform(4), 7)
    assert [s.label for s in got] == ["colocated x4", "1P:3D", "2P:2D", "3P:1D"]
    assert got[0].colocated and not any(s.colocated for s in got[1:])
    assert all(s.engines == 4 and s.gpus == 16 and s.prefill_tp == s.decode_tp == 4 for s in got)
    assert splits(8, TensorParallel.uniform(8), 7) == (Split(0, 1, 8, 8),)  # one engine: nothing to disaggregate


def test_mixed_tp_splits_count_each_pools_gpus_and_keep_those_no_engine_fits_beside():
    # 16 GPUs, prefill TP1, decode TP4: P + 4D <= 16 with no room left for another engine of either pool.
    got = splits(16, TensorParallel(2, 1, 4), 7)
    assert got[0] == Split(0, 8, 2, 2) and got[0].tp == {"colocated": 2}
    assert [(s.prefill, s.decode, s.gpus) for s in got[1:]] == [(4, 3, 16), (8, 2, 16), (12, 1, 16)]
    assert all(s.prefill_tp == 1 and s.decode_tp == 4 and s.tp == {"prefill": 1, "decode": 4} for s in got[1:])
    # 1P:3D (13 GPUs) is left out: 3 more prefill engines fit beside it (4P:3D).
    # The other way round: prefill TP4, decode TP1.
    assert [(s.prefill, s.decode) for s in splits(16, TensorParallel(1, 4, 1), 7)[1:]] == [(1, 12), (2, 8), (3, 4)]
    # An odd budget: some GPUs stay idle where no engine of either pool fits them.
    odd = splits(11, TensorParallel(1, 2, 4), 7)[1:]
    assert [(s.prefill, s.decode, s.gpus) for s in odd] == [(1, 2, 10), (3, 1, 10)]  # 2P:1D: a 3rd prefill fits
    for s in odd:
        assert s.gpus <= 11 and s.prefill >= 1 and s.decode >= 1
        assert s.gpus + 2 > 11 and s.gpus + 4 > 11  # no further engine of either pool fits
    assert Split(3, 1, 2, 4).describe("H200") == "3 prefill engines of TP2 + 1 decode engines of TP4 (6 + 4 H200)"
    # Too few GPUs for one engine of each pool: colocated alone.
    assert splits(4, TensorParallel(1, 2, 4), 7) == (Split(0, 4, 1, 1),)


def test_many_engines_are_thinned_evenly_keeping_both_ends():
    got = [s.prefill for s in splits(16, TensorParallel.uniform(1), 7)[1:]]
    assert len(got) == 7 and got[0] == 1 and got[-1] == 15 and got == sorted(set(got))
    steps = [b - a for a, b in zip(got, got[1:])]
    assert max(steps) - min(steps) <= 1
    assert [s.prefill for s in splits(16, TensorParallel.uniform(1), 1)[1:]] == [1]
    with pytest.raises(ValueError):
        splits(0, TensorParallel.uniform(1), 7)


def test_the_search_ladder_brackets_the_estimated_capacity():
    step = TableStepTime.for_config("H200", "llama-3.1-70b", 4)
    kinds = [(0.7, 2048, 64), (0.3, 128, 512)]
    one, four = capacity_rps(step, kinds, 1, 8192, 256), capacity_rps(step, kinds, 4, 8192, 256)
    assert four == pytest.approx(4 * one) and one > 0
    rates = auto_rates(four)
    assert rates == tuple(sorted(rates)) and rates[0] < four < rates[-1]


def test_the_duration_shrinks_to_the_request_budget_but_not_below_its_floor():
    rates, runs = (10.0, 30.0), 5  # 200 requests per second of load over the sweep
    assert fit_duration(12.0, rates, runs, 10_000, 4.0) == 12.0  # 2,400 fit
    assert fit_duration(12.0, rates, runs, 1_000, 4.0) == 5.0
    assert fit_duration(12.0, rates, runs, 100, 4.0) == 4.0
    assert sum(rates) * runs * fit_duration(12.0, rates, runs, 1_000, 4.0) <= 1_000


def test_the_drain_waits_for_any_request_that_could_still_meet_the_slo():
    assert drain_s(12.0, 1.0, 0.04, 512) == pytest.approx(1.0 + 512 * 0.04)
    assert drain_s(30.0, 1.0, 0.04, 64) == 30.0


def test_sized_config_sets_replicas_gpus_kv_and_pins_autoscaling():
    cfg = ClusterConfig.load(CONFIGS / "gpu-70b.yaml")
    tier = next(iter(cfg.tiers))
    scaled = cfg.model_copy(update={"tiers": {tier: cfg.tiers[tier].model_copy(update={
        "decode": cfg.tiers[tier].decode.model_copy(update={"autoscaling": AutoscalingConfig(min_replicas=1, max_replicas=9)})})}})
    kv = {tp: gpu_kv_bytes("H200", "llama-3.1-70b", tp, "fp8") for tp in (2, 4)}
    out = sized_config(scaled, tier, Split(1, 3, 4, 4), "always", kv).tiers[tier]
    assert (out.prefill.replicas, out.decode.replicas) == (1, 3)
    assert out.prefill.num_gpus == out.decode.num_gpus == 4
    assert out.prefill.engine.kv_cache_memory_bytes == kv[4] > 0
    assert (out.decode.autoscaling.min_replicas, out.decode.autoscaling.max_replicas) == (3, 3)
    assert sized_config(scaled, tier, Split(1, 3, 4, 4), "always", kv).routing.disaggregation == "always"
    # Each pool at its own TP: its GPUs and the KV cache they leave after the weights.
    mixed = sized_config(scaled, tier, Split(2, 3, 2, 4), "always", kv).tiers[tier]
    assert (mixed.prefill.num_gpus, mixed.decode.num_gpus) == (2, 4)
    assert (mixed.prefill.engine.kv_cache_memory_bytes, mixed.decode.engine.kv_cache_memory_bytes) == (kv[2], kv[4])
    assert kv[4] > 2 * kv[2]  # twice the GPUs, and the weights split over them
    # An explicit size in the config wins over the GPU estimate.
    example = ClusterConfig.load(CONFIGS / "gpu-example.yaml")
    t = next(iter(example.tiers))
    assert sized_config(example, t, Split(1, 1, 1, 1), "adaptive", kv).tiers[t].decode.engine.kv_cache_memory_bytes == \
        example.tiers[t].decode.engine.kv_cache_memory_bytes
    assert gpu_kv_bytes("H100", "llama-3.1-70b", 1, "bfloat16") == 0  # the weights alone exceed the GPU


def _rows(table: dict) -> list[dict]:
    """{candidate: {bandwidth: [whether it met the SLO per load]}} → plan rows over loads 1, 2, 3."""
    rows = []
    for cand, per_bw in table.items():
        split = cand.split()[-1] if " " in cand else cand
        mode = cand.split()[0] if " " in cand else "colocated"
        for bw, met in per_bw.items():
            rows += [{"candidate": cand, "split": split, "mode": mode, "bandwidth_gbps": bw, "rate_rps": rate,
                      "meets": m} for rate, m in zip((1.0, 2.0, 3.0), met)]
    return rows


SPLITS = {"colocated": Split(0, 2, 1, 1), "1P:1D": Split(1, 1, 1, 1)}


def test_recommend_takes_the_best_worst_case_capacity_and_says_when_bandwidth_flips_it():
    rows = _rows({"colocated": {10: [1, 1, 0], 100: [1, 1, 0]},
                  "adaptive 1P:1D": {10: [1, 0, 0], 100: [1, 1, 1]}})
    rec = recommend(score(rows, SPLITS), "H200", "slo")
    assert rec["candidate"] == "colocated" and rec["capacity_rps"] == 2
    assert rec["holds_across_bandwidths"] is False
    assert rec["winner_by_bandwidth_gbps"] == {"10": "colocated", "100": "adaptive 1P:1D"}
    assert rec["runners_up"][0]["candidate"] == "adaptive 1P:1D" and rec["runners_up"][0]["capacity_rps"] == 1
    assert rec["unbracketed"] == {"adaptive 1P:1D": [100]} and "higher --rates" in rec["reason"]


def test_recommend_ties_go_to_the_higher_mean_then_the_first_swept():
    rows = _rows({"colocated": {10: [1, 0, 0], 100: [1, 0, 0]}, "adaptive 1P:1D": {10: [1, 0, 0], 100: [1, 1, 0]}})
    assert recommend(score(rows, SPLITS), "H200", "slo")["candidate"] == "adaptive 1P:1D"
    rows = _rows({"colocated": {10: [1, 0, 0]}, "adaptive 1P:1D": {10: [1, 0, 0]}})
    rec = recommend(score(rows, SPLITS), "H200", "slo")
    assert rec["candidate"] == "colocated" and rec["margin_over_runner_up"] == 0  # an exact tie: the first swept
    assert "within the noise" in rec["reason"]
    # A load that met above one that failed does not count: the lower failure bounds the capacity.
    assert score(_rows({"colocated": {10: [1, 0, 1]}}), SPLITS)[0].worst == 1


def _seeded(table: dict) -> list[dict]:
    """{candidate: [per load 1, 2, 3: (pooled meets, each seed's meets)]} at one link → plan rows."""
    rows = []
    for cand, loads in table.items():
        split = cand.split()[-1] if " " in cand else cand
        mode = cand.split()[0] if " " in cand else "colocated"
        rows += [{"candidate": cand, "split": split, "mode": mode, "bandwidth_gbps": 10, "rate_rps": rate, "meets": met,
                  "by_seed": [{"meets": m} for m in seeds]} for rate, (met, seeds) in zip((1.0, 2.0, 3.0), loads)]
    return rows


def test_with_seeds_a_margin_within_their_spread_is_noise_and_one_beyond_it_is_not():
    # Pooled: colocated 2, adaptive 1. Seeds: colocated 2 / 3 (it met 3 on the second seed),
    # adaptive 1 / 2: spreads of 1 req/s each, the margin 1 req/s: within it.
    rows = _seeded({"colocated": [(1, (1, 1)), (1, (1, 1)), (0, (0, 1))],
                    "adaptive 1P:1D": [(1, (1, 1)), (0, (0, 1)), (0, (0, 0))]})
    scored = score(rows, SPLITS)
    assert [s.by_seed for s in scored] == [(2.0, 3.0), (1.0, 2.0)] and scored[0].spread == 1.0
    rec = recommend(scored, "H200", "slo")
    assert rec["candidate"] == "colocated" and rec["capacity_by_seed_rps"] == {"colocated": [2.0, 3.0],
                                                                                "adaptive 1P:1D": [1.0, 2.0]}
    assert rec["noise"]["seeds"] == 2 and rec["noise"]["estimate"].startswith("measured")
    assert (rec["noise"]["margin_rps"], rec["noise"]["noise_rps"], rec["noise"]["within_noise"]) == (1.0, 1.0, True)
    assert "spread up to 1.00 req/s: within it, noise" in rec["reason"]
    # The seeds agree: no spread, so a 50% margin is not noise (one seed's fixed 5% would agree here,
    # but from a rule, not a measurement).
    agree = _seeded({"colocated": [(1, (1, 1)), (1, (1, 1)), (0, (0, 0))],
                     "adaptive 1P:1D": [(1, (1, 1)), (0, (0, 0)), (0, (0, 0))]})
    rec = recommend(score(agree, SPLITS), "H200", "slo")
    assert rec["noise"]["within_noise"] is False and rec["noise"]["noise_rps"] == 0 and "noise" not in rec["reason"]
    # One seed: the fixed 5%, said so.
    one = recommend(score(_rows({"colocated": {10: [1, 1, 0]}, "adaptive 1P:1D": {10: [1, 0, 0]}}), SPLITS), "H200", "s")
    assert one["noise"]["seeds"] == 1 and one["noise"]["estimate"].startswith("fixed: 5%")
    assert one["noise"]["within_noise"] is False and one["capacity_by_seed_rps"] == {}


def test_the_search_brackets_a_threshold_within_its_stated_resolution_and_run_bound():
    spec = Search((4.0, 7.0, 10.0, 13.0), steps=3, attainment=0.9, seeds=1)
    assert spec.max_runs == spec.max_loads == 7 and spec.resolution == pytest.approx(4.0 / 8)
    for threshold in (0.3, 2.2, 5.05, 8.6, 12.9):
        runs = search(spec, lambda x: {"rate_rps": x, "meets": x <= threshold})
        cap = capacity(runs)
        assert len(runs) <= spec.max_runs and cap.bracketed
        assert cap.rate_rps <= threshold < cap.failed_rps and cap.failed_rps - cap.rate_rps <= spec.resolution
    # Met at the ladder's top: not bracketed, capacity at least that; never met: 0.
    assert capacity(search(spec, lambda x: {"rate_rps": x, "meets": True})) == \
        Capacity(13.0, None, {"rate_rps": 13.0, "meets": True})
    never = search(spec, lambda x: {"rate_rps": x, "meets": False})
    assert capacity(never).rate_rps == 0 and [r["rate_rps"] for r in never] == [4.0, 2.0, 1.0, 0.5]
    assert spec.meets(0.9) and not spec.meets(0.89) and not spec.meets(None)
    with pytest.raises(ValueError, match="--attainment"):
        Search((1.0,), 3, 1.5, 1)
    with pytest.raises(ValueError, match="ascending"):
        Search((2.0, 1.0), 3, 0.9, 1)
    with pytest.raises(ValueError, match="--seeds must be >= 1"):
        Search((1.0,), 3, 0.9, 0)
    # Each load once per seed: the bound on runs is the bound on loads times the seeds.
    three = Search((4.0, 7.0, 10.0, 13.0), 3, 0.9, 3)
    assert (three.max_loads, three.max_runs) == (7, 21) and three.describe("req/s")["max_runs_per_candidate_and_link"] == 21


def test_plan_with_a_gpu_budget_recommends_the_highest_searched_capacity(tmp_path, capsys):
    argv = ["plan", "--config", str(CONFIGS / "gpu-70b.yaml"), "--gpus", "8xH200", "--model", "llama-3.1-70b",
            "--tp", "4", "--rates", "4,12", "--search-steps", "2", "--duration", "3", "--bandwidths-gbps", "25,200"]
    assert main(argv + ["--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "plan.json").read_text())
    assert result["label"] == "SIMULATED" and (tmp_path / "plan.png").stat().st_size > 0
    assert result["provenance"]["step_time"]["colocated"]["kind"] == "aiconfigurator_table"
    b = result["budget"]
    assert b["colocated_engines"] == 2 and b["swept"] == ["colocated x2", "1P:1D"]
    assert b["tp"] == {"colocated": 4, "prefill": 4, "decode": 4} and b["idle_gpus"] == {"colocated x2": 0, "1P:1D": 0}
    rows = result["rows"]
    candidates = {r["candidate"] for r in rows}
    assert candidates == {"colocated x2", "adaptive 1P:1D", "always 1P:1D"}
    sr = result["search"]
    assert sr["max_runs_per_candidate_and_link"] == 4 and sr["resolution"] == 2.0 and sr["ladder"] == [4, 12]
    # Recompute the score from the rows: per link the highest load that met below the lowest that
    # failed, least over the links; every run within the stated bound.
    worst = {}
    for c in candidates:
        caps = []
        for bw in (25.0, 200.0):
            mine = [r for r in rows if r["candidate"] == c and r["bandwidth_gbps"] == bw]
            assert len(mine) <= 4 and all(r["meets"] == (r["slo_attainment"] >= 0.9) for r in mine)
            failed = min((r["rate_rps"] for r in mine if not r["meets"]), default=None)
            caps.append(max((r["rate_rps"] for r in mine if r["meets"] and (failed is None or r["rate_rps"] < failed)),
                            default=0.0))
            assert sr["capacity_rps"][c][f"{bw:g}"]["capacity_rps"] == caps[-1]
        worst[c] = min(caps)
    rec = result["recommendation"]
    assert rec["candidate"] in candidates and rec["capacity_rps"] == max(worst.values()) == worst[rec["candidate"]]
    assert rec["gpus_used"] == 8 and set(rec["ranking"]) == candidates
    assert rec["tp"] == ({"colocated": 4} if rec["mode"] == "colocated" else {"prefill": 4, "decode": 4})
    assert [r["candidate"] for r in rec["runners_up"]] == rec["ranking"][1:]
    assert max(worst.values()) > 0  # light loads: something meets the SLO
    assert len(set(worst.values())) > 1  # the loads separate the candidates: the pick above is a real choice
    assert any(4 < r["rate_rps"] < 12 for r in rows)  # the search ran loads between the ladder's
    out = capsys.readouterr().out
    assert result["workload"]["drain_s"] >= 1.0 + 512 * 0.04  # the default mix's longest answer at the ITL bound
    assert "SIMULATED plan for 8xH200" in out and f"recommended: {rec['candidate']}" in out


def test_plan_with_a_prefill_and_a_decode_tp_sizes_steps_and_names_each_pool(tmp_path, capsys):
    # 6 H200 of 70B: colocated x3 at TP2; one split, a prefill engine of TP2 beside a decode engine of TP4.
    argv = ["plan", "--config", str(CONFIGS / "gpu-70b.yaml"), "--gpus", "6xH200", "--model", "llama-3.1-70b",
            "--tp", "2", "--decode-tp", "4", "--modes", "always", "--rates", "2,6", "--search-steps", "1",
            "--duration", "2", "--bandwidths-gbps", "100", "--out", str(tmp_path)]
    assert main(argv) == 0
    result = json.loads((tmp_path / "plan.json").read_text())
    b = result["budget"]
    assert b["tp"] == {"colocated": 2, "prefill": 2, "decode": 4}  # --prefill-tp defaulted to --tp
    assert b["swept"] == ["colocated x3", "1P:1D"] and b["gpus_used"] == {"colocated x3": 6, "1P:1D": 6}
    prov = result["provenance"]
    assert {role: st["tp"] for role, st in prov["step_time"].items()} == {"colocated": 2, "prefill": 2, "decode": 4}
    assert all(st["kind"] == "aiconfigurator_table" for st in prov["step_time"].values())
    kv = prov["kv_cache_bytes_per_engine"]
    assert kv["colocated"] == kv["prefill"] < kv["decode"]  # each engine's cache is what its own GPUs leave
    assert {r["candidate"] for r in result["rows"]} == {"colocated x3", "always 1P:1D"}
    assert all(r["goodput_rps"] > 0 for r in result["rows"] if r["rate_rps"] == 2)
    out = capsys.readouterr().out
    assert "plan for 6xH200, colocated TP2, prefill TP2, decode TP4" in out
    assert "step time: colocated, prefill engines: AIConfigurator" in out and "TP2" in out
    assert "step time: decode engines: AIConfigurator" in out and "llama-3.1-70b on H200 TP4" in out


def test_plan_with_seeds_pools_each_loads_requests_and_states_their_spread(tmp_path, capsys):
    argv = ["plan", "--config", str(CONFIGS / "gpu-70b.yaml"), "--gpus", "8xH200", "--model", "llama-3.1-70b",
            "--tp", "4", "--rates", "4,12", "--search-steps", "2", "--duration", "3", "--bandwidths-gbps", "25",
            "--modes", "always", "--seeds", "3", "--out", str(tmp_path)]
    assert main(argv) == 0
    result = json.loads((tmp_path / "plan.json").read_text())
    sr = result["search"]
    assert (sr["seeds"], sr["max_loads_per_candidate_and_link"], sr["max_runs_per_candidate_and_link"]) == (3, 4, 12)
    assert result["workload"]["seeds"] == [0, 1, 2] and sr["runs"] == 3 * sr["loads_run"]
    for r in result["rows"]:
        seeds = r["by_seed"]
        assert [b["seed"] for b in seeds] == [0, 1, 2]
        # Pooled: every seed's requests at once; goodput the met ones over the three windows.
        assert r["slo_attainment"] == round(sum(b["met_slo"] for b in seeds) / sum(b["requests"] for b in seeds), 4)
        assert r["meets"] == (r["slo_attainment"] >= 0.9)
        assert r["goodput_rps"] == pytest.approx(sum(b["goodput_rps"] for b in seeds) / 3, abs=1e-3)
        assert r["spread"]["goodput_rps"] == pytest.approx(max(b["goodput_rps"] for b in seeds) -
                                                           min(b["goodput_rps"] for b in seeds), abs=1e-4)
        assert r["control_plane"]["peak_cores_1s"] == max(b["peak_cores_1s"] for b in seeds)
    assert len({b["requests"] for r in result["rows"] for b in r["by_seed"]}) > 1  # the seeds' arrivals differ
    rec = result["recommendation"]
    for c, per_bw in sr["capacity_rps"].items():
        cell = per_bw["25"]
        assert len(cell["by_seed"]) == 3 and cell["spread_rps"] == max(cell["by_seed"]) - min(cell["by_seed"])
        assert rec["capacity_by_seed_rps"][c] == cell["by_seed"]  # one link: each seed's score is its capacity
    noise = rec["noise"]
    assert noise["seeds"] == 3 and noise["estimate"].startswith("measured")
    spreads = [sr["capacity_rps"][c]["25"]["spread_rps"] for c in rec["ranking"][:2]]
    assert noise["noise_rps"] == max(spreads) and noise["within_noise"] == (noise["margin_rps"] <= max(spreads))
    out = capsys.readouterr().out
    assert "x 3 seeds" in out and "of its 3 seeds' requests pooled" in out


def test_the_pool_tp_flags_need_a_gpu_budget(tmp_path):
    with pytest.raises(SystemExit, match="--decode-tp: a pool's own TP is --gpus's"):
        main(["plan", "--config", str(CONFIGS / "gpu-example.yaml"), "--decode-tp", "2", "--out", str(tmp_path)])


def test_the_search_flags_need_a_gpu_budget(tmp_path):
    with pytest.raises(SystemExit, match="--search-steps: the capacity search is --gpus's"):
        main(["plan", "--config", str(CONFIGS / "gpu-example.yaml"), "--search-steps", "2", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="--seeds: the capacity search is --gpus's"):
        main(["plan", "--config", str(CONFIGS / "gpu-example.yaml"), "--seeds", "2", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="--seeds must be >= 1, got 0"):
        main(["plan", "--config", str(CONFIGS / "gpu-70b.yaml"), "--gpus", "8xH200", "--model", "llama-3.1-70b",
              "--tp", "4", "--seeds", "0", "--out", str(tmp_path)])
