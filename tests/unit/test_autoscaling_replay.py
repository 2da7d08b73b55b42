"""Replay of a recorded step-load trace through the pure autoscaling decision.

tests/unit/data/autoscaling_step_trace.json was recorded by the policy's `decision_log` on
the real integration cluster (tests/integration/test_tiers_autoscaling.py: 10 clients with
440-token prompts on the batch tier, then one light client): every tick at which batch-prefill's
observation or decision changed, with the rules it ran under. Replaying the observations must
reproduce every recorded decision, scale up within the configured delay of the first
observation over target, and change direction at most once (up under load, down after it).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cluster.autoscaling.policy import Observation, PolicyState, Rules, decide, load_of

TRACE = Path(__file__).parent / "data" / "autoscaling_step_trace.json"


@pytest.fixture(scope="module")
def trace():
    raw = json.loads(TRACE.read_text())
    rules = Rules(**raw["rules"])
    ticks = [(Observation(**t["observation"]), t["decision"]) for t in raw["ticks"]]
    return rules, ticks


def replay(rules, observations):
    state, out = PolicyState(), []
    for obs in observations:
        decision, state = decide(rules, obs, state)
        out.append(decision)
    return out


def test_replay_reproduces_every_recorded_decision(trace):
    rules, ticks = trace
    decisions = replay(rules, [o for o, _ in ticks])
    assert [d.target for d in decisions] == [rec["target"] for _, rec in ticks]
    assert [d.reason for d in decisions] == [rec["reason"] for _, rec in ticks]


def test_scales_up_within_the_configured_delay_of_the_step(trace):
    rules, ticks = trace
    decisions = replay(rules, [o for o, _ in ticks])
    step = next(o.now for o, _ in ticks if (load_of(rules, o)[0] or 0) > 1.0)
    up = next(o.now for (o, _), d in zip(ticks, decisions) if d.target > o.target)
    # The control loop ticks every 0.1 s; the log keeps ticks whose reason changed (≤ 1 s apart).
    assert rules.upscale_delay_s <= up - step <= rules.upscale_delay_s + 1.0


def test_the_step_load_changes_direction_at_most_once(trace):
    rules, ticks = trace
    decisions = replay(rules, [o for o, _ in ticks])
    moves = [d.target - o.target for (o, _), d in zip(ticks, decisions) if d.target != o.target]
    assert moves and moves[0] > 0  # it did scale up
    flips = sum(1 for a, b in zip(moves, moves[1:]) if (a > 0) != (b > 0))
    assert flips <= 1, moves
