"""The engines' own step timings: what a replica writes (cluster/engine/step_log.py), what the
benchmark reads back per phase (loadtest/bench/engine_steps.py), what the simulator makes of the
committed record (loadtest/sim/step_record.py), and the relay a replay charges (validate.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from cluster.engine.step_log import ENV, log_path, step_row
from loadtest.bench.engine_steps import COLUMNS, EngineSteps
from loadtest.sim.setups import bench_system
from loadtest.sim.step_record import RECORD, load, neighbour_slowdown, prefill_steps, slowdown
from loadtest.sim.validate import relay


def _details(**kw):
    base = dict(iteration_index=3, num_ctx_requests=1, num_ctx_tokens=256, num_generation_requests=2,
                num_generation_tokens=2, elapsed_ms=412.345, is_dummy=False)
    return SimpleNamespace(**{**base, **kw})


def test_step_row_is_vllms_iteration_details():
    row = step_row(_details(), SimpleNamespace(num_running_reqs=3, num_waiting_reqs=1), 12.345678)
    assert row == {"t": 12.3457, "i": 3, "ctx_reqs": 1, "ctx_tokens": 256, "gen_reqs": 2, "gen_tokens": 2,
                   "ms": 412.35, "running": 3, "waiting": 1}


def test_log_path_names_tier_role_and_a_safe_worker_id(tmp_path):
    assert log_path(tmp_path, "interactive", "prefill", "a/b c") == tmp_path / "interactive-prefill-a_b_c.jsonl"


def test_engine_steps_reads_only_the_phase_s_steps(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, "")  # recorded, so the variable EngineSteps sets is undone after the test
    steps = EngineSteps(tmp_path)
    import os
    assert os.environ[ENV] == str(tmp_path)  # the replicas started after this inherit it
    f = tmp_path / "interactive-prefill-r1.jsonl"
    line = lambda t, ctx: json.dumps({"t": t, "i": 0, "ctx_reqs": 1, "ctx_tokens": ctx, "gen_reqs": 0,
                                      "gen_tokens": 0, "ms": 400.0, "running": 1, "waiting": 2}) + "\n"
    f.write_text(line(1.0, 64))  # before the phase: not counted
    steps.begin()
    with f.open("a") as out:
        out.write(line(steps._t0 + 0.5, 256))
    got = steps.end()
    assert got["columns"] == list(COLUMNS)
    assert got["engines"] == {"interactive-prefill-r1": [[0.5, 256, 0, 400.0, 2]]}
    assert len(got["per_core"]) >= 1 and {"busy", "steal"} <= set(got["per_core"][0])


def test_prefill_steps_keeps_full_chunks_without_decodes():
    rows = [{"ctx_tokens": 256, "gen_reqs": 0, "ms": 400.0}, {"ctx_tokens": 256, "gen_reqs": 1, "ms": 500.0},
            {"ctx_tokens": 64, "gen_reqs": 0, "ms": 100.0}]
    assert prefill_steps(rows, 256) == [400.0]


def test_the_committed_record_loads_and_gives_the_slowdown():
    """The recording the README's figures come from: warm-up (unloaded) and per-rate chunk times."""
    record = load(RECORD)
    for system in ("tandem-adaptive", "tandem-oldrelay"):
        if system not in record["systems"]:
            continue
        got = slowdown(record, system)
        assert got["budget_tokens"] == 256
        assert got["unloaded"]["prefill_full_chunks"] >= 2
        for rate in got["rates"].values():
            assert rate["prefill_full_chunks"] > 0 and rate["vs_unloaded"] > 0.5
            assert 0 < rate["prefill_busy_share"] <= 1.0


def test_the_relay_a_replay_charges(tmp_path):
    assert bench_system("tandem-oldrelay").old_relay is True
    no_history = tmp_path / "goodput.json"  # outside any git history: git cannot say, today's relay
    assert relay(no_history, False) == "tandem"
    assert relay(no_history, True) == "tandem-old-relay"


def test_an_engine_in_a_cluster_logs_its_steps_only_when_asked(tmp_path, monkeypatch):
    """With TANDEM_STEP_LOG set, the engine asks vLLM for its step timings and gets the step
    logger after vLLM's own loggers; the logger writes one line per real (not dummy) step."""
    from cluster.engine.vllm import engine_args, engine_stat_loggers
    from cluster.types import PoolId
    from tests.unit.test_engine_args import _spec

    spec = _spec({}, pool=PoolId("interactive", "prefill"), worker_id="w1")
    monkeypatch.delenv(ENV, raising=False)
    assert len(engine_stat_loggers(spec)) == 2 and not engine_args(spec).enable_logging_iteration_details
    monkeypatch.setenv(ENV, str(tmp_path))
    assert engine_args(spec).enable_logging_iteration_details is True
    logger = engine_stat_loggers(spec)[-1](vllm_config=None)
    stats = SimpleNamespace(num_running_reqs=1, num_waiting_reqs=0, iteration_details=_details())
    logger.record(stats, None)
    logger.record(SimpleNamespace(num_running_reqs=0, num_waiting_reqs=0, iteration_details=_details(is_dummy=True)), None)
    logger.record(None, None)
    lines = (tmp_path / "interactive-prefill-w1.jsonl").read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["ctx_tokens"] == 256


