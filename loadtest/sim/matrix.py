"""`python -m loadtest.sim matrix`: issue 32's GPU matrix, SIMULATED. tandem adaptive vs colocated
vs always on 8, 16 and 64 H200s, Llama-3.1-70B and 8B, a prefill-heavy and a decode-heavy mix,
under the tier's TTFT + mean-ITL objectives, swept over the KV link bandwidth and a scale of the
measured control-plane cost; verdicts only where their sign holds (matrix_verdicts.py, pure).

Each cell is `tandem plan --gpus`'s machinery (plan_sizing.py splits, capacity and drain;
plan_gpus.py sized configs and KV cache from the GPU's memory; run.py with tandem's real router,
decider, admission and autoscaler; colocated vLLM engines as the baseline). Nothing here decides
a request: the policies are tandem's. Colocated engines pull no KV and make no Serve hop, so one
run per load serves every setting. Every run's decider reasons are kept (decider-rules.json).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from cluster.config import ClusterConfig
from loadtest.bench.workload import Mix, RequestKind, poisson_schedule
from loadtest.sim import LABEL
from loadtest.sim.control_plane import from_benchmark
from loadtest.sim.matrix_verdicts import (AHEAD, BEHIND, COMPARISONS, REUSE_DECLINED, cell_verdicts, count_reasons,
                                          rule_report)
from loadtest.sim.network import LinkSpec
from loadtest.sim.plan_gpus import gpu_kv_bytes, sized_config
from loadtest.sim.plan_inputs import GPU_BLOCK_SIZE, objectives
from loadtest.sim.plan_sizing import TensorParallel, auto_rates, capacity_rps, drain_s, splits
from loadtest.sim.plan_step import choose_step_time, describe
from loadtest.sim.pools import Hardware, engine_params
from loadtest.sim.run import simulate_colocated, simulate_tandem
from loadtest.sim.step_time import MODELS

RESULTS = Path(__file__).resolve().parent / "results"
CONFIG = Path(__file__).resolve().parent / "configs" / "gpu-70b.yaml"  # null KV cache: sized per model and TP
VALIDATION_CPU = RESULTS / "validation.json"
# Rough CPU per simulated token on the 2-core VM (one probe per mix, 2026-12-06: 4096:256 on 70B
# 4.7 ms a request, 512:2048 on 8B 14.6 ms): only for the estimate printed before the runs.
CPU_S_PER_PROMPT_TOKEN, CPU_S_PER_OUTPUT_TOKEN = 0.7e-6, 7e-6


@dataclass(frozen=True)
class Workload:
    name: str
    prompt_tokens: int
    output_tokens: int

    def mix(self) -> Mix:
        kind = RequestKind(self.name, self.prompt_tokens, self.output_tokens)
        return Mix(kind, kind, 1.0)  # one kind of request per mix


PREFILL_HEAVY = Workload("prefill-heavy", 4096, 256)
DECODE_HEAVY = Workload("decode-heavy", 128, 256)


@dataclass(frozen=True)
class Cell:
    gpus: int
    model: str
    tp: int
    workload: Workload
    duration_s: float  # seconds of offered load per run
    load_fractions: tuple[float, ...]  # offered loads as shares of plan_sizing's rough capacity
    max_splits: int

    @property
    def label(self) -> str:
        return f"{self.gpus}xH200 {self.model} TP{self.tp} {self.workload.name}"


@dataclass(frozen=True)
class Grid:
    cells: tuple[Cell, ...]
    bandwidths_gbps: tuple[float, ...]
    cp_scales: tuple[float, ...]  # the measured control-plane cost times these (ControlPlaneCost.scaled)
    seed: int = 0
    gpu: str = "H200"
    gemm: str = "fp8"
    modes: tuple[str, ...] = ("adaptive", "always")
    transfer_fixed_ms: float = 2.0  # tandem plan's default
    control_cores: float = 4.0  # tandem plan's default: the cores the control plane has
    config: Path = CONFIG
    narrowed: tuple[str, ...] = field(default=(), compare=False)


def default_grid(seed: int = 0) -> Grid:
    """Issue 32's matrix, narrowed to ~30 CPU-minutes on a 2-core VM (what was cut: `narrowed`)."""
    # plan_sizing's capacity assumes a decode batch of 64; the engines run up to 256 streams, so
    # a decode-bound mix saturates at a few times that estimate (a first run at 0.6-1.6 x met the
    # SLO at every load for every system: a grid below every capacity says nothing).
    loads = {PREFILL_HEAVY.name: (0.6, 1.0, 1.6), DECODE_HEAVY.name: (1.0, 2.0, 3.0)}
    cells = []
    for gpus in (8, 16, 64):
        for model in ("llama-3.1-70b", "llama-3.1-8b"):
            for work in (PREFILL_HEAVY, DECODE_HEAVY):
                f = loads[work.name]
                if model == "llama-3.1-70b":
                    cells.append(Cell(gpus, model, 4, work, 6.0 if gpus < 64 else 4.0, f, 3 if gpus < 64 else 2))
                elif gpus < 64:  # 8B engines serve hundreds of req/s: shorter runs, half again decode-heavy
                    seconds = (3.0 if gpus == 8 else 2.0) * (0.5 if work is DECODE_HEAVY else 1.0)
                    cells.append(Cell(gpus, model, 1, work, seconds, f, 3))
                else:
                    cells.append(Cell(gpus, model, 2, work, 0.75 if work is DECODE_HEAVY else 1.5, f[1:], 2))
    narrowed = (
        "decode-heavy is ISL 128 / OSL 256 (a few times more decode than prefill engine time), not 512 / 2048: a "
        "request's simulated cost follows its output tokens, and a 2048-token answer outlives any affordable run",
        "3 offered loads per cell (prefill-heavy 0.6, 1.0, 1.6; decode-heavy 1, 2, 3 x plan_sizing's rough capacity), "
        "not the planner's 4",
        "at most 3 P:D splits per cell at 8 and 16 GPUs, 2 at 64 (evenly spaced, both ends kept: 1P:15D and 15P:1D "
        "for 70B, 1P:31D and 31P:1D for 8B): the best split at 64 GPUs may lie between them",
        "seconds of load per run: 70B 6 s (64 GPUs: 4 s); 8B prefill-heavy 3 s at 8 GPUs, 2 s at 16, 1.5 s at 64, "
        "decode-heavy half of that (0.75-1.5 s, still hundreds to thousands of requests a run)",
        "64 H200 of 8B at TP2 (32 engines), not TP1 (64 engines), and only the two higher loads",
        "runs as short as a request's life or shorter (a 256-token answer decodes in seconds): a run measures the "
        "start of a load, not its steady state",
        "one seed: a single trace per load (the 5% margin stands in for its noise, as in tandem plan)")
    return Grid(tuple(cells), (25.0, 100.0, 400.0), (1.0, 4.0), seed=seed, narrowed=narrowed)


