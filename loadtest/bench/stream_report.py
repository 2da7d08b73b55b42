"""The pure half of the stream benchmark (loadtest/bench/stream.py): a system's summary per
cell over what the client saw of each stream (loadtest/measure/record.py), the issue-14
targets met or missed, the tables and the plot. No Ray, no vLLM, no network: unit-tested
alone and used by --replot."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from loadtest.measure.percentiles import latency_summary
from loadtest.measure.record import RequestRecord

SYSTEMS = ("tandem", "direct")


@dataclass
class SystemCell:
    """What one system did in one cell, accumulated over its batches."""

    records: list[RequestRecord] = field(default_factory=list)
    models_ms: list[float] = field(default_factory=list)  # GET /v1/models while its streams ran
    models_errors: int = 0
    busy_s: float = 0.0  # wall time of its batches
    cpu_s: dict = field(default_factory=dict)  # "kind [role]" -> CPU seconds in its batches
    cpu_kind_s: dict = field(default_factory=dict)  # kind -> CPU seconds in its batches
    client_cpu_s: float = 0.0
    idle_cpu_s: float = 0.0  # its processes' CPU while the other system's batches ran
    idle_s: float = 0.0
    foreign_cpu_s: float = 0.0  # CPU of processes of neither system nor the client, in its batches
    steal_s: float = 0.0

    def add_cpu(self, by_process: dict, by_kind: dict) -> None:
        for key, seconds in by_process.items():
            self.cpu_s[key] = self.cpu_s.get(key, 0.0) + seconds
        for key, seconds in by_kind.items():
            self.cpu_kind_s[key] = self.cpu_kind_s.get(key, 0.0) + seconds


def summarize(cell: SystemCell, expected_tokens: int) -> dict:
    ok = [r for r in cell.records if r.ok]
    tokens = sum(r.tokens for r in ok)
    gaps = [g for r in ok for g in r.token_gaps_ms]
    ttft = [r.ttft_ms for r in ok]
    per_token = (lambda s: round(s / tokens, 5)) if tokens else (lambda s: None)
    prompt = [r.prompt_tokens for r in ok if r.prompt_tokens]
    return {
        "streams": len(cell.records), "errors": len(cell.records) - len(ok),
        "error_kinds": sorted({r.error for r in cell.records if r.error})[:5],
        "tokens": tokens,
        "token_count_mismatches": sum(r.tokens != expected_tokens for r in ok),
        "prompt_tokens_mean": round(sum(prompt) / len(prompt), 1) if prompt else None,
        "ttft": latency_summary(ttft),
        "token_gap": latency_summary(gaps),
        "itl": latency_summary([r.mean_itl_ms for r in ok if r.mean_itl_ms is not None], digits=2),
        "models_latency": latency_summary(cell.models_ms),
        "models_errors": cell.models_errors,
        "busy_s": round(cell.busy_s, 2),
        "cpu_s_per_token": {"total": per_token(sum(cell.cpu_kind_s.values())),
                            **{k: per_token(v) for k, v in sorted(cell.cpu_kind_s.items(), key=lambda kv: -kv[1])}},
        "cpu_s_per_token_by_process": {k: per_token(v) for k, v in sorted(cell.cpu_s.items(), key=lambda kv: -kv[1])},
        "cpu_cores_busy": round(sum(cell.cpu_kind_s.values()) / cell.busy_s, 3) if cell.busy_s else None,
        "client_cpu_s_per_token": per_token(cell.client_cpu_s),
        "idle_cpu_cores_while_other_runs": round(cell.idle_cpu_s / cell.idle_s, 3) if cell.idle_s else None,
        "foreign_cpu_cores": round(cell.foreign_cpu_s / cell.busy_s, 3) if cell.busy_s else None,
        "steal_cores": round(cell.steal_s / cell.busy_s, 3) if cell.busy_s else None,
        "ttft_ms": [round(v, 1) for v in ttft],
        "gaps_ms": [round(v, 1) for v in gaps],
    }


def _get(result: dict, cell: str, system: str, metric: str, stat: str) -> Optional[float]:
    return result["cells"].get(cell, {}).get(system, {}).get(metric, {}).get(stat)


def targets(result: dict) -> list[dict]:
    """Issue 14's targets, each row: what, cell, tandem, direct, the limit it implies, met."""
    rows = []

    def row(what: str, cell: str, tandem: Optional[float], direct: Optional[float], limit: Optional[float]):
        met = None if tandem is None or limit is None else tandem <= limit
        rows.append({"target": what, "cell": cell, "tandem": tandem, "direct": direct,
                     "limit": None if limit is None else round(limit, 1), "met": met})

    for cell, info in result["cells"].items():
        t = lambda m, s: _get(result, cell, "tandem", m, s)  # noqa: E731
        d = lambda m, s: _get(result, cell, "direct", m, s)  # noqa: E731
        dp99, dmax, ditl = d("token_gap", "p99_ms"), d("token_gap", "max_ms"), d("itl", "p50_ms")
        row("token gap p99 <= direct p99 + 25 ms", cell, t("token_gap", "p99_ms"), dp99,
            None if dp99 is None else dp99 + 25)
        row("token gap max <= 2x direct max", cell, t("token_gap", "max_ms"), dmax, None if dmax is None else 2 * dmax)
        row("ITL p50 <= direct + 5%", cell, t("itl", "p50_ms"), ditl, None if ditl is None else 1.05 * ditl)
        if info["concurrency"] >= 4:
            row("GET /v1/models p99 <= 50 ms while 4 streams run", cell, t("models_latency", "p99_ms"),
                d("models_latency", "p99_ms"), 50.0)
        if info["concurrency"] == 1:
            dttft = d("ttft", "p50_ms")
            if info["prompt"] == "short":
                row("TTFT p50 short <= direct + 30 ms", cell, t("ttft", "p50_ms"), dttft,
                    None if dttft is None else dttft + 30)
            elif info["prompt"] == "long":
                row("TTFT p50 long <= direct + 3%", cell, t("ttft", "p50_ms"), dttft,
                    None if dttft is None else 1.03 * dttft)
    ready = result.get("readiness", {})
    row("ready (its 'ready' line) <= 60 s", "start", ready.get("tandem", {}).get("ready_line_s"),
        ready.get("direct", {}).get("spawn_to_ready_s"), 60.0)
    return rows


