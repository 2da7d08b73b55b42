"""How well the measurements repeat themselves: the same cell (system, engine settings, workload,
seed, offered rate, host class) recorded in two runs, judged by the replay's own bar (within
max(0.15 req/s, 20%)). A simulator cannot be held closer to a measurement than the measurement
is to itself, so the validation reports this beside its score. Pure: reads the recorded JSONs.

The key leaves out what the goodput JSON does not record: the code's commit (a pair can span
router changes; each pair names its two runs) and the machine's speed within a class (each
run's calibration carries it; the key keeps the host class and dtype).
"""

from __future__ import annotations

import re
from itertools import combinations
from pathlib import Path
from typing import Callable


def _niceness(command: str) -> str:
    m = re.search(r"--engine-niceness\s+(\d+)", command)
    return m.group(1) if m else "config default"


def cell_key(run: dict, system: str, entry: dict, rate: dict, machine: str) -> tuple:
    wl, eng = run["workload"], run["engines"]
    kinds = tuple(sorted((k, tuple(v)) for k, v in wl["kinds"].items()))
    return (machine, run["dtype"], system, entry.get("max_num_batched_tokens"), eng["max_num_seqs"],
            eng["kv_cache_mib_per_core"], _niceness(run["command"]) if system.startswith("tandem") else "-",
            wl["mix"], wl["prefill_share"], kinds, wl["duration_s"], wl["drain_timeout_s"], wl["seed"], rate["rate_rps"])


def repeats(runs: dict[Path, dict], machine_of: Callable[[dict], str], within: Callable[[float, float], bool],
            root: Path) -> dict:
    """Every pair of recordings of one cell, and how many of them agree within the bar."""
    cells: dict[tuple, list[tuple[str, float]]] = {}
    for path, run in sorted(runs.items()):
        for system, entry in run["systems"].items():
            for rate in entry.get("rates", []):
                key = cell_key(run, system, entry, rate, machine_of(run["machine"]))
                cells.setdefault(key, []).append((str(path.relative_to(root)), rate["goodput_rps"]))
    pairs = []
    for key, seen in sorted(cells.items(), key=lambda kv: str(kv[0])):
        for (a, ga), (b, gb) in combinations(seen, 2):
            pairs.append({"system": key[2], "rate_rps": key[-1], "host": key[0], "runs": [a, b],
                          "goodput_rps": [ga, gb], "within": within(ga, gb) and within(gb, ga)})
    return {"pairs": len(pairs), "within": sum(p["within"] for p in pairs),
            "what": "the same cell recorded twice (system, engine settings, workload, seed, rate, host class), "
                    "judged by the replay's bar both ways round",
            "list": pairs}
