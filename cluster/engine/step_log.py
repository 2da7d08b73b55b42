"""An engine's own step timings, one JSON line per engine step, for benchmarks (off by default).

Why: the simulator's CPU validation (loadtest/sim/README.md) needs to know how long a real
engine's steps take under load, and what each carried, to tell slower steps from queueing.
vLLM 0.32 measures exactly that when `enable_logging_iteration_details` is on: its EngineCore
times each step's model execution (vllm/v1/engine/core.py `capture_iteration_details`: the
wall time from the step's dispatch to its output) and hands it, with the step's context
(prefill) and generation token counts, to every stat logger as
`SchedulerStats.iteration_details`. vLLM only prints it at INFO, which tandem's engines do
not log at (cluster/local.py); this stat logger writes it to a file instead. No vLLM patch.

On when the environment names a directory (`TANDEM_STEP_LOG=DIR`; Ray's workers inherit the
driver's environment through the raylet): each engine replica then appends to
`DIR/<tier>-<role>-<worker id>.jsonl`, and the engine is built with the iteration details on
(cluster/engine/vllm.py). A line (`step_row`): `t` the replica's monotonic clock when the
step's output arrived, `i` vLLM's iteration index, `ctx_reqs`/`ctx_tokens` prefill chunks,
`gen_reqs`/`gen_tokens` decoding, `ms` the step's execution time, `running`/`waiting` the
scheduler's queues after it.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any, Optional

ENV = "TANDEM_STEP_LOG"


def step_log_dir() -> Optional[Path]:
    value = os.environ.get(ENV)
    return Path(value) if value else None


def step_row(details: Any, scheduler_stats: Any, now: float) -> dict:
    """One step's line from vLLM's SchedulerIterationDetails and SchedulerStats (pure)."""
    return {"t": round(now, 4), "i": details.iteration_index, "ctx_reqs": details.num_ctx_requests,
            "ctx_tokens": details.num_ctx_tokens, "gen_reqs": details.num_generation_requests,
            "gen_tokens": details.num_generation_tokens, "ms": round(details.elapsed_ms, 2),
            "running": scheduler_stats.num_running_reqs, "waiting": scheduler_stats.num_waiting_reqs}


def log_path(directory: Path, tier: str, role: str, worker_id: str) -> Path:
    return directory / f"{tier}-{role}-{re.sub(r'[^A-Za-z0-9_.-]', '_', worker_id)}.jsonl"


def step_logger(path: Path) -> type:
    """A vLLM stat logger class (AsyncLLM's `stat_loggers` takes classes) writing to `path`."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class StepLogger(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0):
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = path.open("a", buffering=1)  # a line each: a reader sees whole steps

        def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
                   engine_idx: int = 0) -> None:
            details = getattr(scheduler_stats, "iteration_details", None)
            if details is not None and not details.is_dummy:
                self._file.write(json.dumps(step_row(details, scheduler_stats, time.monotonic())) + "\n")

        def log_engine_initialized(self) -> None:
            pass

    return StepLogger
