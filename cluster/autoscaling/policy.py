"""The autoscaling decision of one pool, as a pure function: observation + state → decision.

No Ray, no clock, no I/O here: `decide` gets the time inside the observation and returns the
next state, so a recorded trace replays exactly (tests/unit/test_autoscaling*.py). The Ray
Serve adapter (serve_policy.py) builds observations from Serve's autoscaling context.

How a pool scales:
- load = the busiest signal as a share of its target (1.0 = at target). Prefill: queued prompt
  tokens per replica, TTFT / SLO. Decode: running sequences per replica, KV cache usage,
  inter-token latency / SLO.
- up: load above 1.0 for `upscale_delay_s` → enough replicas to bring an additive signal back
  to target (at least +1, at most double), capped at max_replicas.
- down: the load would still fill less than `scale_down_below` of one replica fewer, for
  `downscale_delay_s` → one replica fewer. The gap between that band and 1.0 is the hysteresis.
- hold while replicas are starting, and for `cooldown_s` after any change.
- bounds first: a target outside min..max moves to the nearest bound at once.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Literal, Optional

Role = Literal["prefill", "decode"]


@dataclass(frozen=True)
class Rules:
    """A pool's scaling rules (from its AutoscalingConfig and its tier's SLO)."""

    role: Role
    min_replicas: int
    max_replicas: int
    upscale_delay_s: float
    downscale_delay_s: float
    cooldown_s: float
    scale_down_below: float
    target_queued_prompt_tokens: float
    target_running_seqs: float
    target_kv_usage: float
    ttft_slo_s: float
    itl_slo_s: float


@dataclass(frozen=True)
class Observation:
    """What the pool looks like now. Totals are summed over running replicas; a None signal
    has no samples in the window (e.g. no request finished, so no latency)."""

    now: float
    replicas: int  # running
    target: int  # what Serve currently aims for
    queued_prompt_tokens: Optional[float] = None
    ttft_s: Optional[float] = None
    running_seqs: Optional[float] = None
    kv_usage: Optional[float] = None  # mean fraction over replicas
    itl_s: Optional[float] = None


@dataclass(frozen=True)
class PolicyState:
    """What the policy remembers between ticks (stored by Serve as a plain dict)."""

    pressure_since: Optional[float] = None
    idle_since: Optional[float] = None
    last_change_at: Optional[float] = None

    def to_dict(self) -> dict[str, Any]:
        return {f"tandem_{k}": v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "PolicyState":
        return cls(**{f.name: raw.get(f"tandem_{f.name}") for f in fields(cls)})


@dataclass(frozen=True)
class Decision:
    target: int
    reason: str
    load: Optional[float] = None


def load_of(rules: Rules, obs: Observation) -> tuple[Optional[float], str]:
    """The pool's load as a share of its targets, and the signal that sets it."""
    n = max(obs.replicas, 1)
    parts: dict[str, float] = {}
    if rules.role == "prefill":
        if obs.queued_prompt_tokens is not None:
            parts["queued prompt tokens"] = obs.queued_prompt_tokens / (rules.target_queued_prompt_tokens * n)
        if obs.ttft_s is not None:
            parts["TTFT"] = obs.ttft_s / rules.ttft_slo_s
    else:
        if obs.running_seqs is not None:
            parts["running sequences"] = obs.running_seqs / (rules.target_running_seqs * n)
        if obs.kv_usage is not None:
            parts["KV cache usage"] = obs.kv_usage / rules.target_kv_usage
        if obs.itl_s is not None:
            parts["inter-token latency"] = obs.itl_s / rules.itl_slo_s
    if not parts:
        return None, "no signal"
    signal = max(parts, key=parts.__getitem__)
    return parts[signal], signal


def decide(rules: Rules, obs: Observation, state: PolicyState) -> tuple[Decision, PolicyState]:
    now, current = obs.now, obs.target
    if current < rules.min_replicas or current > rules.max_replicas:
        bound = min(max(current, rules.min_replicas), rules.max_replicas)
        return Decision(bound, f"target {current} outside {rules.min_replicas}..{rules.max_replicas}"), PolicyState(
            last_change_at=now
        )
    if obs.replicas < current:
        return Decision(current, f"waiting for {current - obs.replicas} replica(s) to start"), state
    load, signal = load_of(rules, obs)
    if load is None:
        return Decision(current, "no signal yet"), replace(state, pressure_since=None, idle_since=None)
    share = f"{signal} at {load:.0%} of target"
    cooling = state.last_change_at is not None and now - state.last_change_at < rules.cooldown_s

    if load > 1.0:
        since = state.pressure_since if state.pressure_since is not None else now
        state = replace(state, pressure_since=since, idle_since=None)
        if current >= rules.max_replicas:
            return Decision(current, f"{share}; at max_replicas", load), state
        if cooling or now - since < rules.upscale_delay_s:
            return Decision(current, f"{share} for {now - since:.0f} s; holding", load), state
        wanted = min(max(current + 1, math.ceil(current * load)), 2 * current, rules.max_replicas)
        return Decision(wanted, f"scale up: {share} for {now - since:.0f} s", load), PolicyState(last_change_at=now)

    if current > rules.min_replicas and load * current / (current - 1) < rules.scale_down_below:
        since = state.idle_since if state.idle_since is not None else now
        state = replace(state, idle_since=since, pressure_since=None)
        if cooling or now - since < rules.downscale_delay_s:
            return Decision(current, f"{share} for {now - since:.0f} s; holding", load), state
        return Decision(current - 1, f"scale down: {share} for {now - since:.0f} s", load), PolicyState(
            last_change_at=now
        )

    return Decision(current, f"{share}; within band", load), replace(state, pressure_since=None, idle_since=None)
