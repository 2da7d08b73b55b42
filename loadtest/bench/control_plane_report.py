"""The control-plane benchmark's tables and plot, from its JSON alone (so `--replot` redraws
a past run): one row per system and cell; CPU per streamed token by process kind; and a PNG
of delivered tokens/s and CPU per token against streams, one line per system."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from loadtest.bench.control_plane_stats import API_SERVER, TOTAL


def _num(value: Optional[float], fmt: str = "{:,.0f}") -> str:
    return "-" if value is None else fmt.format(value)


def headline_cpu(system: dict, cell: dict) -> Optional[float]:
    """The CPU per token a system's frontend costs: all of tandem's processes (FakeEngine
    computes nothing, so all of it is the control plane); vLLM's API-server process alone
    (its engine's cost is the real model's, reported apart)."""
    kind = API_SERVER if system.get("kind") == "vllm" else TOTAL
    return cell["cpu_ms_per_token"].get(kind)


def figures_table(result: dict) -> str:
    head = ("| system | streams | demanded tok/s | delivered tok/s | gap p50 / p99 / max ms | TTFT p50 / p99 ms "
            "| errors | frontend CPU ms/token | load generator ms/token | machine busy cores |")
    rows = [head, "|" + " --- |" * (head.count("|") - 1)]
    for name, system in result["systems"].items():
        for cell in system.get("cells", []):
            gap, ttft, req = cell["token_gap"], cell["ttft"], cell["requests"]
            errors = req["errors"] + req["errors_outside_window"]
            rows.append(
                f"| {name} | {cell['streams']} | {_num(cell['demanded_tok_s'])} | {_num(cell['delivered_tok_s'])} "
                f"| {_num(gap.get('p50_ms'))} / {_num(gap.get('p99_ms'))} / {_num(gap.get('max_ms'))} "
                f"| {_num(ttft.get('p50_ms'))} / {_num(ttft.get('p99_ms'))} | {errors} "
                f"| {_num(headline_cpu(system, cell), '{:.3f}')} "
                f"| {_num(cell['load_generator']['cpu_ms_per_token'], '{:.3f}')} "
                f"| {_num(cell['machine']['busy_cores'], '{:.2f}')} |")
    return "\n".join(rows)


def cpu_table(result: dict) -> str:
    """CPU ms per streamed token by kind (columns: every kind any system has)."""
    kinds: list[str] = []
    for system in result["systems"].values():
        for cell in system.get("cells", []):
            kinds += [k for k in cell["cpu_ms_per_token"] if k not in kinds]
    head = "| system | streams | " + " | ".join(kinds) + " |"
    rows = [head, "|" + " --- |" * (len(kinds) + 2)]
    for name, system in result["systems"].items():
        for cell in system.get("cells", []):
            per = cell["cpu_ms_per_token"]
            rows.append(f"| {name} | {cell['streams']} | "
                        + " | ".join(_num(per.get(k), "{:.3f}") if k in per else "" for k in kinds) + " |")
    return "\n".join(rows)


def plot(result: dict, path: Path) -> Optional[Path]:
    """Delivered tokens/s (demand dashed) and frontend CPU per token against streams; None
    when matplotlib is missing (the tables and JSON still hold every figure)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, (rate_ax, cpu_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, system in result["systems"].items():
        cells = sorted(system.get("cells", []), key=lambda c: c["streams"])
        if not cells:
            continue
        xs = [c["streams"] for c in cells]
        line, = rate_ax.plot(xs, [c["delivered_tok_s"] or 0 for c in cells], marker="o", label=f"{name} delivered")
        if any(c["demanded_tok_s"] for c in cells):
            rate_ax.plot(xs, [c["demanded_tok_s"] for c in cells], linestyle="--", color=line.get_color(),
                         alpha=0.5, label=f"{name} demanded")
        what = "API server" if system.get("kind") == "vllm" else "all processes"
        cpu_ax.plot(xs, [headline_cpu(system, c) or 0 for c in cells], marker="o", color=line.get_color(),
                    label=f"{name} ({what})")
    streams = result["workload"]["streams"]
    for ax, title, unit in ((rate_ax, "tokens/s delivered", "tokens/s"), (cpu_ax, "CPU per streamed token", "ms")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(streams, [str(s) for s in streams])
        ax.minorticks_off()
        ax.set_xlabel("concurrent streams")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # a run whose systems all failed draws no line
            ax.legend(fontsize=8)
    machine = result.get("machine", {})
    fig.suptitle(f"control plane: {result['workload']['max_tokens']} tokens per answer, "
                 f"{machine.get('usable_cores', '?')} cores ({machine.get('cpu_model', '?')})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def report(result: dict) -> str:
    return "\n\n".join([
        f"Load generator: {result.get('client')}",
        figures_table(result),
        "CPU ms per streamed token by process kind (tandem: every process of the system; vLLM: the "
        "API server apart from its engine):",
        cpu_table(result)])
