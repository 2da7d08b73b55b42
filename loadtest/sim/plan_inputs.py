"""What `tandem plan` reads from its arguments, shared by the sweep of one config (plan.py) and
the sweep of a GPU budget's splits (plan_gpus.py): the GPU, the step-time model, the workload
(the seeded mix or a trace, workload_trace.py), its offered loads and the tier's objectives."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional, Union

from cluster.config import ClusterConfig, ConfigError
from loadtest.bench.workload import Mix, RequestKind, poisson_schedule
from loadtest.measure.slo import Objective
from loadtest.sim.plan_cli import MIX_LONG, MIX_PREFILL_SHARE, MIX_SHORT
from loadtest.sim.plan_sizing import GpuBudget, TensorParallel
from loadtest.sim.plan_step import StepChoice, choose_step_time
from loadtest.sim.workload_trace import Load, TraceError, WorkloadTrace, read_trace

Workload = Union[Mix, WorkloadTrace]

GPU_BLOCK_SIZE = 16  # vLLM's default block size on CUDA
SLO_KEYS = {"ttft": "ttft_s", "itl": "itl_s", "max_gap": "max_gap_s"}  # --slo key -> the tier's slo field
# (flag, its attribute): what only shapes the seeded mix. Beside a trace they would be dropped
# without a word, and a user who passed one expects it to have done something.
MIX_ONLY = (("--long", "long"), ("--short", "short"), ("--prefill-share", "prefill_share"),
            ("--duration", "duration"), ("--max-requests", "max_requests"))


def cluster_config(args: argparse.Namespace) -> ClusterConfig:
    """The config, its first tier's objectives replaced by --slo where given: in the config, so the
    decider's budgets, admission and the goodput judgement all read the same ones."""
    try:
        cfg = ClusterConfig.load_checked(args.config)
        if args.slo:
            tier = next(iter(cfg.tiers))
            cfg = ClusterConfig.load_checked(args.config, {"tiers": {tier: {"slo": parse_slo(args.slo)}}})
    except ConfigError as exc:
        raise SystemExit(str(exc)) from None
    return cfg


def parse_slo(text: str) -> dict[str, float]:
    """`ttft=1.5,itl=0.04[,max_gap=0.08]` (seconds) -> the tier's slo fields; SLOConfig checks the values."""
    out = {}
    for part in text.split(","):
        key, _, value = part.partition("=")
        if key.strip() not in SLO_KEYS:
            raise SystemExit(f"--slo: unknown objective {key.strip()!r}; use {', '.join(SLO_KEYS)} (seconds), "
                             "e.g. --slo ttft=1.5,itl=0.04")
        try:
            out[SLO_KEYS[key.strip()]] = float(value)
        except ValueError:
            raise SystemExit(f"--slo: {key.strip()} wants seconds, got {value.strip()!r}") from None
    return out


def _kind(name: str, spec: str) -> RequestKind:
    prompt, output = (int(x) for x in spec.split(":"))
    return RequestKind(name, prompt, output)


def accelerator(args: argparse.Namespace) -> str:
    """The GPU: --gpus's, else --accelerator's, else H200; both given must agree."""
    if not getattr(args, "gpus", None):
        return args.accelerator or "H200"
    try:
        gpu = GpuBudget.parse(args.gpus).gpu
    except ValueError as exc:
        raise SystemExit(str(exc))
    if args.accelerator and args.accelerator != gpu:
        raise SystemExit(f"--accelerator {args.accelerator} contradicts --gpus {args.gpus}")
    return gpu


def step_choice(args: argparse.Namespace, tp: int) -> StepChoice:
    """The step-time model of an engine of `tp` GPUs (one per pool's TP with --gpus)."""
    return choose_step_time(args.step_time, accelerator(args), args.model, tp, args.gemm, args.mfu, args.mbu)