@dataclass(frozen=True)
class Prepared:
    """What a cell's runs need, before any of them: its step time, engines, splits and loads."""

    cell: Cell
    choice: object  # plan_step.StepChoice
    kv_bytes: int
    candidates: tuple
    rates: tuple[float, ...]
    capacity_rps: float
    runs_per_load: int  # colocated once, then every split x mode x bandwidth x control-plane scale

    @property
    def runs(self) -> int:
        return len(self.rates) * self.runs_per_load


def prepare(grid: Grid, cell: Cell) -> Prepared:
    choice = choose_step_time("auto", grid.gpu, cell.model, cell.tp, grid.gemm, 0.5, 0.7)
    kv = gpu_kv_bytes(grid.gpu, cell.model, cell.tp, grid.gemm)
    if not kv:
        raise SystemExit(f"{cell.label}: no room for a KV cache after the weights")
    cfg = ClusterConfig.load(grid.config)
    tier = next(iter(cfg.tiers))
    engines = grid_engines(grid, cell)
    candidates = splits(cell.gpus, TensorParallel.uniform(cell.tp), cell.max_splits)
    decode = engine_params(sized_config(cfg, tier, candidates[0], "never", {cell.tp: kv}).tiers[tier].decode,
                           _hardware(cell, choice.model, 1.0), cfg.model.max_model_len, f"{cell.label}: tiers.{tier}.decode")
    w = cell.workload
    cap = capacity_rps(choice.model, [(1.0, w.prompt_tokens, w.output_tokens)], engines,
                       decode.max_num_batched_tokens, decode.max_num_seqs)
    per_load = 1 + (len(candidates) - 1) * len(grid.modes) * len(grid.bandwidths_gbps) * len(grid.cp_scales)
    return Prepared(cell, choice, kv, candidates, auto_rates(cap, cell.load_fractions), cap, per_load)


