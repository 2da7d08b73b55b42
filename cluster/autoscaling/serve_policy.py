"""Adapter from Ray Serve 2.60's custom autoscaling hook to the pure policy in policy.py.

Serve wiring (built by `serve_autoscaling_config`, used by cluster/app.py):
    autoscaling_config = {"min_replicas", "max_replicas", "initial_replicas", ...,
        "policy": {"policy_function": "cluster.autoscaling.serve_policy:PoolPolicy",
                   "policy_kwargs": {"rules": {...}, "decision_log": None}}}
Serve's controller instantiates `PoolPolicy(**policy_kwargs)` once per deployment and calls it
every control-loop tick with an AutoscalingContext; it returns (replicas, state). Serve keeps
the state dict between ticks and applies its own bounds and delays on top: we set Serve's
delays to 0 so the delays, cooldown and hysteresis live in one place, the pure policy.
Replicas feed `ctx.aggregated_metrics` through `record_autoscaling_stats()` (signals.py).
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

from cluster.autoscaling import signals as s
from cluster.autoscaling.policy import Decision, Observation, PolicyState, Role, Rules, decide
from cluster.metrics import Counter, Gauge

log = logging.getLogger("ray.serve")

POLICY_FUNCTION = "cluster.autoscaling.serve_policy:PoolPolicy"

# Recorded in Serve's controller, where the policy runs.
SCALING_DECISIONS = Counter("tandem_autoscaling_decisions", "Changes of a pool's target replica count.",
                            ["deployment", "direction"])
TARGET_REPLICAS = Gauge("tandem_autoscaling_target_replicas", "The policy's target replicas per pool.",
                        ["deployment"])
CURRENT_REPLICAS = Gauge("tandem_autoscaling_current_replicas", "Running replicas per autoscaled pool.",
                         ["deployment"])


def observe(ctx: Any) -> Observation:
    """An Observation from Serve's AutoscalingContext (metrics averaged over the look-back)."""
    metrics: dict[str, dict[Any, float]] = ctx.aggregated_metrics or {}

    def total(name: str) -> Optional[float]:
        per_replica = metrics.get(name)
        return float(sum(per_replica.values())) if per_replica else None

    def mean(name: str) -> Optional[float]:
        per_replica = metrics.get(name)
        return float(sum(per_replica.values()) / len(per_replica)) if per_replica else None

    def ratio(num: str, den: str) -> Optional[float]:
        n, d = total(num), total(den)
        return n / d if n is not None and d else None

    return Observation(
        now=float(ctx.current_time),
        replicas=int(ctx.current_num_replicas),
        target=int(ctx.target_num_replicas),
        queued_prompt_tokens=total(s.QUEUED_PROMPT_TOKENS),
        ttft_s=ratio(s.TTFT_SUM, s.TTFT_COUNT),
        running_seqs=total(s.RUNNING_SEQS),
        kv_usage=mean(s.KV_USAGE),
        itl_s=ratio(s.ITL_SUM, s.ITL_COUNT),
    )


class PoolPolicy:
    def __init__(self, rules: dict[str, Any], decision_log: Optional[str] = None):
        self.rules = Rules(**rules)
        self.decision_log = Path(decision_log) if decision_log else None
        self._last_logged: Optional[tuple] = None
        self._declared = False

    def __call__(self, ctx: Any) -> tuple[int, dict[str, Any]]:
        obs = observe(ctx)
        decision, state = decide(self.rules, obs, PolicyState.from_dict(ctx.policy_state or {}))
        if not self._declared:  # the series exist at 0 before the first scaling
            for direction in ("up", "down"):
                SCALING_DECISIONS.labels(deployment=ctx.deployment_name, direction=direction).inc(0)
            self._declared = True
        TARGET_REPLICAS.labels(deployment=ctx.deployment_name).set(decision.target)
        CURRENT_REPLICAS.labels(deployment=ctx.deployment_name).set(obs.replicas)
        if decision.target != obs.target:
            direction = "up" if decision.target > obs.target else "down"
            SCALING_DECISIONS.labels(deployment=ctx.deployment_name, direction=direction).inc()
            log.info("autoscaling %s: %d -> %d replicas (%s)", ctx.deployment_name, obs.target,
                     decision.target, decision.reason)
        self._record(ctx.deployment_name, obs, decision)
        return decision.target, state.to_dict()

    def _record(self, deployment: str, obs: Observation, decision: Decision) -> None:
        """One JSON line per change of observation or decision (ticks are every 0.1 s)."""
        if self.decision_log is None:
            return
        key = (*(v for k, v in asdict(obs).items() if k != "now"), decision.target, decision.reason)
        if key == self._last_logged:
            return
        self._last_logged = key
        line = {"deployment": deployment, "observation": asdict(obs), "decision": asdict(decision)}
        with self.decision_log.open("a") as f:
            f.write(json.dumps(line) + "\n")


def rules_for(role: Role, pool: Any, slo: Any) -> Rules:
    """Rules of a pool from its PoolConfig (with autoscaling set) and its tier's SLOConfig."""
    a = pool.autoscaling
    return Rules(
        role=role,
        min_replicas=a.min_replicas,
        max_replicas=a.max_replicas,
        upscale_delay_s=a.upscale_delay_s,
        downscale_delay_s=a.downscale_delay_s,
        cooldown_s=a.cooldown_s,
        scale_down_below=a.scale_down_below,
        target_queued_prompt_tokens=a.target_queued_prompt_tokens,
        target_running_seqs=a.target_running_seqs or max(1.0, 0.75 * pool.engine.max_num_seqs),
        target_kv_usage=a.target_kv_usage,
        ttft_slo_s=slo.ttft_s,
        itl_slo_s=slo.itl_s,
    )


def serve_autoscaling_config(role: Role, pool: Any, slo: Any) -> dict[str, Any]:
    """Ray Serve's autoscaling_config for one pool."""
    a = pool.autoscaling
    return {
        "min_replicas": a.min_replicas,
        "max_replicas": a.max_replicas,
        "initial_replicas": pool.replicas,
        # Our policy owns delays, cooldown and hysteresis; Serve's would stack on top.
        "upscale_delay_s": 0,
        "downscale_delay_s": 0,
        "look_back_period_s": a.look_back_s,
        "metrics_interval_s": a.metrics_interval_s,
        "policy": {
            "policy_function": POLICY_FUNCTION,
            "policy_kwargs": {
                "rules": asdict(rules_for(role, pool, slo)),
                "decision_log": str(a.decision_log) if a.decision_log else None,
            },
        },
    }
