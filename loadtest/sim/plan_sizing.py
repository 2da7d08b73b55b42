"""`tandem plan --gpus 16xH200`: from a GPU budget to the deployments worth simulating, and from
their simulated goodput to a recommendation. Pure: no simulation here (plan_gpus.py runs them).

A budget of N GPUs: colocated engines of TP t give E = N // t whole engines (a remainder of GPUs
stays idle and is reported); prefill engines of TP a and decode engines of TP b (each t unless
given) give every P:D split with p, d >= 1 and p*a + d*b <= N that no further engine of either
pool fits beside (at most `max_splits` of them, evenly spaced, when there are many), each run in
tandem's modes. With a == b that is every p + d = N // a. The candidates: the E colocated
engines (each does both phases: the "never disaggregate" deployment, vLLM's own) and the
splits. Every candidate spends the budget as fully as its TPs allow: a plan for a budget
compares ways to spend it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

from loadtest.sim.plan_search import capacity, seed_capacities
from loadtest.sim.step_time import ACCELERATORS, StepShape, StepTimeModel

_GPUS = re.compile(r"^\s*(\d+)\s*[x×*]\s*([A-Za-z0-9_-]+)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class GpuBudget:
    count: int
    gpu: str  # a key of step_time.ACCELERATORS (and of the tables): "H100", "H200"

    @classmethod
    def parse(cls, text: str) -> "GpuBudget":
        m = _GPUS.match(text)
        if not m:
            raise ValueError(f"--gpus wants COUNTxGPU, e.g. 16xH200; got {text!r}")
        count, gpu = int(m.group(1)), m.group(2).upper()
        if count < 1:
            raise ValueError(f"--gpus: at least one GPU, got {text!r}")
        if gpu not in ACCELERATORS:
            raise ValueError(f"--gpus: unknown GPU {m.group(2)!r}; known: {', '.join(sorted(ACCELERATORS))}")
        return cls(count, gpu)

    def __str__(self) -> str:
        return f"{self.count}x{self.gpu}"


@dataclass(frozen=True)
class TensorParallel:
    """GPUs per engine: colocated engines' (--tp), and the prefill and decode pools' (--prefill-tp,
    --decode-tp; plan_inputs.py defaults them to --tp where the arguments enter)."""

    colocated: int
    prefill: int
    decode: int

    def __post_init__(self) -> None:
        for flag, tp in (("--tp", self.colocated), ("--prefill-tp", self.prefill), ("--decode-tp", self.decode)):
            if tp < 1:
                raise ValueError(f"{flag} must be >= 1, got {tp}")

    @classmethod
    def uniform(cls, tp: int) -> "TensorParallel":
        return cls(tp, tp, tp)

    @property
    def mixed(self) -> bool:
        return len({self.colocated, self.prefill, self.decode}) > 1

    def __str__(self) -> str:
        if not self.mixed:
            return f"TP{self.colocated}"
        return f"TP{self.colocated} colocated, prefill TP{self.prefill}, decode TP{self.decode}"


@dataclass(frozen=True)
class Split:
    """A way to spend the budget: `prefill` 0 means colocated (`decode` engines doing both, of
    `decode_tp` GPUs each; `prefill_tp` is then theirs too)."""

    prefill: int
    decode: int
    prefill_tp: int
    decode_tp: int

    @classmethod
    def colocated_of(cls, engines: int, tp: int) -> "Split":
        return cls(0, engines, tp, tp)

    @property
    def colocated(self) -> bool:
        return self.prefill == 0

    @property
    def engines(self) -> int:
        return self.prefill + self.decode

    @property
    def gpus(self) -> int:
        return self.prefill * self.prefill_tp + self.decode * self.decode_tp

    @property
    def label(self) -> str:
        return f"colocated x{self.decode}" if self.colocated else f"{self.prefill}P:{self.decode}D"

    @property
    def tp(self) -> dict[str, int]:
        """GPUs per engine, by role (the JSON's)."""
        return {"colocated": self.decode_tp} if self.colocated else {"prefill": self.prefill_tp, "decode": self.decode_tp}

    def describe(self, gpu: str) -> str:
        if self.colocated:
            return f"{self.decode} colocated engines of TP{self.decode_tp} ({self.gpus} {gpu})"
        if self.prefill_tp == self.decode_tp:
            return (f"{self.prefill} prefill + {self.decode} decode engines of TP{self.decode_tp} "
                    f"({self.prefill * self.prefill_tp} + {self.decode * self.decode_tp} {gpu})")
        return (f"{self.prefill} prefill engines of TP{self.prefill_tp} + {self.decode} decode engines of "
                f"TP{self.decode_tp} ({self.prefill * self.prefill_tp} + {self.decode * self.decode_tp} {gpu})")


def _maximal(gpus: int, a: int, b: int) -> list[tuple[int, int]]:
    """(p, d), p and d >= 1, p*a + d*b <= gpus, where neither one more prefill nor one more
    decode engine fits: by growing p."""
    out = []
    for p in range(1, (gpus - b) // a + 1):  # at least one decode engine beside
        d = (gpus - p * a) // b
        if (gpus - d * b) // a == p:  # no room for another prefill engine either
            out.append((p, d))
    return out


def splits(gpus: int, tp: TensorParallel, max_splits: int) -> tuple[Split, ...]:
    """Colocated first (gpus // tp.colocated engines), then the P:D splits by growing prefill
    share, each spending the budget as fully as the two pools' TPs allow."""
    engines = gpus // tp.colocated
    if engines < 1:
        raise ValueError(f"{gpus} GPUs hold no whole engine of TP{tp.colocated}")
    if max_splits < 1:
        raise ValueError(f"--max-splits must be >= 1, got {max_splits}")
    pairs = _maximal(gpus, tp.prefill, tp.decode)
    if len(pairs) > max_splits:
        # Evenly spaced and both ends kept: the extremes are where a workload's phase share shows.
        last = len(pairs) - 1
        picks = {round(i * last / (max_splits - 1)) for i in range(max_splits)} if max_splits > 1 else {0}
        pairs = [pairs[i] for i in sorted(picks)]
    return (Split.colocated_of(engines, tp.colocated),) + tuple(Split(p, d, tp.prefill, tp.decode) for p, d in pairs)


def capacity_rps(step: StepTimeModel, kinds: Sequence[tuple[float, int, int]], engines: int, budget: int,
                 max_num_seqs: int) -> float:
    """A rough colocated capacity (req/s) to place the offered-load grid around, never reported as
    a result: each request's prompt at full-budget prefill steps, its output at a decode batch of
    min(max_num_seqs, 64). `kinds`: (share, prompt tokens, output tokens)."""
    seconds = 0.0
    for share, prompt, output in kinds:
        k = max(budget // prompt, 1)
        tokens = min(k * prompt, budget)
        per_prompt_token = step.step_s(StepShape(0, tokens, tokens, k * prompt * (prompt + 1) // 2)) / tokens
        b = min(max_num_seqs, 64)
        ctx = b * (prompt + output // 2)
        per_output_token = step.step_s(StepShape(b, 0, ctx, ctx, ctx)) / b
        seconds += share * (prompt * per_prompt_token + output * per_output_token)
    return engines / seconds


def auto_rates(estimate: float, fractions: Iterable[float] = (0.4, 0.7, 1.0, 1.3)) -> tuple[float, ...]:
    """The capacity search's ladder (plan_search.py): from below to past the estimated capacity
    (2 significant figures). Four rungs: the bisection after them halves the widest gap, 0.4 of
    the estimate, each step."""
    return tuple(sorted({float(f"{max(estimate * f, 0.01):.2g}") for f in fractions}))


def fit_duration(duration: float, rates: Sequence[float], runs_per_load: int, max_requests: int,
                 floor: float) -> float:
    """The seconds of load per run, shortened so the whole sweep simulates at most `max_requests`
    (its wall time follows the request count), never below `floor`. `rates`: every load one
    candidate may run (for the search, its bound: plan_gpus.py)."""
    per_second = sum(rates) * runs_per_load
    if per_second <= 0:
        return duration
    return round(max(min(duration, max_requests / per_second), floor), 1)


def drain_s(duration: float, ttft_s: float, itl_s: float, max_output: int) -> float:
    """How long after the last arrival to wait: at least what a request that meets the SLO may
    take (TTFT + its output at the mean-ITL bound), so none that would count is cut off."""
    return max(duration, ttft_s + max_output * itl_s)


@dataclass(frozen=True)
class Scored:
    """A candidate's capacity under the SLO (plan_search.py), per KV bandwidth."""

    candidate: str  # "colocated x4", "adaptive 1P:3D"
    split: Split
    mode: str  # "colocated" | a disaggregation mode
    capacity_by_bandwidth: tuple[tuple[float, float], ...]  # (Gbit/s, req/s)
    unbracketed: tuple[float, ...] = ()  # bandwidths where it met the SLO at every load run: at least that
    by_seed: tuple[float, ...] = ()  # with several seeds: each seed's own score (plan_search.seed_capacities)

    @property
    def worst(self) -> float:
        """The score: the least over the swept bandwidths, so a pick holds across the range."""
        return min(c for _, c in self.capacity_by_bandwidth)

    @property
    def mean(self) -> float:
        return sum(c for _, c in self.capacity_by_bandwidth) / len(self.capacity_by_bandwidth)

    @property
    def spread(self) -> float:
        """Its seeds' scores, highest less lowest (0 with one seed: nothing measured)."""
        return max(self.by_seed) - min(self.by_seed) if self.by_seed else 0.0


def score(rows: Sequence[dict], splits_by_label: dict[str, Split]) -> list[Scored]:
    """rows: {candidate, split, mode, bandwidth_gbps, rate_rps, meets[, by_seed: [{meets}]]};
    candidates in first-seen order. Each seed's score is its own capacity (at the loads run),
    least over the bandwidths, as the pooled score is."""
    groups: dict[str, dict[float, list[dict]]] = {}  # candidate → bandwidth → its runs
    for r in rows:
        groups.setdefault(r["candidate"], {}).setdefault(r["bandwidth_gbps"], []).append(r)
    out = []
    for c, by_bw in groups.items():
        first = next(iter(by_bw.values()))[0]
        caps = {bw: capacity(rs) for bw, rs in by_bw.items()}
        per_seed = [[cap.rate_rps for cap in seed_capacities(rs)] for rs in by_bw.values()]
        out.append(Scored(c, splits_by_label[first["split"]], first["mode"],
                          tuple(sorted((bw, cap.rate_rps) for bw, cap in caps.items())),
                          tuple(sorted(bw for bw, cap in caps.items() if not cap.bracketed)),
                          tuple(min(seed) for seed in zip(*per_seed))))
    return out


def noise(win: Scored, runner: Optional[Scored], close: float) -> dict:
    """Whether the winner's margin over the runner-up is noise. With several seeds, measured: the
    margin (req/s) is noise when it is no more than the wider of the two candidates' spreads
    over the seeds (highest seed's score less lowest). With one seed nothing is measured: a
    margin under `close` of the winner's capacity is called noise, a fixed estimate."""
    seeds = len(win.by_seed) or 1
    out: dict = {"seeds": seeds}
    if seeds > 1:
        out["estimate"] = ("measured: the wider of the winner's and the runner-up's spreads over the seeds (each "
                           "seed's own capacity at the worst link, highest less lowest); a margin no more than it is noise")
    else:
        out["estimate"] = (f"fixed: {close:.0%} of the winner's capacity (one seed measures no spread; --seeds 2 or "
                           "more measures it)")
    if runner is None or win.worst <= 0:
        return {**out, "margin_rps": None, "noise_rps": None, "within_noise": None}
    margin = win.worst - runner.worst
    level = max(win.spread, runner.spread) if seeds > 1 else close * win.worst
    within = margin <= level if seeds > 1 else margin / win.worst < close
    return {**out, "margin_rps": round(margin, 4), "noise_rps": round(level, 4), "within_noise": within}


def recommend(scored: Sequence[Scored], gpu: str, slo: str, close: float = 0.05) -> dict:
    """The candidate with the highest worst-case capacity (ties: the higher mean, then the first
    swept: colocated before any split), why, and the runners-up. Whether its margin is noise:
    `noise` (several seeds: their spread; one: `close`, a share of the winner's capacity).
    `slo`: the criterion, in words."""
    if not scored:
        raise ValueError("nothing was simulated")
    ranked = sorted(scored, key=lambda s: (-s.worst, -s.mean))  # stable: sweep order breaks exact ties
    win = ranked[0]
    bandwidths = [bw for bw, _ in win.capacity_by_bandwidth]
    # Per bandwidth, ties go the ranking's way, so an exact tie does not read as a flip.
    winners = {bw: max(ranked, key=lambda s: dict(s.capacity_by_bandwidth)[bw]).candidate for bw in bandwidths}
    holds = all(w == win.candidate for w in winners.values())
    runner: Optional[Scored] = ranked[1] if len(ranked) > 1 else None
    margin = (win.worst - runner.worst) / win.worst if runner and win.worst > 0 else None
    reason = (f"{win.candidate} ({win.split.describe(gpu)}): the highest capacity under the SLO ({slo}) at the worst "
              f"swept KV link, {win.worst:.2f} req/s")
    told = noise(win, runner, close)
    if runner is not None:
        reason += f"; runner-up {runner.candidate} {runner.worst:.2f} req/s"
        if margin is not None and told["seeds"] > 1:
            reason += (f" ({margin:.1%} lower; their scores over {told['seeds']} seeds spread up to "
                       f"{told['noise_rps']:.2f} req/s{': within it, noise' if told['within_noise'] else ''})")
        elif margin is not None:
            reason += f" ({margin:.1%} lower{': within the noise of one seeded trace' if told['within_noise'] else ''})"
    reason += ("; the same winner at every swept bandwidth" if holds else
               "; the winner changes with the KV bandwidth: " + ", ".join(f"{bw:g} Gbit/s {c}" for bw, c in winners.items()))
    open_top = [s for s in ranked[:4] if s.unbracketed]
    if open_top:
        # Its capacity is the ladder's top, not found: a higher load could reorder the ranking.
        reason += ("; met the SLO at the highest load of the ladder, so its capacity is at least that (" + ", ".join(
            f"{s.candidate} at {'/'.join(f'{bw:g}' for bw in s.unbracketed)} Gbit/s" for s in open_top)
            + "): higher --rates could change the ranking")
    if win.worst == 0:
        reason = "no candidate met the SLO at any load tried: " + reason
    return {"candidate": win.candidate, "mode": win.mode, "split": win.split.label, "prefill_engines": win.split.prefill,
            "decode_engines": win.split.decode, "colocated_engines": win.split.decode if win.split.colocated else 0,
            "tp": win.split.tp, "gpus_used": win.split.gpus, "capacity_rps": win.worst,
            "holds_across_bandwidths": holds, "winner_by_bandwidth_gbps": {f"{bw:g}": c for bw, c in winners.items()},
            "margin_over_runner_up": None if margin is None else round(margin, 4), "noise": told, "reason": reason,
            "unbracketed": {s.candidate: list(s.unbracketed) for s in ranked if s.unbracketed},
            "runners_up": [{"candidate": s.candidate, "capacity_rps": s.worst, "mean_over_bandwidths_rps": round(s.mean, 4)}
                           for s in ranked[1:4]],
            "capacity_by_seed_rps": {s.candidate: list(s.by_seed) for s in ranked if s.by_seed},
            "ranking": [s.candidate for s in ranked]}
