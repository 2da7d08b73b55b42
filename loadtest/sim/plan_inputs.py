"""What `tandem plan` reads from its arguments, shared by the sweep of one config (plan.py) and
the sweep of a GPU budget's splits (plan_gpus.py): the GPU, the step-time model, the workload
mix and the tier's objectives."""

from __future__ import annotations

import argparse

from loadtest.bench.workload import Mix, RequestKind
from loadtest.measure.slo import Objective
from loadtest.sim.plan_step import StepChoice, choose_step_time

GPU_BLOCK_SIZE = 16  # vLLM's default block size on CUDA


def _kind(name: str, spec: str) -> RequestKind:
    prompt, output = (int(x) for x in spec.split(":"))
    return RequestKind(name, prompt, output)


def accelerator(args: argparse.Namespace) -> str:
    """The GPU: --gpus's, else --accelerator's, else H200; both given must agree."""
    if not getattr(args, "gpus", None):
        return args.accelerator or "H200"
    from loadtest.sim.plan_sizing import GpuBudget

    try:
        gpu = GpuBudget.parse(args.gpus).gpu
    except ValueError as exc:
        raise SystemExit(str(exc))
    if args.accelerator and args.accelerator != gpu:
        raise SystemExit(f"--accelerator {args.accelerator} contradicts --gpus {args.gpus}")
    return gpu


def step_choice(args: argparse.Namespace) -> StepChoice:
    return choose_step_time(args.step_time, accelerator(args), args.model, args.tp, args.gemm, args.mfu, args.mbu)


def workload(args: argparse.Namespace) -> Mix:
    return Mix(_kind("prefill-heavy", args.long), _kind("decode-heavy", args.short), args.prefill_share)


def objectives(tier) -> tuple[Objective, Objective]:
    """(TTFT + mean ITL, the same + every gap): the goodput benchmark's two judgements."""
    return (Objective(tier.slo.ttft_s * 1000, tier.slo.itl_s * 1000),
            Objective(tier.slo.ttft_s * 1000, tier.slo.itl_s * 1000, tier.slo.gap_s * 1000))
