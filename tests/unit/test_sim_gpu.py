"""The GPU step-time tables (AIConfigurator-derived) and the GPU validation (loadtest/sim)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtest.sim.step_table import TABLES, TableStepTime, load
from loadtest.sim.step_time import StepShape
from loadtest.sim.validate_gpu import TPOT_BAR, TTFT_BAR, kv_blocks, validate

COMMITTED = Path(__file__).resolve().parents[2] / "loadtest" / "sim" / "results" / "validation-gpu.json"


def _decode(b: int, s: int) -> StepShape:
    return StepShape(decode_seqs=b, prefill_tokens=0, context_tokens=b * s, attention_pairs=b * s,
                     decode_context_tokens=b * s)


def _prefill(n: int, after: int = 0) -> StepShape:
    return StepShape(decode_seqs=0, prefill_tokens=n, context_tokens=after + n,
                     attention_pairs=n * (2 * after + n + 1) // 2)


def test_the_file_is_small_and_carries_provenance_and_licence():
    assert TABLES.stat().st_size < 1_000_000
    prov, tables, silicon = load(str(TABLES))
    assert prov["tool"] == "aiconfigurator" and prov["version"] and "Apache-2.0" in prov["license"]
    assert (TABLES.parent / "NOTICE").exists() and (TABLES.parent / "LICENSE-aiconfigurator").exists()
    for gpu in ("H100", "H200"):
        for model, tp in (("llama-3.1-8b", 1), ("llama-3.1-70b", 4), ("llama-3.1-70b", 8)):
            assert (gpu, model, tp, "fp8") in tables and (gpu, model, tp, "bfloat16") in tables
    assert len(silicon) == 126 and {r["gpu"] for r in silicon} == {"H100", "H200"}


def test_measured_grid_points_come_back_exactly():
    t = TableStepTime.for_config("H200", "llama-3.1-70b", 4)
    tab = t.table
    i, j = tab.decode_batch.index(16), tab.kv_len.index(1024)
    assert t.step_s(_decode(16, 1024)) * 1000 == pytest.approx(tab.decode_shared_ms[i] + tab.gen_attn_ms[i][j])
    k, n = tab.tokens.index(1024), tab.prompt_len.index(1024)
    assert t.step_s(_prefill(1024)) * 1000 == pytest.approx(tab.shared_ms[k] + tab.ctx_attn_ms[n])
    assert t.provenance()["kind"] == "aiconfigurator_table"


def test_step_time_grows_with_work_and_shrinks_with_tp_and_a_faster_gpu():
    t = TableStepTime.for_config("H200", "llama-3.1-70b", 4)
    assert t.step_s(_decode(64, 1024)) < t.step_s(_decode(64, 8192)) < t.step_s(_decode(256, 8192))
    assert t.step_s(_prefill(512)) < t.step_s(_prefill(512, after=7680)) < t.step_s(_prefill(8192))
    mixed = StepShape(32, 1024, 32 * 2048 + 1024, 32 * 2048 + 1024 * 1025 // 2, 32 * 2048)
    assert t.step_s(mixed) > t.step_s(_prefill(1024))
    assert TableStepTime.for_config("H200", "llama-3.1-70b", 8).step_s(_decode(64, 2048)) < t.step_s(_decode(64, 2048))
    assert TableStepTime.for_config("H200", "llama-3.1-70b", 4).step_s(_decode(64, 4096)) < \
        TableStepTime.for_config("H100", "llama-3.1-70b", 4).step_s(_decode(64, 4096))  # HBM3e vs HBM3


def test_kv_capacity_follows_memory_and_tp():
    assert kv_blocks("H100", "llama-3.1-70b", 1, "bfloat16") == 0  # 141 GB of weights on one 80 GB GPU
    assert kv_blocks("H200", "llama-3.1-70b", 8, "fp8") > kv_blocks("H200", "llama-3.1-70b", 4, "fp8") > 0


def test_gpu_validation_meets_the_bar_on_the_quick_rows_and_matches_the_committed_run():
    """The rows with <= 8 clients and <= 1024 output tokens (28 of 126; `python -m loadtest.sim
    validate-gpu` runs all of them, ~3 min): the bars it meets there, and the same simulated values
    as the committed full run, so results/validation-gpu.json is what this code gives."""
    out = validate(max_osl=1024, max_concurrency=8)
    score = out["score"]
    assert score["all"]["simulated"] == 28
    for group in ("H100 llama-3.1-70b", "H200 llama-3.1-70b"):
        assert score[group]["tpot_median_err"] <= TPOT_BAR
        assert score[group]["ttft_median_err"] <= TTFT_BAR
    committed = {r["id"]: r for r in json.loads(COMMITTED.read_text())["rows"]}
    for r in out["rows"]:
        assert (r["sim_ttft_ms"], r["sim_tpot_ms"]) == (committed[r["id"]]["sim_ttft_ms"], committed[r["id"]]["sim_tpot_ms"])
