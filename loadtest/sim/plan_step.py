"""Which step-time model `tandem plan` uses, and what the output says about it.

`--step-time auto` (the default) takes the AIConfigurator tables (step_table.py) where they hold
the GPU x model x TP x GEMM precision, else the roofline bound (step_time.py); `table` insists on
the tables, `roofline` on the bound. The provenance carries the tables' source and versions and
what their validation against measured vLLM rows found, read from the committed result
(results/validation-gpu.json) rather than written here, so a re-run of `validate-gpu` that
changes the numbers changes what every plan says.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from loadtest.sim.step_table import TABLES, TableStepTime, load
from loadtest.sim.step_time import ACCELERATORS, MODELS, Roofline, StepTimeModel

VALIDATION = Path(__file__).resolve().parent / "results" / "validation-gpu.json"
CHOICES = ("auto", "table", "roofline")


@dataclass(frozen=True)
class StepChoice:
    """The step-time model a plan runs, why it was chosen, and its validation (None: a bound)."""

    model: StepTimeModel
    kind: str  # "table" | "roofline"
    why: str
    validation: Optional[dict]

    def provenance(self) -> dict:
        return {**self.model.provenance(), "chosen": self.kind, "why": self.why, "validation": self.validation}


def has_table(gpu: str, model: str, tp: int, gemm: str, path: Path = TABLES) -> bool:
    return (gpu, model, tp, gemm) in load(str(path))[1]


def table_validation(gpu: str, model: str, gemm: str, path: Path = VALIDATION) -> dict:
    """What validate_gpu.py found for this GPU x model, from its committed result file."""
    data = json.loads(path.read_text())
    bar = data["bar"]
    group = data["score"].get(f"{gpu} {model}")
    out = {"file": f"loadtest/sim/results/{path.name}", "tpot_bar": bar["tpot_median_err"],
           "ttft_bar": bar["ttft_median_err"], "held_out": "AIConfigurator's measured vLLM serving rows (FP8)"}
    if group is None:
        return {**out, "validated": False,
                "summary": f"unvalidated: no measured rows for {gpu} {model} (the tables are AIConfigurator's composition only)"}
    def verdict(name: str) -> str:
        err, b = group[f"{name}_median_err"], bar[f"{name}_median_err"]
        return f"{name.upper()} {'met' if group[f'{name}_bar_met'] else 'missed'} ({err:.1%} median error, bar {b:.0%})"
    summary = f"{verdict('tpot')}, {verdict('ttft')} on {group['rows']} measured rows of {gpu} {model} FP8"
    if gemm != "fp8":
        # The rows are all FP8; a bf16 table shares the method but not the check.
        summary = f"unvalidated for {gemm} GEMMs (the measured rows are FP8); for FP8: {summary}"
    return {**out, "validated": gemm == "fp8", "rows": group["rows"], "tpot_median_err": group["tpot_median_err"],
            "ttft_median_err": group["ttft_median_err"], "tpot_bar_met": group["tpot_bar_met"],
            "ttft_bar_met": group["ttft_bar_met"], "summary": summary}


def choose_step_time(choice: str, gpu: str, model: str, tp: int, gemm: str, mfu: float, mbu: float) -> StepChoice:
    if choice not in CHOICES:
        raise ValueError(f"--step-time must be one of {CHOICES}, got {choice!r}")
    found = has_table(gpu, model, tp, gemm)
    if choice == "table" and not found:
        have = sorted(load(str(TABLES))[1])
        raise SystemExit(f"--step-time table: no AIConfigurator table for {(gpu, model, tp, gemm)}; have {have}")
    if choice != "roofline" and found:
        why = "--step-time table" if choice == "table" else "auto: the AIConfigurator tables hold this GPU x model x TP"
        return StepChoice(TableStepTime.for_config(gpu, model, tp, gemm), "table", why,
                          table_validation(gpu, model, gemm))
    why = "--step-time roofline" if choice == "roofline" else \
        f"auto: no AIConfigurator table for {gpu} {model} TP{tp} {gemm}, so the roofline bound"
    return StepChoice(Roofline(ACCELERATORS[gpu], MODELS[model], tp, mfu, mbu), "roofline", why, None)


def describe(prov: dict) -> str:
    """One line for the console and the plot's title."""
    if prov["kind"] == "aiconfigurator_table":
        head = (f"AIConfigurator {prov['tool_version']} tables (vLLM {prov['vllm_perf_data']} kernel data), "
                f"{prov['model']} on {prov['gpu']} TP{prov['tp']} {prov['gemm']}")
        return f"{head}; validation: {prov['validation']['summary']}"
    return (f"roofline bound ({prov['model']['name']} on {prov['accelerator']['name']}, TP{prov['tp']}, "
            f"mfu {prov['mfu']}, mbu {prov['mbu']}): not validated, a lower bound")
