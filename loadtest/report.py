"""The report after a run, in one folder:

    requests.csv   one row per request (start, workload, tier, ok, tokens, TTFT, E2E, ITL mean, tok/s, error)
    summary.csv    per metric (and per workload): count, mean, p50, p90, p95, p99
    slo.csv        every bound, observed value, PASS/FAIL
    latency.png    TTFT and ITL over time, with their p50/p95/p99 and the SLO bounds
    index.html     all of the above on one page
"""

from __future__ import annotations

import csv
import html
from pathlib import Path
from typing import Sequence

from loadtest.measure.percentiles import REPORT_PERCENTILES, summarize
from loadtest.measure.record import METRICS, Samples
from loadtest.measure.slo import SLO, Verdict, passed

_LABELS = {"ttft_ms": "TTFT (ms)", "itl_ms": "ITL (ms)", "e2e_ms": "E2E (ms)", "tokens_per_s": "tokens/s per stream"}


def write_requests_csv(path: Path, samples: Samples) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["start_s", "workload", "tier", "ok", "prompt_tokens", "output_tokens", "ttft_ms",
                    "e2e_ms", "itl_mean_ms", "tokens_per_s", "error"])
        for r in samples.records:
            itl = sum(r.itl_ms) / len(r.itl_ms) if r.itl_ms else None
            w.writerow([f"{r.start_s:.3f}", r.workload, r.tier, int(r.ok), r.prompt_tokens, r.output_tokens,
                        _fmt(r.ttft_ms), _fmt(r.e2e_ms), _fmt(itl), _fmt(r.tokens_per_s), r.error])


def summary_rows(samples: Samples) -> list[list[str]]:
    rows = []
    for workload in [None, *samples.workloads()]:
        for metric in METRICS:
            s = summarize(samples.values(metric, workload))
            p = s.percentiles
            rows.append([workload or "all", metric, str(s.count), _fmt(s.mean),
                         *(_fmt(p.get(q)) for q in REPORT_PERCENTILES)])
    return rows


SUMMARY_HEADER = ["workload", "metric", "count", "mean", "p50", "p90", "p95", "p99"]


def write_plot(path: Path, samples: Samples, slo: SLO) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display; safe inside Locust's process
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    series = {
        "ttft_ms": [(r.start_s + r.ttft_ms / 1000.0, r.ttft_ms) for r in samples.records if r.ok and r.ttft_ms is not None],
        "itl_ms": [],
    }
    for r in samples.records:
        if r.ok and r.ttft_ms is not None and r.itl_ms:
            t = r.start_s + r.ttft_ms / 1000.0
            for gap in r.itl_ms:
                t += gap / 1000.0
                series["itl_ms"].append((t, gap))
    for ax, metric in zip(axes, ("ttft_ms", "itl_ms")):
        pts = series[metric]
        if pts:
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=4 if metric == "itl_ms" else 10, alpha=0.5,
                       label=metric.split("_")[0].upper())
            s = summarize([p[1] for p in pts], (50.0, 95.0, 99.0))
            for q, style in zip((50.0, 95.0, 99.0), (":", "--", "-.")):
                ax.axhline(s.percentiles[q], color="tab:gray", linestyle=style, label=f"p{q:g} {s.percentiles[q]:.0f} ms")
        top = max((p[1] for p in pts), default=1.0) * 1.5
        for key, bound in getattr(slo, metric).items():
            # A bound far above the data would flatten it: keep it in the legend only.
            off = bound > top * 3
            ax.axhline(bound, color="tab:red", linewidth=1, label=f"SLO {key} <= {bound:g} ms" + (" (off scale)" if off else ""))
        ax.set_ylabel(_LABELS[metric])
        ceiling = max([top] + [b * 1.2 for b in getattr(slo, metric).values() if b <= top * 3])
        if metric == "itl_ms":  # gaps span orders of magnitude (bursts arrive ~0 ms apart)
            ax.set_yscale("log")
            ax.set_ylim(0.1, ceiling)
        else:
            ax.set_ylim(0, ceiling)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper right", fontsize=8)
    axes[-1].set_xlabel("seconds since start")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_report(folder: Path, title: str, samples: Samples, slo: SLO, verdicts: Sequence[Verdict],
                 notes: Sequence[str] = ()) -> Path:
    """Write every file of the report; returns the HTML page."""
    folder.mkdir(parents=True, exist_ok=True)
    write_requests_csv(folder / "requests.csv", samples)
    rows = summary_rows(samples)
    _write_csv(folder / "summary.csv", SUMMARY_HEADER, rows)
    _write_csv(folder / "slo.csv", ["bound", "observed", "result"],
               [[v.bound, _fmt(v.observed), "PASS" if v.ok else "FAIL"] for v in verdicts])
    write_plot(folder / "latency.png", samples, slo)
    ok = passed(verdicts)
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}} .FAIL{{color:#b00;font-weight:bold}} .PASS{{color:#070}}</style>
</head><body><h1>{html.escape(title)}: <span class="{'PASS' if ok else 'FAIL'}">SLO {'PASSED' if ok else 'FAILED'}</span></h1>
<p>{samples.requests} requests, {samples.errors} failed. {''.join(html.escape(n) + '<br>' for n in notes)}</p>
<h2>SLO</h2>{_table(["bound", "observed", "result"], [[v.bound, _fmt(v.observed), "PASS" if v.ok else "FAIL"] for v in verdicts])}
<h2>Latency over time</h2><img src="latency.png" alt="TTFT and ITL over time">
<h2>Percentiles</h2>{_table(SUMMARY_HEADER, rows)}
<p>Files: <a href="requests.csv">requests.csv</a> <a href="summary.csv">summary.csv</a> <a href="slo.csv">slo.csv</a></p>
</body></html>"""
    (folder / "index.html").write_text(page)
    return folder / "index.html"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f'<td class="{html.escape(c)}">{html.escape(c)}</td>' for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _write_csv(path: Path, header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)


def _fmt(v: float | None) -> str:
    return "" if v is None else f"{v:.3f}"