def grid_engines(grid: Grid, cell: Cell) -> int:
    return cell.gpus // cell.tp


def _hardware(cell: Cell, step, gbps: float, fixed_ms: float = 2.0) -> Hardware:
    return Hardware(step_model=lambda t, r: step, kv_bytes_per_token=MODELS[cell.model].kv_bytes_per_token,
                    default_block_size=GPU_BLOCK_SIZE, link=LinkSpec(gbps * 1e9 / 8, fixed_ms / 1000))


def estimate(p: Prepared) -> tuple[int, float]:
    """(simulated requests, rough CPU seconds) of a cell: the Poisson mean count per run."""
    w = p.cell.workload
    requests = round(sum(p.rates) * p.cell.duration_s * p.runs_per_load)
    return requests, requests * (w.prompt_tokens * CPU_S_PER_PROMPT_TOKEN + w.output_tokens * CPU_S_PER_OUTPUT_TOKEN)


def _row(system: str, candidate: str, rate: float, bw: Optional[float], cp: Optional[float], res, mean, every,
         duration: float, engines: int) -> dict:
    s = res.summary(mean, every, duration, engines)
    declined = sum(1 for _, d in res.trace.verdicts if d.path == "remote" and not d.reuse_first_token)
    return {"system": system, "candidate": candidate, "rate_rps": rate, "bandwidth_gbps": bw, "cp_scale": cp,
            "goodput_rps": s["goodput_rps"], "ttft_p90_ms": s["ttft"].get("p90_ms"),
            "mean_itl_p50_ms": s["mean_itl"].get("p50_ms"), "reasons": res.trace.reasons(), "reuse_declined": declined,
            "control_peak_cores": res.control["peak_cores_1s"]}


