"""`tandem plan --gpus`: each candidate's capacity, found by search instead of read off a fixed
load grid (where its best could fall between two loads). Pure: the caller makes the runs
(`Bisection`).

A load *meets the SLO* when at least `attainment` of its requests met the plan's objective
(TTFT + mean ITL, the goodput benchmark's `Objective`), i.e. its goodput under the SLO is at
least that share of what was offered. With `seeds` > 1 each load is run once per seed and its
requests are pooled: the load meets the SLO when at least `attainment` of all its runs'
requests do. The capacity is the highest offered load that meets it below the lowest that
does not. Each seed's own capacity is read back from the same runs (`by_seed`): the search's
loads are the pooled search's, so a seed's capacity is known only at those loads.

The search, per candidate and KV link: the ladder (the `--rates` loads, ascending) until the
first load that fails, then `steps` bisections between the highest load that met (0 if none:
no load is trivially met) and that one. At most len(ladder) + steps loads, each run `seeds`
times: (len(ladder) + steps) x seeds runs; the capacity is then
known within the widest ladder gap (0 to its first load included) / 2**steps. A candidate that
meets the SLO at the top of the ladder is not bracketed: its capacity is at least that load.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence


@dataclass(frozen=True)
class Search:
    ladder: tuple[float, ...]  # the --rates values (req/s of the mix, or a trace's replay speeds), ascending
    steps: int  # bisections after the ladder
    attainment: float  # share of a load's requests within the SLO for the load to meet it
    seeds: int  # runs per load, one per seed, their requests pooled

    def __post_init__(self) -> None:
        if not self.ladder or list(self.ladder) != sorted(set(self.ladder)) or self.ladder[0] <= 0:
            raise ValueError(f"--rates: the search's ladder must be positive, ascending and without repeats, got "
                             f"{','.join(f'{x:g}' for x in self.ladder)}")
        if self.steps < 0:
            raise ValueError(f"--search-steps must be >= 0, got {self.steps}")
        if not 0 < self.attainment <= 1:
            raise ValueError(f"--attainment is a share of requests, in (0, 1], e.g. 0.9; got {self.attainment}")
        if self.seeds < 1:
            raise ValueError(f"--seeds must be >= 1, got {self.seeds}")

    @property
    def max_loads(self) -> int:
        """Offered loads per candidate and KV link, at most."""
        return len(self.ladder) + self.steps

    @property
    def max_runs(self) -> int:
        """Runs per candidate and KV link, at most: each load once per seed."""
        return self.max_loads * self.seeds

    @property
    def resolution(self) -> float:
        """The widest the final bracket can be, in the ladder's unit."""
        gaps = [b - a for a, b in zip((0.0,) + self.ladder, self.ladder)]
        return max(gaps) / 2 ** self.steps

    def meets(self, slo_attainment: Optional[float]) -> bool:
        return slo_attainment is not None and slo_attainment >= self.attainment

    def describe(self, unit: str) -> dict:
        pooled = (f" of its {self.seeds} seeds' runs, pooled," if self.seeds > 1 else "")
        return {"criterion": f"a load meets the SLO when at least {self.attainment:.0%} of the requests{pooled} meet "
                             "TTFT + mean ITL; capacity: the highest offered load that meets it below the lowest that "
                             "does not",
                "attainment": self.attainment, "ladder": list(self.ladder), "ladder_unit": unit,
                "bisection_steps": self.steps, "seeds": self.seeds,
                "max_loads_per_candidate_and_link": self.max_loads,
                "max_runs_per_candidate_and_link": self.max_runs,
                "max_runs_are": "(len(ladder) + bisection_steps) x seeds",
                "resolution": round(self.resolution, 4),
                "resolution_is": f"the widest final bracket, {unit}: the widest ladder gap (from 0 to its first "
                                 "load included) / 2**steps"}


def midpoint(lo: float, hi: float) -> float:
    # Three significant figures: the load names the Poisson trace's seed (poisson_schedule), so a
    # short, stable number keeps runs reproducible and readable.
    return float(f"{(lo + hi) / 2:.3g}")


class Bisection:
    """One candidate's search at one KV link, a run at a time, so a caller can run every
    candidate's next load together (one trace built per load): `next_load` (None: done), then
    `add` that run's row."""

    def __init__(self, spec: Search):
        self.spec = spec
        self.lo, self.hi = 0.0, None  # the highest load that met (0: none yet), the lowest that failed
        self.rung = 0  # ladder loads run
        self.steps = 0  # bisections run
        self.rows: list[dict] = []

    def next_load(self) -> Optional[float]:
        if self.hi is None:
            return self.spec.ladder[self.rung] if self.rung < len(self.spec.ladder) else None
        if self.steps >= self.spec.steps:
            return None
        mid = midpoint(self.lo, self.hi)
        return mid if self.lo < mid < self.hi else None  # past the rounding's resolution: nothing left to learn

    def add(self, x: float, row: dict) -> None:
        """`row`: the run at load x, with `meets` (Search.meets of its attainment) and `rate_rps`."""
        if self.hi is None:
            self.rung += 1
        else:
            self.steps += 1
        self.rows.append(row)
        if row["meets"]:
            self.lo = x
        else:
            self.hi = x


@dataclass(frozen=True)
class Capacity:
    rate_rps: float  # the highest offered load that met the SLO below the lowest that failed (0: none met)
    failed_rps: Optional[float]  # the lowest that failed; None: every load met (not bracketed)
    run: Optional[dict]  # the row at rate_rps (None when none met)

    @property
    def bracketed(self) -> bool:
        return self.failed_rps is not None


def capacity(rows: Sequence[dict]) -> Capacity:
    """From one candidate's runs at one KV link: what `search` converged to, read back from
    the rows alone (also where a load met above one that failed: the lower failure bounds it)."""
    failed = min((r["rate_rps"] for r in rows if not r["meets"]), default=None)
    met = [r for r in rows if r["meets"] and (failed is None or r["rate_rps"] < failed)]
    best = max(met, key=lambda r: r["rate_rps"], default=None)
    return Capacity(best["rate_rps"] if best else 0.0, failed, best)


def seed_capacities(rows: Sequence[dict]) -> list[Capacity]:
    """Each seed's capacity from one candidate's runs at one KV link (rows with `by_seed`, each
    seed's `meets`, in the same seed order): as `capacity`, at the loads the pooled search ran."""
    seeds = len(rows[0]["by_seed"]) if rows and "by_seed" in rows[0] else 0
    return [capacity([{**r, "meets": r["by_seed"][i]["meets"]} for r in rows]) for i in range(seeds)]
