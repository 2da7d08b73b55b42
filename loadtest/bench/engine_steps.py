"""The engines' own step timings during a benchmark (goodput.py `--step-log`): what each tandem
engine step took and carried, read from the files its replica writes (cluster/engine/step_log.py),
and how busy each core was meanwhile (its own time and the hypervisor's steal).

`EngineSteps(directory).begin()` before a phase, `.end()` after it: the steps every engine
finished in between, per pool role ("prefill", "decode"), as compact rows (COLUMNS), and the
cores' busy and steal shares. Rows, not summaries: the simulator's loader
(loadtest/sim/step_record.py) makes its own figures from them.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Optional

import psutil

from cluster.engine.step_log import ENV
from loadtest.bench.procs import machine_busy_s

# One step: seconds since the phase began (at the replica's receipt of its output), prompt
# tokens computed (prefill chunks), requests decoding, execution ms, requests waiting after it.
COLUMNS = ("t_s", "ctx_tokens", "gen_reqs", "ms", "waiting")


class EngineSteps:
    def __init__(self, directory: Path):
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        os.environ[ENV] = str(directory)  # tandem's replicas inherit it (step_log.py)
        self._offsets: dict[Path, int] = {}
        self._cores: Optional[list] = None
        self._t0 = 0.0

    def begin(self) -> None:
        self._offsets = {p: p.stat().st_size for p in self.directory.glob("*.jsonl")}
        self._cores = psutil.cpu_times(percpu=True)
        self._t0 = time.monotonic()

    def end(self) -> dict:
        span = max(time.monotonic() - self._t0, 1e-9)
        out: dict = {"columns": list(COLUMNS), "span_s": round(span, 2), "engines": {},
                     "per_core": _core_shares(self._cores or [], psutil.cpu_times(percpu=True), span)}
        for path in sorted(self.directory.glob("*.jsonl")):
            with path.open() as f:
                f.seek(self._offsets.get(path, 0))
                rows = [json.loads(line) for line in f.read().splitlines() if line.strip()]
            # The replica's clock is this machine's monotonic clock: same host, same origin.
            out["engines"][path.stem] = [[round(r["t"] - self._t0, 3), r["ctx_tokens"], r["gen_reqs"], r["ms"],
                                          r["waiting"]] for r in rows]
        return out


def _core_shares(before: list, after: list, span: float) -> list[dict]:
    """Per core: the share of the span it was busy and stolen (procs.machine_busy_s per core)."""
    shares = []
    for b, a in zip(before, after):
        busy, steal = machine_busy_s(b, a)
        shares.append({"busy": round(busy / span, 3), "steal": round(steal / span, 3)})
    return shares
