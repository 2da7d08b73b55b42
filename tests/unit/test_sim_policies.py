"""loadtest/sim runs tandem's real policies and defines none of its own (issue 32):
- an AST scan: it imports the real decider, router, admission gate and autoscaling policy,
  defines no function or method of a policy's name, and compares nothing against an objective;
- a replay: every verdict the simulated cluster got equals the real `decide` on the same
  inputs, and every scaling decision the real autoscaling `decide` on the same observation."""

from __future__ import annotations

import ast
from pathlib import Path

from cluster.autoscaling import policy as scaling
from cluster.config import ClusterConfig
from loadtest.bench.workload import Mix, RequestKind, poisson_schedule
from loadtest.sim.control_plane import from_benchmark
from loadtest.sim.run import simulate_tandem
from loadtest.sim.setups import cpu_hardware
from router.routing.decider import decide

SIM = Path(__file__).resolve().parents[2] / "loadtest" / "sim"
POLICY_NAMES = {"decide", "pick", "route", "skip_prefill", "load_of", "prefix_score", "load_score", "kv_usage_score",
                "predict_local", "predict_remote_ttft", "expected_wait_s", "enter", "observe_prefill", "observe_step"}
OBJECTIVE_ATTRS = {"ttft_s", "itl_s", "gap_s", "max_gap_s", "target_ttft_s", "max_queue_wait_s"}
REAL_POLICIES = {"harness.py": {"router.routing.service": "KVRouter", "router.routing.build": "kv_router_settings",
                                "router.admission": "TierGate"},
                 "autoscale.py": {"cluster.autoscaling.policy": "decide", "cluster.autoscaling.serve_policy": "rules_for"}}


def _trees():
    return {p.name: ast.parse(p.read_text()) for p in sorted(SIM.glob("*.py"))}


def test_the_simulator_imports_the_real_policies():
    trees = _trees()
    for module, wanted in REAL_POLICIES.items():
        imported = {(n.module, a.name) for n in ast.walk(trees[module]) if isinstance(n, ast.ImportFrom) for a in n.names}
        for source, name in wanted.items():
            assert (source, name) in imported, f"{module} must import {name} from {source}"


def test_the_simulator_defines_no_policy_and_judges_no_objective():
    for name, tree in _trees().items():
        defined = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        assert not defined & POLICY_NAMES, f"{name} defines {defined & POLICY_NAMES}: call tandem's own instead"
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                names = {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}
                assert not names & OBJECTIVE_ATTRS, f"{name}:{node.lineno} compares against an objective"


def _config() -> ClusterConfig:
    engine = {"kv_cache_memory_bytes": 64 << 20, "max_num_seqs": 16, "max_num_batched_tokens": 256,
              "enable_chunked_prefill": True}
    return ClusterConfig.model_validate({
        "model": {"path": "/simulated/m", "name": "m", "max_model_len": 2048},
        "tiers": {"interactive": {
            "prefill": {"replicas": 1, "engine": engine,
                        "autoscaling": {"min_replicas": 1, "max_replicas": 3, "upscale_delay_s": 2, "cooldown_s": 4,
                                        "target_queued_prompt_tokens": 256, "metrics_interval_s": 1}},
            "decode": {"replicas": 1, "engine": engine},
            "slo": {"ttft_s": 1.5, "itl_s": 0.12, "max_gap_s": 0.25},
            "admission": {"max_running": 64, "max_queued": 256, "queue_timeout_s": 60, "target_ttft_s": 1.5,
                          "min_running": 4},
        }},
        "routing": {"disaggregation": "adaptive", "whole_on_prefill_max_tokens": 16},
    })


def test_the_simulated_decisions_equal_a_replay_through_the_real_functions():
    mix = Mix(RequestKind("prefill-heavy", 512, 8), RequestKind("decode-heavy", 64, 32), 0.7)
    schedule = poisson_schedule(mix, 6.0, 8.0, 3)
    hw, _ = cpu_hardware(0.26, 0.041, 512, 256, "bfloat16", source="test")
    result = simulate_tandem(_config(), hw, from_benchmark("tandem"), schedule, seed=1, drain_timeout_s=20.0,
                             control_cores=2, shares_engine_cores=2)
    trace = result.trace
    assert len(trace.verdicts) == sum(r.ok for r in result.records) + sum(not r.ok and "429" not in r.error
                                                                          for r in result.records)
    assert len({d.reason for _, d in trace.verdicts}) >= 2  # more than one rule was exercised
    for inputs, verdict in trace.verdicts:
        assert decide(*inputs) == verdict
    assert trace.scaling, "the prefill pool's autoscaling policy never ticked"
    assert any(d.target > obs.target for _, obs, _, d, _ in trace.scaling), "the load never scaled prefill up"
    for rules, obs, state, verdict, new_state in trace.scaling:
        assert scaling.decide(rules, obs, state) == (verdict, new_state)


def test_the_real_admission_gate_refuses_past_its_queue_on_the_simulated_clock():
    cfg = _config()
    tier = cfg.tiers["interactive"]
    tight = tier.admission.model_copy(update={"max_running": 2, "max_queued": 1, "target_ttft_s": None})
    cfg = cfg.model_copy(update={"tiers": {"interactive": tier.model_copy(update={"admission": tight})}})
    mix = Mix(RequestKind("prefill-heavy", 512, 8), RequestKind("decode-heavy", 64, 32), 0.7)
    hw, _ = cpu_hardware(0.26, 0.041, 512, 256, "bfloat16", source="test")
    result = simulate_tandem(cfg, hw, from_benchmark("tandem"), poisson_schedule(mix, 8.0, 3.0, 0), seed=1,
                             drain_timeout_s=20.0, control_cores=2, shares_engine_cores=2)
    refused = [r for r in result.records if r.error.startswith("429 ")]
    assert refused and len(refused) < len(result.records)
    assert len(result.trace.verdicts) == len(result.records) - len(refused)  # a refused request is never routed