def run_cell(grid: Grid, cell: Cell) -> dict:
    """Every run of one cell, and its verdicts. Deterministic: seeded traces, simulated clock."""
    p = prepare(grid, cell)
    cfg = ClusterConfig.load(grid.config)
    tier_name, tier = next(iter(cfg.tiers.items()))
    mean, every = objectives(tier)
    step = p.choice.model
    engines = grid_engines(grid, cell)
    w = cell.workload
    drain = drain_s(cell.duration_s, tier.slo.ttft_s, tier.slo.itl_s, w.output_tokens)
    kv = {cell.tp: p.kv_bytes}
    colocated = engine_params(sized_config(cfg, tier_name, p.candidates[0], "never", kv).tiers[tier_name].decode,
                              _hardware(cell, step, 1.0), cfg.model.max_model_len, f"{cell.label}: tiers.{tier_name}.decode")
    tandem0, vllm = from_benchmark("tandem"), from_benchmark("vllm")
    rows = []
    for rate in p.rates:
        schedule = poisson_schedule(w.mix(), rate, cell.duration_s, grid.seed)
        res = simulate_colocated(engines, colocated, step, vllm, schedule, drain_timeout_s=drain,
                                 control_cores=grid.control_cores, shares_engine_cores=None)
        rows.append(_row("colocated", p.candidates[0].label, rate, None, None, res, mean, every, cell.duration_s, engines))
        for gbps in grid.bandwidths_gbps:
            hw = _hardware(cell, step, gbps, grid.transfer_fixed_ms)
            for scale in grid.cp_scales:
                cost = tandem0.scaled(scale)
                for split in p.candidates[1:]:
                    for mode in grid.modes:
                        res = simulate_tandem(sized_config(cfg, tier_name, split, mode, kv), hw, cost, schedule,
                                              seed=grid.seed, drain_timeout_s=drain, control_cores=grid.control_cores,
                                              shares_engine_cores=None, tier=tier_name)
                        rows.append(_row(mode, f"{mode} {split.label}", rate, gbps, scale, res, mean, every,
                                         cell.duration_s, engines))
        print(f"[matrix] {cell.label}: load {rate:g} req/s done", file=sys.stderr, flush=True)
    tandem_rows = [r for r in rows if r["system"] != "colocated"]
    peak = max((r["control_peak_cores"] for r in tandem_rows), default=0.0)
    return {"cell": cell.label, "gpus": cell.gpus, "model": cell.model, "tp": cell.tp, "engines": engines,
            "workload": asdict(w), "duration_s": cell.duration_s, "drain_s": drain, "rates_rps": list(p.rates),
            "estimated_capacity_rps": round(p.capacity_rps, 2), "splits": [s.label for s in p.candidates],
            "kv_cache_bytes_per_engine": p.kv_bytes, "step_time": describe(p.choice.provenance()),
            "step_time_validation": p.choice.validation["summary"] if p.choice.validation else "a roofline bound",
            "control_plane": {"peak_cores_1s": peak, "cores": grid.control_cores,
                              "runs_past_its_cores": sum(1 for r in tandem_rows if r["control_peak_cores"] > grid.control_cores)},
            **cell_verdicts(rows, max(p.rates)), "rows": rows}


def _run_one(args: tuple[Grid, Cell]) -> dict:
    return run_cell(*args)


def run_matrix(grid: Grid, jobs: int = 1) -> tuple[dict, dict]:
    """(gpu-matrix.json, decider-rules.json) contents. `jobs` processes run cells side by side;
    the output is the same for any `jobs` (each cell is seeded alone, collected in grid order)."""
    work = [(grid, c) for c in grid.cells]
    if jobs > 1 and len(work) > 1:
        # The costliest cells first, so the last one to finish is a short one; collected in grid order.
        order = sorted(range(len(work)), key=lambda i: -estimate(prepare(grid, grid.cells[i]))[1])
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = {i: pool.submit(_run_one, work[i]) for i in order}
            cells = [futures[i].result() for i in range(len(work))]
    else:
        cells = [_run_one(w) for w in work]
    cfg = ClusterConfig.load(grid.config)
    tier_name, tier = next(iter(cfg.tiers.items()))
    tandem, vllm = from_benchmark("tandem"), from_benchmark("vllm")
    steps = {f"{c.model} TP{c.tp}": choose_step_time("auto", grid.gpu, c.model, c.tp, grid.gemm, 0.5, 0.7).provenance()
             for c in grid.cells}
    matrix = {
        "label": LABEL, "what": "issue 32's GPU matrix: tandem adaptive vs colocated vs always, simulated goodput under "
                                "TTFT + mean ITL; a verdict only where its sign holds at every swept setting",
        "provenance": {
            "step_time": steps,
            "kv_link": {"bandwidths_gbps": list(grid.bandwidths_gbps), "fixed_ms": grid.transfer_fixed_ms},
            "control_plane": {"tandem": tandem.source, "colocated": vllm.source, "scales": list(grid.cp_scales),
                              "scaled": "CPU per token and request, baseline cores and the Serve hop latency "
                                        "(control_plane.py ControlPlaneCost.scaled)",
                              "acts_through": "on GPU engines the control plane has cores of its own: only the hop "
                                              "latency reaches the goodput; its CPU shows as the cores it needs "
                                              "(peak_cores_1s), a saturated control plane is not modelled",
                              "cores": grid.control_cores},
            "colocated": "vLLM engines, each doing both phases, request i on engine i mod n; no KV link, no Serve hop: "
                         "one run per load serves every setting",
            "config": str(grid.config.relative_to(Path(__file__).resolve().parents[2])), "tier": tier_name,
            "cpu_validation": _cpu_validation()},
        "objectives": {"ttft_ms": tier.slo.ttft_s * 1000, "mean_itl_ms": tier.slo.itl_s * 1000,
                       "goodput": "requests meeting TTFT and mean ITL per second of offered load"},
        "grid": {"gpu": grid.gpu, "gemm": grid.gemm, "modes": list(grid.modes), "seed": grid.seed,
                 "bandwidths_gbps": list(grid.bandwidths_gbps), "cp_scales": list(grid.cp_scales),
                 "cells": [{**asdict(c), "label": c.label} for c in grid.cells], "narrowed": list(grid.narrowed)},
        "verdict_rule": "ahead/behind only when adaptive is so at every (bandwidth, control-plane scale) by more than "
                        "5% of the winner (tandem plan's noise margin); else 'sign does not hold'",
        "summary": [{"cell": c["cell"], **{k: v["label"] for k, v in c["verdicts"].items()}} for c in cells],
        "cells": cells}
    return matrix, rules_json(cells, grid)


