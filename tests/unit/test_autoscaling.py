"""The per-pool autoscaling decision (cluster/autoscaling): pure functions, no Ray cluster."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from types import SimpleNamespace

import pytest

from cluster.autoscaling import signals as s
from cluster.autoscaling.policy import Observation, PolicyState, Rules, decide, load_of
from cluster.autoscaling.serve_policy import PoolPolicy, observe, rules_for, serve_autoscaling_config
from cluster.config import ClusterConfig

PREFILL = Rules(role="prefill", min_replicas=1, max_replicas=3, upscale_delay_s=10, downscale_delay_s=60,
                cooldown_s=30, scale_down_below=0.5, target_queued_prompt_tokens=1000, target_running_seqs=12,
                target_kv_usage=0.8, ttft_slo_s=1.0, itl_slo_s=0.1)
DECODE = replace(PREFILL, role="decode")


def obs(now, replicas=1, target=None, **signals):
    return Observation(now=now, replicas=replicas, target=replicas if target is None else target, **signals)


def run(rules, observations, state=PolicyState()):
    decisions = []
    for o in observations:
        d, state = decide(rules, o, state)
        decisions.append(d)
    return decisions, state


def test_prefill_load_is_the_busiest_signal():
    assert load_of(PREFILL, obs(0, replicas=2, queued_prompt_tokens=3000, ttft_s=0.5)) == (1.5, "queued prompt tokens")
    assert load_of(PREFILL, obs(0, queued_prompt_tokens=100, ttft_s=2.0)) == (2.0, "TTFT")
    assert load_of(PREFILL, obs(0)) == (None, "no signal")


def test_decode_load_reads_running_sequences_kv_usage_and_itl():
    assert load_of(DECODE, obs(0, replicas=2, running_seqs=12, kv_usage=0.2, itl_s=0.01))[1] == "running sequences"
    assert load_of(DECODE, obs(0, running_seqs=1, kv_usage=0.96, itl_s=0.01)) == (pytest.approx(1.2), "KV cache usage")
    assert load_of(DECODE, obs(0, running_seqs=1, kv_usage=0.1, itl_s=0.3))[1] == "inter-token latency"
    # decode ignores prefill's signals and the reverse
    assert load_of(DECODE, obs(0, queued_prompt_tokens=10**6)) == (None, "no signal")


def test_scales_up_only_after_the_pressure_lasted_upscale_delay():
    ticks = [obs(t, replicas=2, queued_prompt_tokens=3000) for t in range(0, 12)]
    decisions, _ = run(replace(PREFILL, max_replicas=8), ticks)
    assert [d.target for d in decisions[:10]] == [2] * 10
    assert decisions[10].target == 3  # ceil(2 * 1.5) = 3: enough to bring the signal to target
    assert decisions[10].reason.startswith("scale up: queued prompt tokens at 150% of target")


def test_scale_up_step_is_at_most_double_and_within_max():
    d, _ = decide(PREFILL, obs(20, queued_prompt_tokens=50_000), PolicyState(pressure_since=0))
    assert d.target == 2
    d, _ = decide(PREFILL, obs(20, replicas=2, queued_prompt_tokens=50_000), PolicyState(pressure_since=0))
    assert d.target == 3
    d, _ = decide(PREFILL, obs(20, replicas=3, queued_prompt_tokens=50_000), PolicyState(pressure_since=0))
    assert (d.target, d.reason.endswith("at max_replicas")) == (3, True)


def test_a_short_burst_does_not_scale():
    ticks = [obs(t, queued_prompt_tokens=5000 if t < 5 else 0) for t in range(30)]
    decisions, _ = run(PREFILL, ticks)
    assert {d.target for d in decisions} == {1}


def test_holds_while_new_replicas_start_and_during_cooldown():
    d, state = decide(PREFILL, obs(0, queued_prompt_tokens=5000), PolicyState(pressure_since=-20))
    assert d.target == 2 and state.last_change_at == 0
    d, state = decide(PREFILL, obs(5, replicas=1, target=2, queued_prompt_tokens=5000), state)
    assert d.target == 2 and "to start" in d.reason
    # running now, still loaded, delay long passed, but within the cooldown: hold
    d, state = decide(PREFILL, obs(20, replicas=2, queued_prompt_tokens=9000), replace(state, pressure_since=-20))
    assert d.target == 2 and "holding" in d.reason
    d, state = decide(PREFILL, obs(31, replicas=2, queued_prompt_tokens=9000), state)
    assert d.target == 3


def test_scales_down_one_at_a_time_after_idle_delay_and_never_below_min():
    state = PolicyState()
    targets = []
    replicas = 3
    for t in range(0, 300):
        d, state = decide(PREFILL, obs(t, replicas=replicas, queued_prompt_tokens=0), state)
        replicas = d.target
        targets.append(d.target)
    assert targets[59] == 3 and targets[60] == 2  # 60 s idle → one fewer
    assert 2 in targets and min(targets) == 1 and targets[-1] == 1
    downs = [i for i in range(1, len(targets)) if targets[i] < targets[i - 1]]
    assert len(downs) == 2 and downs[1] - downs[0] >= 60


def test_hysteresis_band_holds_moderate_load():
    # 2 replicas at 40% each: on one replica it would be 80% > 50% band → hold, never down.
    decisions, _ = run(PREFILL, [obs(t, replicas=2, queued_prompt_tokens=800) for t in range(0, 500, 5)])
    assert {d.target for d in decisions} == {2}
    assert decisions[-1].reason.endswith("within band")


def test_steady_noisy_load_changes_direction_at_most_once():
    # A steady total load of 1.3 replicas' worth, ±30% noise every second: it may scale up
    # once (to 2) and must then stay; neither the noise nor the new headroom flips it back.
    rng = random.Random(7)
    replicas, state, targets = 1, PolicyState(), []
    for t in range(0, 1800):
        total = 1300 * (1 + rng.uniform(-0.3, 0.3))
        d, state = decide(PREFILL, obs(t, replicas=replicas, queued_prompt_tokens=total), state)
        replicas = d.target
        targets.append(d.target)
    assert direction_changes(targets) <= 1
    assert targets[-1] == 2


def direction_changes(targets: list[int]) -> int:
    steps = [b - a for a, b in zip(targets, targets[1:]) if b != a]
    return sum(1 for a, b in zip(steps, steps[1:]) if (a > 0) != (b > 0))


def test_target_outside_bounds_moves_to_the_bound_at_once():
    assert decide(PREFILL, obs(0, replicas=5, queued_prompt_tokens=0), PolicyState())[0].target == 3
    assert decide(PREFILL, obs(0, replicas=0, queued_prompt_tokens=0), PolicyState())[0].target == 1


def test_policy_state_round_trips_through_serves_dict_and_keeps_serves_keys_apart():
    state = PolicyState(pressure_since=1.0, idle_since=None, last_change_at=3.0)
    raw = {**state.to_dict(), "__decision_counters": 2}
    assert PolicyState.from_dict(raw) == state
    assert PolicyState.from_dict({}) == PolicyState()


def _ctx(metrics, current=1, target=1, now=100.0, policy_state=None):
    return SimpleNamespace(aggregated_metrics=metrics, current_num_replicas=current, target_num_replicas=target,
                           current_time=now, policy_state=policy_state or {}, deployment_name="batch-prefill")


def test_observe_sums_per_replica_metrics_and_weights_latency_by_request():
    ctx = _ctx({
        s.QUEUED_PROMPT_TOKENS: {"r1": 300.0, "r2": 500.0},
        s.TTFT_SUM: {"r1": 2.0, "r2": 0.0},
        s.TTFT_COUNT: {"r1": 4.0, "r2": 0.0},
        s.KV_USAGE: {"r1": 0.2, "r2": 0.4},
        s.ITL_SUM: {"r1": 0.0},
        s.ITL_COUNT: {"r1": 0.0},
    }, current=2, target=2)
    o = observe(ctx)
    assert (o.queued_prompt_tokens, o.ttft_s, o.kv_usage, o.itl_s) == (800.0, 0.5, pytest.approx(0.3), None)
    assert (o.replicas, o.target, o.now) == (2, 2, 100.0)
    assert observe(_ctx(None)).queued_prompt_tokens is None


def test_pool_policy_is_serves_hook_and_logs_decisions(tmp_path):
    log = tmp_path / "decisions.jsonl"
    policy = PoolPolicy(rules=PREFILL.__dict__, decision_log=str(log))
    state: dict = {}
    for now in (0.0, 0.1, 10.0):
        replicas, state = policy(_ctx({s.QUEUED_PROMPT_TOKENS: {"r1": 1500.0}}, now=now, policy_state=state))
    assert replicas == 2 and isinstance(state, dict)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(lines) == 2  # unchanged observations are not repeated
    assert lines[-1]["decision"]["target"] == 2 and lines[-1]["deployment"] == "batch-prefill"


def test_serve_autoscaling_config_is_valid_for_ray_serve(tmp_path):
    from ray.serve.config import AutoscalingConfig

    cfg = ClusterConfig.model_validate({
        "model": {"path": str(tmp_path)},
        "tiers": {"batch": {"slo": {"ttft_s": 5, "itl_s": 0.5},
                            "decode": {"engine": {"max_num_seqs": 16},
                                       "autoscaling": {"min_replicas": 1, "max_replicas": 4}}}},
    })
    tier = cfg.tiers["batch"]
    raw = serve_autoscaling_config("decode", tier.decode, tier.slo)
    parsed = AutoscalingConfig(**raw)
    assert (parsed.min_replicas, parsed.max_replicas, parsed.upscale_delay_s) == (1, 4, 0)
    assert parsed.policy.policy_function == "cluster.autoscaling.serve_policy:PoolPolicy"
    rules = rules_for("decode", tier.decode, tier.slo)
    assert (rules.target_running_seqs, rules.itl_slo_s) == (12, 0.5)
    # The class Serve will instantiate with these kwargs works.
    assert PoolPolicy(**raw["policy"]["policy_kwargs"]).rules == rules


def test_replica_signals_report_queued_prompts_and_latency_per_period():
    values = {("vllm:num_requests_running", None): 3.0, ("vllm:num_requests_waiting", None): 1.0,
              ("vllm:kv_cache_usage_perc", None): 0.25,
              ("vllm:time_to_first_token_seconds_sum", None): 10.0,
              ("vllm:time_to_first_token_seconds_count", None): 20.0}
    sig = s.ReplicaSignals(read_metrics=lambda: dict(values))
    first = sig.sample()
    assert (first[s.RUNNING_SEQS], first[s.KV_USAGE], first[s.TTFT_SUM], first[s.TTFT_COUNT]) == (4.0, 0.25, 0.0, 0.0)
    values[("vllm:time_to_first_token_seconds_sum", None)] = 11.5
    values[("vllm:time_to_first_token_seconds_count", None)] = 23.0
    with sig.pending_prompt(400), sig.pending_prompt(100):
        during = sig.sample()
    assert during[s.QUEUED_PROMPT_TOKENS] == 500.0
    assert (during[s.TTFT_SUM], during[s.TTFT_COUNT]) == (1.5, 3.0)
    assert sig.sample()[s.QUEUED_PROMPT_TOKENS] == 0.0
