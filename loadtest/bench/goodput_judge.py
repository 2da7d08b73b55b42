"""The pure parts of the goodput comparison: objectives calibrated from the machine, and the
verdict of tandem adaptive against the best baseline. No Ray, no vLLM: unit-tested alone.

Objectives are multiples of what one engine does unloaded on one core of this machine: the
TTFT of a prefill-heavy request alone, and the step time (mean inter-token latency) of a
decode-heavy request alone. Two objectives are judged:
- `mean`: TTFT and the request's mean ITL (what most SLOs state);
- `every_gap`: the same TTFT and every gap between tokens bounded (no stall: a stream that
  waits behind another request's prefill breaks it even when its mean stays low).

Baselines are every system not named tandem-*: the colocated engines at each
max_num_batched_tokens of the sweep, one engine on all cores, Ray Serve LLM's P/D. A system
that could not run carries an `error` and no rates; it is reported, never compared.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Optional

from loadtest.measure.slo import Objective

CANDIDATE = "tandem-adaptive"
KEYS = {"mean": "goodput_rps", "every_gap": "goodput_rps_max_gap"}
# Issue 18's targets, judged on the run's own figures.
TARGET_BEST_RATIO = {"every_gap": 1.3, "mean": 1.0}
TARGET_EVERY_RATE = 0.95


@dataclass(frozen=True)
class Unloaded:
    ttft_ms: float  # a prefill-heavy request alone on one engine
    step_ms: float  # the mean token gap of a decode-heavy request alone

    @classmethod
    def of(cls, ttfts_ms: list[float], steps_ms: list[float]) -> "Unloaded":
        if not ttfts_ms or not steps_ms:
            raise ValueError("calibration needs at least one TTFT and one step time")
        return cls(statistics.median(ttfts_ms), statistics.median(steps_ms))


@dataclass(frozen=True)
class Multiples:
    ttft: float = 5.0
    itl: float = 3.0
    gap: float = 6.0


@dataclass(frozen=True)
class Objectives:
    mean: Objective
    every_gap: Objective

    @classmethod
    def calibrated(cls, unloaded: Unloaded, k: Multiples) -> "Objectives":
        ttft, itl = round(unloaded.ttft_ms * k.ttft, 1), round(unloaded.step_ms * k.itl, 1)
        return cls(Objective(ttft, itl), Objective(ttft, itl, round(unloaded.step_ms * k.gap, 1)))

    def describe(self) -> dict:
        return {"ttft_ms": self.mean.ttft_ms, "mean_itl_ms": self.mean.mean_itl_ms,
                "max_gap_ms": self.every_gap.max_gap_ms}


def _ran(systems: dict) -> dict:
    return {name: s for name, s in systems.items() if s.get("rates")}


def baselines(systems: dict) -> list[str]:
    return [name for name in _ran(systems) if not name.startswith("tandem")]


def best_goodput(system: dict, key: str) -> float:
    return max(r[key] for r in system["rates"])


def verdict(systems: dict, candidate: str = CANDIDATE) -> dict:
    """Per objective: each system's best goodput, the best baseline, the candidate's ratio to
    it, and per rate the candidate over the best baseline at that rate; targets met or not."""
    ran = _ran(systems)
    bases = baselines(systems)
    out: dict = {"candidate": candidate, "baselines": bases,
                 "not_run": {n: s.get("error") for n, s in systems.items() if n not in ran}}
    if candidate not in ran or not bases:
        out["verdict"] = f"nothing to compare: {candidate} or every baseline did not run"
        return out
    for objective, key in KEYS.items():
        best = {name: best_goodput(s, key) for name, s in ran.items()}
        top = max(bases, key=lambda n: best[n])
        ratio = _ratio(best[candidate], best[top])
        per_rate = {}
        for i, rate in enumerate(ran[candidate]["rates"]):
            at_rate = {n: ran[n]["rates"][i][key] for n in bases if i < len(ran[n]["rates"])}
            leader = max(at_rate, key=at_rate.get)
            per_rate[str(rate["rate_rps"])] = {"best_baseline": leader,
                                               "ratio": _ratio(rate[key], at_rate[leader])}
        worst = min((v["ratio"] for v in per_rate.values() if v["ratio"] is not None), default=None)
        out[objective] = {
            "best_goodput_rps": best, "best_baseline": top, "ratio_to_best_baseline": ratio,
            "target_ratio": TARGET_BEST_RATIO[objective],
            "target_met": ratio is not None and ratio >= TARGET_BEST_RATIO[objective],
            "per_rate": per_rate, "worst_rate_ratio": worst,
            "every_rate_target": TARGET_EVERY_RATE,
            "every_rate_target_met": worst is not None and worst >= TARGET_EVERY_RATE,
        }
    return out


def _ratio(a: float, b: float) -> Optional[float]:
    """a / b; equal at zero (both served nothing: not a loss), None when only b is zero."""
    if b == 0:
        return 1.0 if a == 0 else None
    return round(a / b, 3)


def best_of_sweep(systems: dict, prefix: str = "colocated-mbt") -> Optional[dict]:
    """The colocated sweep's winner per objective: which max_num_batched_tokens served most."""
    sweep = {n: s for n, s in _ran(systems).items() if n.startswith(prefix)}
    if not sweep:
        return None
    return {objective: max(sweep, key=lambda n: best_goodput(sweep[n], key)) for objective, key in KEYS.items()}