def tensor_parallel(args: argparse.Namespace) -> TensorParallel:
    """--tp, --prefill-tp, --decode-tp, the pools' two defaulted to --tp here."""
    try:
        return TensorParallel(args.tp, args.tp if args.prefill_tp is None else args.prefill_tp,
                              args.tp if args.decode_tp is None else args.decode_tp)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None


def workload(args: argparse.Namespace) -> Workload:
    """`--workload mix` (the default): the seeded Poisson mix of --long / --short / --prefill-share,
    the goodput benchmark's own, their defaults filled in here; else the trace file it names,
    checked line by line here, with no mix-only flag beside it."""
    if args.workload == "mix":
        return Mix(_kind("prefill-heavy", args.long or MIX_LONG), _kind("decode-heavy", args.short or MIX_SHORT),
                   MIX_PREFILL_SHARE if args.prefill_share is None else args.prefill_share)
    given = [flag for flag, attr in MIX_ONLY if getattr(args, attr, None) is not None]
    if given:
        raise SystemExit(f"{', '.join(given)} appl{'ies' if len(given) == 1 else 'y'} to --workload mix only: with the "
                         f"trace {args.workload} the trace is the load (its requests' sizes, its window up to its last "
                         "arrival over the --rates speed); drop " + ", ".join(given) + ", or edit or cut the trace file")
    try:
        return read_trace(Path(args.workload))
    except TraceError as exc:
        raise SystemExit(str(exc)) from None


def rates(args: argparse.Namespace, wl: Workload, mix_default: Optional[str]) -> Optional[tuple[float, ...]]:
    """--rates as numbers: req/s for the mix (`mix_default` when not given; None: the caller's
    auto grid), replay speeds for a trace (default 1: the trace as written)."""
    text = args.rates or (mix_default if isinstance(wl, Mix) else "1")
    if text in (None, "auto"):
        if isinstance(wl, WorkloadTrace):
            raise SystemExit("--rates auto is for --workload mix; a trace's --rates are replay speeds (e.g. 0.5,1,2)")
        return None
    try:
        out = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise SystemExit(f"--rates wants numbers separated by commas, got {text!r}") from None
    if not all(x > 0 for x in out):
        raise SystemExit(f"--rates must be positive, got {text!r}")
    return out


def load(wl: Workload, x: float, duration_s: float, seed: int) -> Load:
    """One run's offered load: the mix at `x` req/s over `duration_s`, or the trace at speed `x`
    (its own window: `duration_s` is the mix's alone)."""
    if isinstance(wl, Mix):
        return Load(x, duration_s, poisson_schedule(wl, x, duration_s, seed))
    return wl.load(x, seed)


def kinds(wl: Workload) -> list[tuple[float, int, int]]:
    """(share, prompt tokens, output tokens): plan_sizing.capacity_rps's input."""
    if isinstance(wl, Mix):
        return [(wl.prefill_share, wl.prefill_heavy.prompt_tokens, wl.prefill_heavy.output_tokens),
                (1 - wl.prefill_share, wl.decode_heavy.prompt_tokens, wl.decode_heavy.output_tokens)]
    return wl.kinds()


def max_output(wl: Workload) -> int:
    return max(o for _, _, o in kinds(wl))


def describe(wl: Workload) -> dict:
    """The JSON's workload: the mix's settings, or the trace's summary and how --rates read it."""
    if isinstance(wl, Mix):
        long, short = wl.prefill_heavy, wl.decode_heavy
        return {"mix": {"long": f"{long.prompt_tokens}:{long.output_tokens}",
                        "short": f"{short.prompt_tokens}:{short.output_tokens}", "prefill_share": wl.prefill_share}}
    return {"trace": wl.describe(), "rates_are": "replay speeds of the trace's own rate (1: as written)"}


def objectives(tier) -> tuple[Objective, Objective]:
    """(TTFT + mean ITL, the same + every gap): the goodput benchmark's two judgements."""
    return (Objective(tier.slo.ttft_s * 1000, tier.slo.itl_s * 1000),
            Objective(tier.slo.ttft_s * 1000, tier.slo.itl_s * 1000, tier.slo.gap_s * 1000))