def _cpu_validation() -> str:
    s = json.loads(VALIDATION_CPU.read_text())["score"]
    own = s.get("own_engines")
    return (f"loadtest/sim/results/validation.json: {s['within']}/{s['cells']} cells within its bar"
            + (f"; {own['within']}/{own['cells']} in the {own['runs']} runs replayed at their own engines' speed" if own else ""))


def rules_json(cells: list[dict], grid: Grid) -> dict:
    counts = count_reasons(r for c in cells for r in c["rows"])
    seen = json.loads(VALIDATION_CPU.read_text())["score"]["reasons_seen"]
    return {"label": LABEL, "what": "decider reasons: how many decisions each made in the simulated GPU matrix, "
                                    "beside the CPU validation's measured and replayed runs; the ones no run gave",
            "sources": {"matrix": "loadtest/sim/results/gpu-matrix.json (every tandem run, every request's verdict)",
                        "measured": f"loadtest/sim/results/validation.json score.reasons_seen.measured "
                                    f"({len(json.loads(VALIDATION_CPU.read_text())['runs'])} recorded goodput runs, 2-core VMs)",
                        "replayed": "the same file's score.reasons_seen.simulated",
                        "rules": "router/routing/decider.py (numbering of its docstring)"},
            "matrix_seed": grid.seed, "matrix_by_mode": counts,
            **rule_report(counts, seen["measured"], seen["simulated"]),
            "note": "a rule that fires may still not change an outcome; one that never fires changes none here. "
                    f"No rule was deleted. {REUSE_DECLINED}: counted in the matrix only."}