def _fmt(v) -> str:
    if v is None:
        return "-"
    return f"{v:.4f}" if isinstance(v, float) and abs(v) < 0.1 and v != 0 else (f"{v:g}" if isinstance(v, float) else str(v))


def figures_table(result: dict) -> str:
    lines = ["| cell | system | prompt tok | TTFT p50 / p90 (ms) | token gap p50 / p99 / max (ms) | ITL p50 (ms) "
             "| /v1/models p50 / p99 / max (ms) | CPU s/token | CPU cores busy | idle system's cores | others' cores |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for cell, info in result["cells"].items():
        for system in SYSTEMS:
            s = info.get(system)
            if not s:
                continue
            g, m, tt = s["token_gap"], s["models_latency"], s["ttft"]
            lines.append(f"| {cell} | {system} | {_fmt(s['prompt_tokens_mean'])} | {_fmt(tt.get('p50_ms'))} / "
                         f"{_fmt(tt.get('p90_ms'))} | {_fmt(g.get('p50_ms'))} / {_fmt(g.get('p99_ms'))} / "
                         f"{_fmt(g.get('max_ms'))} | {_fmt(s['itl'].get('p50_ms'))} | {_fmt(m.get('p50_ms'))} / "
                         f"{_fmt(m.get('p99_ms'))} / {_fmt(m.get('max_ms'))} | {_fmt(s['cpu_s_per_token']['total'])} "
                         f"| {_fmt(s['cpu_cores_busy'])} | {_fmt(s['idle_cpu_cores_while_other_runs'])} "
                         f"| {_fmt(s.get('foreign_cpu_cores'))} |")
    return "\n".join(lines)


def cpu_table(result: dict) -> str:
    """CPU seconds per streamed token by process kind, one column per cell and system."""
    cols = [(cell, system) for cell in result["cells"] for system in SYSTEMS if system in result["cells"][cell]]
    kinds: list[str] = []
    for cell, system in cols:
        for kind in result["cells"][cell][system]["cpu_s_per_token"]:
            if kind not in kinds:
                kinds.append(kind)
    lines = ["| process kind | " + " | ".join(f"{c} {s}" for c, s in cols) + " |",
             "| --- |" + " --- |" * len(cols)]
    for kind in kinds:
        vals = [result["cells"][c][s]["cpu_s_per_token"].get(kind) for c, s in cols]
        lines.append(f"| {kind} | " + " | ".join(_fmt(v) for v in vals) + " |")
    return "\n".join(lines)


def targets_table(rows: list[dict]) -> str:
    lines = ["| target | cell | tandem | direct | limit | met |", "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        met = "-" if r["met"] is None else ("met" if r["met"] else "**missed**")
        lines.append(f"| {r['target']} | {r['cell']} | {_fmt(r['tandem'])} | {_fmt(r['direct'])} | "
                     f"{_fmt(r['limit'])} | {met} |")
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    """Token-gap CDFs tandem vs direct per cell (top); TTFT, /v1/models latency and CPU per
    token by kind per cell (bottom)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = list(result["cells"])
    colors = {"tandem": "tab:red", "direct": "tab:blue"}
    fig, axes = plt.subplots(2, max(3, len(cells)), figsize=(4.2 * max(3, len(cells)), 8.4))
    for ax, cell in zip(axes[0], cells):
        for system in SYSTEMS:
            gaps = sorted(result["cells"][cell].get(system, {}).get("gaps_ms", []))
            if gaps:
                ax.step(gaps, [(i + 1) / len(gaps) for i in range(len(gaps))], where="post",
                        color=colors[system], label=system)
        ax.set_xscale("symlog", linthresh=1)
        ax.set_title(f"token gap CDF, {cell}")
        ax.set_xlabel("gap between successive tokens (ms)")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
    for ax in axes[0][len(cells):]:
        ax.axis("off")
    x = range(len(cells))
    width = 0.38
    ax_ttft, ax_models, ax_cpu = axes[1][0], axes[1][1], axes[1][2]
    kinds = sorted({k for c in cells for s in SYSTEMS for k in result["cells"][c].get(s, {}).get("cpu_s_per_token", {})
                    if k != "total"})
    palette = [plt.cm.tab20(i) for i in (*range(0, 20, 2), *range(1, 20, 2))]  # neighbours differ
    kind_color = {k: palette[n % 20] for n, k in enumerate(kinds)}
    labelled: set[str] = set()
    for i, system in enumerate(SYSTEMS):
        pos = [j + (i - 0.5) * width for j in x]
        for ax, metric in ((ax_ttft, "ttft"), (ax_models, "models_latency")):
            p50 = [result["cells"][c].get(system, {}).get(metric, {}).get("p50_ms") or 0 for c in cells]
            top = [result["cells"][c].get(system, {}).get(metric, {}).get("p90_ms" if metric == "ttft" else "p99_ms")
                   or 0 for c in cells]
            ax.bar(pos, p50, width, color=colors[system], label=f"{system} p50")
            ax.errorbar(pos, top, fmt="_", color="black", markersize=14, label=None if i else
                        ("p90" if metric == "ttft" else "p99"))
        bottom = [0.0] * len(cells)
        for kind in kinds:
            vals = [(result["cells"][c].get(system, {}).get("cpu_s_per_token", {}).get(kind) or 0) * 1000 for c in cells]
            ax_cpu.bar(pos, vals, width, bottom=bottom, color=kind_color[kind], edgecolor=colors[system],
                       label=None if kind in labelled else kind)
            labelled.add(kind)
            bottom = [b + v for b, v in zip(bottom, vals)]
    for ax, title, ylabel in ((ax_ttft, "TTFT (bar p50, tick p90)", "ms"),
                              (ax_models, "GET /v1/models while streaming (bar p50, tick p99)", "ms"),
                              (ax_cpu, "CPU per streamed token (left tandem, right direct)", "CPU ms / token")):
        ax.set_xticks(list(x), cells)
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(ylabel)
        ax.grid(axis="y", alpha=0.3)
    ax_models.set_yscale("log")
    ax_ttft.legend(fontsize=8)
    ax_models.legend(fontsize=8)
    for ax in axes[1][3:]:
        ax.axis("off")
    if len(axes[1]) > 3:  # the kinds' legend beside the CPU bars, not over them
        axes[1][3].legend(*ax_cpu.get_legend_handles_labels(), loc="center left", fontsize=8,
                          title="process kind (edge: system)")
    else:
        ax_cpu.legend(fontsize=7, ncol=2)
    m = result.get("machine", {})
    ready = result.get("readiness", {}).get("tandem", {}).get("ready_line_s")
    fig.suptitle(f"tandem vs direct vLLM, {result.get('model')} {result.get('dtype')}, {m.get('cpu_model')} "
                 f"({m.get('cores')} cores); tandem ready in {ready} s", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
