"""`tandem plan` writes SIMULATED figures with their provenance (loadtest/sim/plan.py), on the
step time it chose (plan_step.py): AIConfigurator's tables where they hold, else the roofline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cluster.cli import main
from cluster.config import ClusterConfig
from loadtest.sim.network import LinkSpec
from loadtest.sim.plan_step import VALIDATION, choose_step_time, table_validation
from loadtest.sim.pools import Hardware, KVCacheTooSmall, engine_params
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


def _with_kv(pool, kv_bytes: int):
    return pool.model_copy(update={"engine": pool.engine.model_copy(update={"kv_cache_memory_bytes": kv_bytes})})


def test_a_kv_cache_exactly_holding_max_model_len_is_accepted_and_one_block_less_refused():
    pool = ClusterConfig.load(EXAMPLE).tiers["interactive"].decode
    token = 131_072  # Llama-3.1-8B's KV bytes per token (bf16)
    hw = Hardware(step_model=lambda t, r: None, kv_bytes_per_token=token, default_block_size=16, link=LinkSpec(1.0, 0.0))
    assert engine_params(_with_kv(pool, 8192 * token), hw, 8192, "tiers.interactive.decode").num_blocks == 512
    with pytest.raises(KVCacheTooSmall, match=r"^tiers\.interactive\.decode: its KV cache .* holds 8,176 tokens \(511 "
                                              r"blocks of 16.* fewer than model\.max_model_len \(8,192\)"):
        engine_params(_with_kv(pool, 8192 * token - 1), hw, 8192, "tiers.interactive.decode")
    # vLLM counts whole blocks: 8,200 tokens need 513 of 16.
    assert engine_params(_with_kv(pool, 513 * 16 * token), hw, 8200, "x").num_blocks == 513
    with pytest.raises(KVCacheTooSmall, match=r"needs 1,075,838,976 bytes \(1.00 GiB\)"):
        engine_params(_with_kv(pool, 512 * 16 * token), hw, 8200, "x")


@pytest.mark.parametrize("gpus", [[], ["--gpus", "2xH200", "--model", "llama-3.1-8b"]])
def test_a_kv_cache_under_max_model_len_stops_the_plan_with_one_line_and_exit_2(tmp_path, capsys, gpus):
    small = tmp_path / "small-kv.yaml"  # 24 MiB of Llama-3.1-8B's KV: 192 tokens, max_model_len 8,192
    small.write_text(EXAMPLE.read_text().replace("kv_cache_memory_bytes: 40G", "kv_cache_memory_bytes: 24M"))
    rc = main(["plan", "--config", str(small), "--step-time", "roofline", *SMALL, *gpus, "--out", str(tmp_path / "o")])
    assert rc == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert "\n" not in err and "Traceback" not in err and err.startswith("tiers.interactive.prefill: its KV cache")
    assert "holds 192 tokens (12 blocks of 16" in err and "model.max_model_len (8,192)" in err
    assert "needs 1,073,741,824 bytes (1.00 GiB): vLLM refuses to start such an engine" in err
    assert "engine.kv_cache_memory_bytes" in err and "lower model.max_model_len" in err
    assert not (tmp_path / "o").exists() and "SIMULATED" not in captured.out  # refused before any run


def test_a_gpu_sized_kv_cache_under_max_model_len_says_a_higher_tp_leaves_more(tmp_path, capsys):
    # Llama-3.1-70B in bf16 on two H100s leaves room for 9,424 tokens of KV: not for 16,384.
    long = tmp_path / "long.yaml"
    long.write_text((SIM / "configs" / "gpu-70b.yaml").read_text().replace("max_model_len: 8192", "max_model_len: 16384")
                    .replace("max_num_batched_tokens: 8192", "max_num_batched_tokens: 8192, enable_chunked_prefill: true"))
    rc = main(["plan", "--config", str(long), "--gpus", "4xH100", "--model", "llama-3.1-70b", "--tp", "2",
               "--gemm", "bfloat16", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err
    assert err.startswith("tiers.interactive.prefill (TP2 on H100, its KV cache what the GPUs leave after the weights: "
                          "a higher --prefill-tp leaves more): its KV cache")
    assert "holds 9,424 tokens" in err and "model.max_model_len (16,384)" in err
