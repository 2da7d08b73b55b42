"""`tandem plan` writes SIMULATED figures with their provenance (loadtest/sim/plan.py), on the
step time it chose (plan_step.py): AIConfigurator's tables where they hold, else the roofline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cluster.cli import main
from loadtest.sim.plan_step import VALIDATION, choose_step_time, table_validation
from loadtest.sim.step_table import load

SIM = Path(__file__).resolve().parents[2] / "loadtest" / "sim"
EXAMPLE = SIM / "configs" / "gpu-example.yaml"
SMALL = ["--rates", "1", "--duration", "2", "--bandwidths-gbps", "10", "--long", "1024:16", "--short", "64:64"]


def test_plan_writes_labelled_json_and_plot(tmp_path, capsys):
    rc = main(["plan", "--config", str(EXAMPLE), "--step-time", "roofline", *SMALL, "--out", str(tmp_path)])
    assert rc == 0
    result = json.loads((tmp_path / "plan.json").read_text())
    assert result["label"] == "SIMULATED"
    assert result["provenance"]["step_time"]["kind"] == "roofline_bound"
    assert result["provenance"]["step_time"]["why"] == "--step-time roofline"
    assert "control_plane-issue27.json" in result["provenance"]["control_plane"]["tandem"]
    assert {r["system"] for r in result["rows"]} == {"adaptive", "always", "never", "colocated"}
    assert all(r["goodput_rps"] > 0 for r in result["rows"])  # a light load: every system serves it
    assert (tmp_path / "plan.png").stat().st_size > 0
    assert "SIMULATED" in capsys.readouterr().out


def test_plan_defaults_to_the_gpu_tables_and_names_them_and_their_validation(tmp_path, capsys):
    rc = main(["plan", "--config", str(EXAMPLE), "--accelerator", "H200", "--model", "llama-3.1-70b", "--tp", "4",
               *SMALL, "--out", str(tmp_path)])
    assert rc == 0
    st = json.loads((tmp_path / "plan.json").read_text())["provenance"]["step_time"]
    prov, _, _ = load()
    assert st["kind"] == "aiconfigurator_table" and st["chosen"] == "table" and st["why"].startswith("auto")
    assert (st["gpu"], st["model"], st["tp"], st["gemm"]) == ("H200", "llama-3.1-70b", 4, "fp8")
    assert st["tool"] == "aiconfigurator" and st["tool_version"] == prov["version"]
    assert st["vllm_perf_data"] and st["file"].endswith("vllm_llama31.json")
    # The validation is read from the committed result, not restated: same numbers, same verdicts.
    score = json.loads(VALIDATION.read_text())["score"]["H200 llama-3.1-70b"]
    v = st["validation"]
    assert (v["tpot_median_err"], v["ttft_median_err"]) == (score["tpot_median_err"], score["ttft_median_err"])
    assert (v["tpot_bar_met"], v["ttft_bar_met"]) == (score["tpot_bar_met"], score["ttft_bar_met"])
    assert f"{score['ttft_median_err']:.1%}" in v["summary"]
    out = capsys.readouterr().out
    assert f"AIConfigurator {prov['version']}" in out and v["summary"] in out


def test_auto_falls_back_to_the_roofline_where_no_table_holds_and_table_insists():
    assert choose_step_time("auto", "H200", "llama-3.1-70b", 3, "fp8", 0.5, 0.7).kind == "roofline"  # no TP3 table
    assert choose_step_time("auto", "H200", "smollm2-135m", 1, "fp8", 0.5, 0.7).kind == "roofline"
    chosen = choose_step_time("auto", "H100", "llama-3.1-8b", 2, "bfloat16", 0.5, 0.7)
    assert chosen.kind == "table" and chosen.provenance()["gemm"] == "bfloat16"
    with pytest.raises(SystemExit, match="no AIConfigurator table"):
        choose_step_time("table", "H200", "llama-3.1-70b", 3, "fp8", 0.5, 0.7)


def test_unvalidated_tables_say_so():
    assert table_validation("H100", "llama-3.1-8b", "fp8")["validated"] is False  # no measured 8B rows on H100
    bf16 = table_validation("H200", "llama-3.1-70b", "bfloat16")
    assert bf16["validated"] is False and bf16["summary"].startswith("unvalidated for bfloat16")
    assert table_validation("H200", "llama-3.1-70b", "fp8")["validated"] is True


def test_slo_replaces_the_tiers_objectives_and_bad_ones_say_what_to_write(tmp_path):
    rc = main(["plan", "--config", str(EXAMPLE), "--step-time", "roofline", *SMALL, "--slo", "ttft=2.5,itl=0.05",
               "--out", str(tmp_path)])
    assert rc == 0
    objectives = json.loads((tmp_path / "plan.json").read_text())["objectives"]
    assert objectives == {"ttft_ms": 2500.0, "mean_itl_ms": 50.0, "max_gap_ms": 100.0}  # max_gap: twice itl
    with pytest.raises(SystemExit, match="unknown objective 'tpot'; use ttft, itl, max_gap"):
        main(["plan", "--config", str(EXAMPLE), *SMALL, "--slo", "tpot=0.05", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="itl wants seconds, got 'fast'"):
        main(["plan", "--config", str(EXAMPLE), *SMALL, "--slo", "itl=fast", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="max_gap_s .* is below slo.itl_s"):  # SLOConfig's own check, one message
        main(["plan", "--config", str(EXAMPLE), *SMALL, "--slo", "itl=0.05,max_gap=0.01", "--out", str(tmp_path)])
