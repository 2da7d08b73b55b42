"""The control plane: CPU per request and per streamed token, a latency per hop, and the cores
it takes from the engines when it shares theirs.

Costs come from measurements, with their source kept beside them:
- CPU per streamed token: the control-plane benchmark (loadtest/bench/results/
  control_plane-issue27.json): tandem's processes together, with engines that cost nothing,
  and vLLM's own API server for the colocated baseline (`from_benchmark`).
- the latency a Serve hop adds: DESIGN.md, 500-token prompt at concurrency 1 on the tiny
  model: the engine alone 47 ms, one engine through tandem's ingress 66 ms (one hop ~19 ms).
- the cores it keeps busy whatever the token rate (Serve's proxy and controller, raylet, GCS,
  the replicas' loops): loadtest/bench/RESULTS.md section 9's table, the real cluster with real
  engines on the 2-core VM at 0.87 and 1.67 req/s: tandem's processes between client and engine
  0.42 and 0.37 cores, two vLLM API servers 0.03. The per-token benchmark above cannot see
  this part (its load is the tokens); the baseline is the table's lower figure less what the
  per-token cost explains at that load (a few hundredths), rounded: 0.35 and 0.03 cores.

When the control plane runs on the engines' cores (the 2-core VM), engines are pinned one
per core (cluster/config cpu_binding; the goodput benchmark binds prefill to 0, decode to 1,
colocated engine i to i) and the control plane's processes are not: the kernel runs them on
whichever core is free first. So its load over the last second goes to the cores of idle
engines first, and only what is left is shared by the busy engines' cores (processor sharing:
a busy engine's step takes 1 / (1 - its core's share) longer). Measured beside it: an isolated
512-token prompt through tandem took its engine's unloaded TTFT plus 90-160 ms of path on four
of the five EPYC runs (decode idle: its core took the control plane), not the 1.23x a uniform
spread gives. On a GPU cluster the control plane has its own cores and slows nothing;
`cores_needed` then says how many it takes, and `saturated` where it runs out.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import median
from typing import Optional

BENCH = Path(__file__).resolve().parents[1] / "bench" / "results" / "control_plane-issue27.json"
WINDOW_S = 1.0
MAX_STEAL = 0.9  # engines keep at least a tenth of their cores: the OS schedules them too
SERVE_HOP_S = 0.019  # DESIGN.md: 66 ms through one hop vs 47 ms for the engine alone
BASELINE_CORES = {"tandem": 0.35, "vllm": 0.03}  # RESULTS.md section 9 (module docstring)


@dataclass(frozen=True)
class ControlPlaneCost:
    per_token_cpu_s: float
    per_request_cpu_s: float
    hop_s: float  # latency added by each hop the request makes between processes
    source: str
    baseline_cores: float = 0.0  # busy whatever the load (see the module docstring)

    def scaled(self, factor: float) -> "ControlPlaneCost":
        """Every part `factor` times (CPU per token and request, baseline cores, hop latency): a
        sensitivity, for a control plane on other hardware than the one measured. On GPU engines
        (cores of its own) only the hop latency reaches the goodput; the CPU shows in the cores
        it needs (`summary`'s peak_cores_1s)."""
        if factor <= 0:
            raise ValueError(f"a control-plane cost scale must be positive, got {factor}")
        if factor == 1:
            return self
        return ControlPlaneCost(self.per_token_cpu_s * factor, self.per_request_cpu_s * factor, self.hop_s * factor,
                                f"{self.source}; every part x{factor:g} (a sensitivity, not measured)",
                                self.baseline_cores * factor)


def from_benchmark(system: str, path: Path = BENCH, hop_s: float = SERVE_HOP_S) -> ControlPlaneCost:
    """The median over the benchmark's cells of the CPU per token: `tandem` (all its processes)
    or `vllm` (its API server alone; its engine is the engine model's)."""
    if not path.exists():
        raise FileNotFoundError(f"the control-plane costs come from the benchmark's record {path}, which only a source "
                                "checkout of tandem has: run the simulator from one")
    data = json.loads(path.read_text())
    cells = data["systems"][system]["cells"]
    key = "total" if system.startswith("tandem") else "vLLM API server"
    per_token = median(c["cpu_ms_per_token"][key] for c in cells) / 1000
    kind = "tandem" if system.startswith("tandem") else "vllm"
    return ControlPlaneCost(per_token, 0.0, hop_s if kind == "tandem" else 0.0,
                            f"{path.name}: systems.{system}.cells[*].cpu_ms_per_token.{key} (median); "
                            f"baseline cores: RESULTS.md section 9", BASELINE_CORES[kind])


class ControlPlane:
    def __init__(self, cost: ControlPlaneCost, cores: float, shares_engine_cores: Optional[float] = None):
        """`shares_engine_cores`: the engines' cores it runs on (None: cores of its own)."""
        self.cost = cost
        self.cores = cores
        self.shared = shares_engine_cores
        self.reset_counts()
        self._recent: deque[tuple[float, float]] = deque()
        self._recent_sum = 0.0
        self.busy_engines = 0  # engines computing a step now (engine.py on_busy)

    def reset_counts(self) -> None:
        """What `summary` reports starts again (a measured rate after a warm-up); the load of the
        last second stays, it is on the cores."""
        self.cpu_s = 0.0
        self.tokens = 0  # what cpu_s was charged for, so a reader can redo the product
        self.requests = 0
        self.peak_cores = 0.0

    def charge(self, now: float, tokens: int = 0, requests: int = 0) -> None:
        self.tokens += tokens
        self.requests += requests
        cpu = tokens * self.cost.per_token_cpu_s + requests * self.cost.per_request_cpu_s
        if cpu <= 0:
            return
        self.cpu_s += cpu
        self._recent.append((now, cpu))
        self._recent_sum += cpu
        self._forget(now)
        self.peak_cores = max(self.peak_cores, self.cost.baseline_cores + self._recent_sum / WINDOW_S)

    def _forget(self, now: float) -> None:
        while self._recent and self._recent[0][0] < now - WINDOW_S:
            self._recent_sum -= self._recent.popleft()[1]

    def busy_cores(self, now: float) -> float:
        self._forget(now)
        return self.cost.baseline_cores + self._recent_sum / WINDOW_S

    def engine_busy(self, busy: bool) -> None:
        self.busy_engines = max(self.busy_engines + (1 if busy else -1), 0)

    def slowdown(self, now: float) -> float:
        """How much longer a busy engine's step takes because the control plane shares its core:
        the load the idle engines' cores cannot take, spread over the busy engines' cores."""
        if not self.shared:
            return 1.0
        busy = max(self.busy_engines, 1)  # the caller is about to step
        idle_cores = max(self.shared - busy, 0.0)
        left = max(self.busy_cores(now) - idle_cores, 0.0)
        return 1.0 / (1.0 - min(left / busy, MAX_STEAL))

    def summary(self, span_s: float) -> dict:
        mean = self.cost.baseline_cores + (self.cpu_s / span_s if span_s > 0 else 0.0)
        return {"cost": asdict(self.cost), "cores": self.cores, "shares_engine_cores": self.shared,
                "cpu_s": round(self.cpu_s, 3), "tokens": self.tokens, "requests": self.requests, "span_s": round(span_s, 3),
                "mean_cores": round(mean, 3), "peak_cores_1s": round(self.peak_cores, 3),
                "saturated": self.peak_cores > self.cores}
