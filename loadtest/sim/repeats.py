"""How well the measurements repeat themselves: the same cell (system, engine settings, workload,
seed, offered rate, host class) recorded in two runs, judged by the replay's own bar (within
max(0.15 req/s, 20%)). A simulator cannot be held closer to a measurement than the measurement
is to itself, so the validation reports this beside its score. Pure: reads the recorded JSONs.

Each run calibrates its own objectives (multiples of its unloaded TTFT and step, which move by
~10-25% between runs of one afternoon), so a pair is judged from its per-request records under
each run's objectives in turn, and agrees only if it agrees under both: the spread left is the
measurement's, not the yardstick's.

The key leaves out what the goodput JSON does not record: the code's commit (a pair can span
router changes; each pair names its two runs) and the machine's speed within a class (each
run's calibration carries it; the key keeps the host class and dtype).
"""

from __future__ import annotations

import re
from itertools import combinations
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

from loadtest.measure.slo import Objective


def _niceness(command: str) -> str:
    m = re.search(r"--engine-niceness\s+(\d+)", command)
    return m.group(1) if m else "config default"


def cell_key(run: dict, system: str, entry: dict, rate: dict, machine: str) -> tuple:
    wl, eng = run["workload"], run["engines"]
    kinds = tuple(sorted((k, tuple(v)) for k, v in wl["kinds"].items()))
    return (machine, run["dtype"], system, entry.get("max_num_batched_tokens"), eng["max_num_seqs"],
            eng["kv_cache_mib_per_core"], _niceness(run["command"]) if system.startswith("tandem") else "-",
            wl["mix"], wl["prefill_share"], kinds, wl["duration_s"], wl["drain_timeout_s"], wl["seed"], rate["rate_rps"])


def goodput(records: list[dict], objectives: dict, duration_s: float) -> float:
    """The goodput benchmark's judgement (TTFT + mean ITL: `Objective.met_by`) of the recorded
    requests under `objectives`; a record keeps the figures met_by reads, not the token gaps."""
    objective = Objective(objectives["ttft_ms"], objectives["mean_itl_ms"])
    met = sum(objective.met_by(SimpleNamespace(ok=not r.get("error"), ttft_ms=r["ttft_ms"],
                                               mean_itl_ms=r["mean_itl_ms"], max_gap_ms=r.get("max_gap_ms")))
              for r in records)
    return round(met / duration_s, 4)


def repeats(runs: dict[Path, dict], machine_of: Callable[[dict], str], within: Callable[[float, float], bool],
            root: Path) -> dict:
    """Every pair of recordings of one cell, and how many of them agree within the bar under both
    runs' objectives."""
    cells: dict[tuple, list[tuple[str, list[dict], dict, float]]] = {}
    for path, run in sorted(runs.items()):
        for system, entry in run["systems"].items():
            for rate in entry.get("rates", []):
                if "records" not in rate:
                    continue
                key = cell_key(run, system, entry, rate, machine_of(run["machine"]))
                cells.setdefault(key, []).append((str(path.relative_to(root)), rate["records"],
                                                  run["calibration"]["objectives"], run["workload"]["duration_s"]))
    pairs = []
    for key, seen in sorted(cells.items(), key=lambda kv: str(kv[0])):
        for (a, ra, oa, d), (b, rb, ob, _) in combinations(seen, 2):
            judged = {f"under {name}'s objectives": [goodput(ra, o, d), goodput(rb, o, d)] for name, o in (("a", oa), ("b", ob))}
            pairs.append({"system": key[2], "rate_rps": key[-1], "host": key[0], "runs": [a, b], "goodput_rps": judged,
                          "within": all(within(x, y) and within(y, x) for x, y in judged.values())})
    return {"pairs": len(pairs), "within": sum(p["within"] for p in pairs),
            "what": "the same cell recorded twice (system, engine settings, workload, seed, rate, host class), "
                    "judged by the replay's bar both ways round",
            "list": pairs}
