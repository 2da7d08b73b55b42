"""The goodput benchmark's pure parts (loadtest/bench/goodput_judge.py, goodput_systems.py):
objectives calibrated as multiples of the unloaded figures, the systems a flag expands to, and
the verdict of tandem adaptive against the best baseline, overall and per rate."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from loadtest.bench.goodput_judge import Multiples, Objectives, Unloaded, best_of_sweep, verdict
from loadtest.bench.goodput_systems import systems_of


def test_objectives_are_multiples_of_the_unloaded_medians():
    unloaded = Unloaded.of([400.0, 500.0, 900.0], [30.0, 20.0, 25.0])
    assert (unloaded.ttft_ms, unloaded.step_ms) == (500.0, 25.0)
    obj = Objectives.calibrated(unloaded, Multiples(ttft=4, itl=2, gap=6))
    assert (obj.mean.ttft_ms, obj.mean.mean_itl_ms, obj.mean.max_gap_ms) == (2000.0, 50.0, None)
    assert (obj.every_gap.ttft_ms, obj.every_gap.mean_itl_ms, obj.every_gap.max_gap_ms) == (2000.0, 50.0, 150.0)
    with pytest.raises(ValueError):
        Unloaded.of([], [1.0])


def test_colocated_expands_to_one_system_per_batched_tokens_budget():
    systems = systems_of(["tandem-adaptive", "tandem-always", "colocated", "single", "rayllm-pd"], [256, 2048])
    assert [s.name for s in systems] == ["tandem-adaptive", "tandem-always", "colocated-mbt256",
                                         "colocated-mbt2048", "single", "rayllm-pd"]
    assert [s.disaggregation for s in systems[:2]] == ["adaptive", "always"]
    assert [s.max_num_batched_tokens for s in systems[2:4]] == [256, 2048]
    assert systems[4].engines == 1
    with pytest.raises(ValueError, match="unknown system"):
        systems_of(["colocatd"], [256])


def _system(*goodputs):
    """Rates 1, 2, 3 with (mean-objective goodput, every-gap goodput) each."""
    return {"rates": [{"rate_rps": i + 1, "goodput_rps": m, "goodput_rps_max_gap": g}
                      for i, (m, g) in enumerate(goodputs)]}


def test_verdict_compares_the_candidate_with_the_best_baseline_overall_and_at_each_rate():
    systems = {
        "tandem-adaptive": _system((1.0, 1.0), (1.8, 1.6), (1.0, 0.9)),
        "tandem-always": _system((0.9, 0.9), (1.2, 1.2), (0.5, 0.5)),
        "colocated-mbt256": _system((1.0, 0.8), (1.9, 1.0), (0.2, 0.1)),
        "colocated-mbt2048": _system((1.0, 0.5), (1.5, 0.4), (0.1, 0.0)),
        "single": _system((1.0, 0.9), (1.4, 1.2), (1.2, 0.2)),
        "rayllm-pd": {"error": "RuntimeError: NIXL on CPU"},
    }
    out = verdict(systems)
    assert out["baselines"] == ["colocated-mbt256", "colocated-mbt2048", "single"]
    assert out["not_run"] == {"rayllm-pd": "RuntimeError: NIXL on CPU"}
    mean, gap = out["mean"], out["every_gap"]
    assert (mean["best_baseline"], mean["ratio_to_best_baseline"], mean["target_met"]) == ("colocated-mbt256", 0.947, False)
    assert (gap["best_baseline"], gap["ratio_to_best_baseline"], gap["target_met"]) == ("single", 1.333, True)
    # Per rate, against whichever baseline led at that rate.
    assert mean["per_rate"]["2"] == {"best_baseline": "colocated-mbt256", "ratio": 0.947}
    assert mean["per_rate"]["3"] == {"best_baseline": "single", "ratio": 0.833}
    assert (mean["worst_rate_ratio"], mean["every_rate_target_met"]) == (0.833, False)
    assert gap["per_rate"]["3"] == {"best_baseline": "single", "ratio": 4.5}
    assert best_of_sweep(systems) == {"mean": "colocated-mbt256", "every_gap": "colocated-mbt256"}


def test_nothing_served_by_both_is_even_and_a_run_without_baselines_says_so():
    systems = {"tandem-adaptive": _system((0.0, 0.0)), "single": _system((0.0, 0.0))}
    assert verdict(systems)["mean"]["per_rate"]["1"]["ratio"] == 1.0
    assert "nothing to compare" in verdict({"tandem-adaptive": _system((1.0, 1.0))})["verdict"]


def test_ray_serve_llm_engines_get_the_same_engine_settings_and_their_own_core():
    from loadtest.bench.rayllm_pd import llm_config

    args = SimpleNamespace(model=SimpleNamespace(name="m"), dtype="bfloat16", max_model_len=2048,
                           kv_cache_mib=256, max_num_seqs=32, max_num_batched_tokens=2048)
    cfg = llm_config(args, gpu=False, device="1")
    engine = cfg["engine_kwargs"]
    assert (engine["kv_cache_memory_bytes"], engine["max_num_seqs"], engine["max_num_batched_tokens"]) == (256 << 20, 32, 2048)
    assert engine["kv_transfer_config"]["kv_connector"] == "NixlConnector"
    assert engine["kv_transfer_config"]["kv_buffer_device"] == "cpu"
    assert cfg["runtime_env"]["env_vars"]["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    assert cfg["placement_group_config"] == {"bundles": [{"CPU": 1}]}


def test_tandem_decode_full_is_adaptive_with_rule_8():
    off, on = systems_of(["tandem-adaptive", "tandem-decode-full"], [256])
    assert (on.disaggregation, on.whole_when_decode_full) == ("adaptive", True)
    assert (off.disaggregation, off.whole_when_decode_full) == ("adaptive", False)


def test_where_the_cores_went_is_the_mean_cores_busy_per_process_kind_and_pool():
    import os

    from loadtest.bench.goodput import cores_by_process
    from loadtest.bench.procs import ProcRecord

    me, times = os.getpid(), SimpleNamespace
    before = {1: ProcRecord(1, 0, "ray::ServeReplica:tandem:Gateway", 5.0, 10.0),
              2: ProcRecord(2, 0, "ray::ServeReplica:tandem:interactive-decode", 5.0, 1.0),
              me: ProcRecord(me, 0, "python -m loadtest.bench.goodput", 5.0, 2.0)}
    after = {1: ProcRecord(1, 0, "ray::ServeReplica:tandem:Gateway", 5.0, 12.0),
             2: ProcRecord(2, 0, "ray::ServeReplica:tandem:interactive-decode", 5.0, 1.01),
             3: ProcRecord(3, 2, "VLLM::Worker", 6.0, 8.0),  # born meanwhile: counted from zero
             me: ProcRecord(me, 0, "python -m loadtest.bench.goodput", 5.0, 3.0)}
    cores = cores_by_process(before, after, times(user=0, nice=0, system=0, steal=0),
                             times(user=15.0, nice=0, system=1.0, steal=0.5), seconds=10.0)
    assert cores == {"machine": 1.6, "vLLM worker [interactive-decode]": 0.8, "gateway": 0.2, "client": 0.1,
                     "steal": 0.05}  # the replica's 0.001 cores are below the reporting floor