def test_the_score_is_also_given_per_host_class():
    from loadtest.sim.validate import machine_class, score
    assert machine_class({"avx512_bf16": True, "amx_bf16": True, "gpu": False}) == "AMX"
    assert machine_class({"avx512_bf16": True, "amx_bf16": False, "gpu": False}) == "AVX-512 BF16"
    assert machine_class({"avx512_bf16": False, "amx_bf16": False, "gpu": False}) == "AVX2"
    cell = lambda within: {"system": "colocated-mbt256", "within": within, "within_max_gap": within}
    speed = {"from": "calibration"}
    runs = [{"run": "a", "machine": "AVX2", "cells": [cell(True), cell(False)], "ranking": {"systems": 1}, "prefill_speed": speed},
            {"run": "b", "machine": "AMX", "cells": [cell(True)], "ranking": {"systems": 1}, "prefill_speed": speed}]
    assert score(runs)["within_by_machine"] == {"AMX": "1/1", "AVX2": "1/2"}


def test_measured_repeats_pair_only_the_same_cell_judged_under_both_objectives(tmp_path):
    from loadtest.sim.repeats import repeats
    from loadtest.sim.validate import machine_class, within

    def run(cells, mbt=256, seed=0, command="goodput --engine-niceness 0", ttft_ms=10_000.0):
        """cells: rate -> TTFTs (ms) of 40 s of requests, each with a 100-ms mean ITL."""
        return {"command": command, "dtype": "float32", "machine": {"avx512_bf16": False, "amx_bf16": False},
                "calibration": {"objectives": {"ttft_ms": ttft_ms, "mean_itl_ms": 150.0}},
                "engines": {"max_num_seqs": 32, "kv_cache_mib_per_core": 256},
                "workload": {"kinds": {"prefill-heavy": [512, 8]}, "mix": "both", "prefill_share": 0.7,
                             "duration_s": 40.0, "drain_timeout_s": 20.0, "seed": seed},
                "systems": {"tandem-adaptive": {"max_num_batched_tokens": mbt, "rates": [
                    {"rate_rps": r, "records": [{"ttft_ms": t, "mean_itl_ms": 100.0} for t in ttfts]}
                    for r, ttfts in cells.items()]}}}
    fast, slow = [1_000.0] * 20, [9_000.0] * 20  # 0.5 req/s of goodput under a 10-s TTFT, none under 8 s
    runs = {tmp_path / "a.json": run({0.5: fast, 0.75: slow}), tmp_path / "b.json": run({0.5: fast, 0.75: slow}, ttft_ms=8_000.0),
            tmp_path / "c.json": run({0.5: fast}, mbt=2048), tmp_path / "d.json": run({0.5: fast}, seed=1),
            tmp_path / "e.json": run({0.5: fast}, command="goodput")}  # another niceness: another cell
    out = repeats(runs, machine_class, within, tmp_path)
    assert [(p["rate_rps"], p["runs"], p["within"]) for p in out["list"]] == [
        (0.5, ["a.json", "b.json"], True),
        (0.75, ["a.json", "b.json"], True)]  # the same requests: b's lower TTFT objective fails both alike
    assert out["list"][1]["goodput_rps"] == {"under a's objectives": [0.5, 0.5], "under b's objectives": [0.0, 0.0]}
    assert (out["pairs"], out["within"]) == (2, 2)


def test_warm_up_prompt_is_the_prefill_engines_own_unloaded_chunks():
    from loadtest.sim.step_record import warm_up_prompt_ms
    cols = ["t_s", "ctx_tokens", "gen_reqs", "ms", "waiting"]
    warm = {"columns": cols, "span_s": 5.0, "per_core": [], "engines": {
        "interactive-prefill-r1": [[0.1, 256, 0, 1000.0, 0], [1.2, 256, 0, 1200.0, 0], [2.5, 8, 0, 300.0, 0]],
        "interactive-decode-r2": [[0.2, 256, 0, 9999.0, 0], [0.3, 0, 1, 70.0, 0]]}}  # the decode engine's: not counted
    run = {"systems": {"tandem-adaptive": {"warm_up_steps": warm}, "colocated-mbt256": {"rates": []}}}
    assert warm_up_prompt_ms(run, 512, 256) == 2200.0  # two chunks of 256 at their mean, 1100 ms
    assert warm_up_prompt_ms(run, 512, 2048) is None  # no 512-token step recorded
    assert warm_up_prompt_ms({"systems": {"colocated-mbt256": {"rates": []}}}, 512, 256) is None  # no step log


def test_neighbour_slowdown_splits_steps_by_what_the_other_engine_did():
    cols = ["t_s", "ctx_tokens", "gen_reqs", "ms", "waiting"]
    prefill = [[1.0, 256, 0, 1000.0, 0],  # busy 0.0-1.0 while decode runs: shared
               [5.0, 256, 0, 800.0, 0]]  # 4.2-5.0, decode idle: alone
    decode = [[0.5, 0, 1, 100.0, 0], [0.9, 0, 1, 120.0, 0],  # inside the first chunk: shared
              [3.0, 0, 1, 80.0, 0], [3.5, 0, 1, 80.0, 0]]  # prefill idle: alone
    steps = {"columns": cols, "engines": {"interactive-prefill-a": prefill, "interactive-decode-b": decode}}
    run = {"systems": {"tandem-adaptive": {"max_num_batched_tokens": 256, "warm_up_steps": steps,
                                           "rates": [{"engine_steps": steps}]}}}
    got = neighbour_slowdown(run)
    assert got["decode"] == round(110.0 / 80.0, 3) and got["decode_steps"] == (2, 2)
    # The first chunk overlaps decode for 0.22 of its 1.0 s: neither side of the split.
    assert got["prefill"] is None and got["prefill_chunks"] == (0, 1)