def write(matrix: dict, rules: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu-matrix.json").write_text(json.dumps(matrix, indent=1, sort_keys=True) + "\n")
    (out / "decider-rules.json").write_text(json.dumps(rules, indent=1, sort_keys=True) + "\n")


def plot(matrix: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = matrix["cells"]
    settings = [(s["bandwidth_gbps"], s["cp_scale"]) for s in cells[0]["per_setting"]]
    fig, axes = plt.subplots(1, len(COMPARISONS), figsize=(7.5 * len(COMPARISONS), 1.2 + 0.42 * len(cells)), squeeze=False)
    for ax, (a, b) in zip(axes[0], COMPARISONS):
        grid, text = [], []
        for c in cells:
            row, labels = [], []
            for s in c["per_setting"]:
                x, y = s[a]["goodput_rps"], s[b]["goodput_rps"]
                r = x / y if y > 0 else (float("inf") if x > 0 else float("nan"))
                row.append(min(max(r, 0.25), 4.0) if r == r else float("nan"))
                labels.append("-" if r != r else "inf" if r == float("inf") else f"{r:.2f}")
            grid.append(row)
            text.append(labels)
        import math
        ax.imshow([[math.log2(v) if v == v else float("nan") for v in row] for row in grid], cmap="RdBu", vmin=-1.2,
                  vmax=1.2, aspect="auto")
        for i, labels in enumerate(text):
            for j, t in enumerate(labels):
                ax.text(j, i, t, ha="center", va="center", fontsize=7)
        mark = {AHEAD: "AHEAD", BEHIND: "BEHIND"}
        ax.set_yticks(range(len(cells)), [f"{c['cell']}  [{mark.get(c['verdicts'][f'{a} vs {b}']['label'], 'no sign')}]"
                                          for c in cells], fontsize=7)
        ax.set_xticks(range(len(settings)), [f"{bw:g} Gb/s\ncp x{cp:g}" for bw, cp in settings], fontsize=7)
        ax.set_title(f"{a} / {b} goodput (blue: adaptive ahead); [verdict]", fontsize=8)
    fig.suptitle(f"{LABEL}: not measured. GPU matrix, H200, AIConfigurator step tables (TTFT validation bar missed; "
                 f"8B TPOT missed too). Goodput under TTFT {matrix['objectives']['ttft_ms']:g} ms + mean ITL "
                 f"{matrix['objectives']['mean_itl_ms']:g} ms", fontsize=8, color="darkred", wrap=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, default=RESULTS, help="folder for gpu-matrix.json/.png and decider-rules.json")
    p.add_argument("--jobs", type=int, default=1, help="cells simulated side by side (processes)")
    p.add_argument("--cells", nargs="*", help="only cells whose label contains one of these (e.g. '8xH200 llama-3.1-70b')")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--estimate", action="store_true", help="print the runs and the rough CPU time, run nothing")


def main(args: argparse.Namespace) -> int:
    grid = default_grid(args.seed)
    if args.cells:
        grid = Grid(tuple(c for c in grid.cells if any(s in c.label for s in args.cells)), grid.bandwidths_gbps,
                    grid.cp_scales, seed=grid.seed, narrowed=grid.narrowed)
    total_req, total_cpu = 0, 0.0
    for cell in grid.cells:
        p = prepare(grid, cell)
        req, cpu = estimate(p)
        total_req, total_cpu = total_req + req, total_cpu + cpu
        print(f"{cell.label:<42} {len(p.candidates) - 1} splits, loads {', '.join(f'{r:g}' for r in p.rates)} req/s, "
              f"{p.runs} runs of {cell.duration_s:g} s, ~{req:,} requests, ~{cpu / 60:.1f} CPU-min")
    print(f"{LABEL}: {len(grid.cells)} cells, ~{total_req:,} simulated requests, roughly {total_cpu / 60:.0f} CPU-minutes "
          f"({args.jobs} job{'s' if args.jobs > 1 else ''})", flush=True)
    if args.estimate:
        return 0
    started = time.monotonic()
    matrix, rules = run_matrix(grid, args.jobs)
    write(matrix, rules, args.out)
    try:
        plot(matrix, args.out / "gpu-matrix.png")
    except ImportError:
        print("gpu-matrix.png not drawn: matplotlib is missing")
    for s in matrix["summary"]:
        print(f"  {s['cell']:<42} " + "  ".join(f"{k}: {v}" for k, v in s.items() if k != "cell"))
    print(f"never fired anywhere: {', '.join(rules['never_fired']) or 'none'}")
    print(f"simulated in {time.monotonic() - started:.0f} s wall; written {args.out}/gpu-matrix.json, gpu-matrix.png, "
          "decider-rules.json")
    return 0
