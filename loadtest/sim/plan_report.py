"""`tandem plan --gpus`'s console report and picture (plan_gpus.py computes the result): the
recommendation, each candidate's capacity per KV link, the control-plane cores, the TPs and
each kind of engine's step time. SIMULATED, every figure, and said so."""

from __future__ import annotations

from loadtest.sim import LABEL
from loadtest.sim.plan_control import ACTS_THROUGH, line
from loadtest.sim.plan_search import capacity
from loadtest.sim.plan_step import describe


def tp_text(b: dict) -> str:
    """The budget's TPs in words: one where they agree, else each role's."""
    tp = b["tp"]
    if len(set(tp.values())) == 1:
        return f"TP{tp['colocated']}"
    return f"colocated TP{tp['colocated']}, prefill TP{tp['prefill']}, decode TP{tp['decode']}"


def step_lines(prov: dict) -> list[str]:
    """The step time of each kind of engine, one line per TP (`provenance.step_time` of a --gpus plan)."""
    by_text: dict[str, list[str]] = {}
    for role in sorted(prov, key=("colocated", "prefill", "decode").index):
        by_text.setdefault(describe(prov[role]), []).append(role)
    if len(by_text) == 1:
        return [next(iter(by_text))]
    return [f"{', '.join(roles)} engines: {text}" for text, roles in by_text.items()]


def report(result: dict) -> None:
    rec, b = result["recommendation"], result["budget"]
    for text in step_lines(result["provenance"]["step_time"]):
        print(f"step time: {text}")
    idle = {c: n for c, n in b["idle_gpus"].items() if n}
    print(f"{LABEL} plan for {b['gpus']}x{b['gpu']}, {tp_text(b)}: {b['colocated_engines']} colocated engines and "
          f"{len(b['swept']) - 1} P:D split{'' if len(b['swept']) == 2 else 's'}"
          + (f" (GPUs idle: {', '.join(f'{c} {n}' for c, n in idle.items())})" if idle else "")
          + f"; capacity search from the ladder {', '.join(f'{x:g}' for x in result['search']['ladder'])} "
          + result["search"]["ladder_unit"]
          + (f" {result['workload']['trace']['path']}" if "trace" in result["workload"] else ""))
    print(f"recommended: {rec['reason']}")
    sr = result["search"]
    seeds = sr["seeds"]
    pooled = f" of its {seeds} seeds' requests pooled" if seeds > 1 else " of requests"
    print(f"capacity, req/s: the highest offered load with >= {sr['attainment']:.0%}{pooled} within the SLO, "
          f"within {sr['resolution']:g} ({sr['ladder_unit']}) unless marked '>=' (met at the top of the ladder)"
          + ("; [each seed's own, lowest-highest]" if seeds > 1 else "") + "; per KV link Gbit/s:")
    for c in rec["ranking"]:
        cells = sorted(sr["capacity_rps"][c].items(), key=lambda kv: float(kv[0]))
        print(f"  {c:<22} " + "  ".join(f"{bw:>5}: {'>=' if cap['failed_at_rps'] is None else '  '}"
                                        f"{cap['capacity_rps']:7.2f}" + _seed_range(cap) for bw, cap in cells))
    print(f"{sr['runs']} runs (at most {sr['max_runs_per_candidate_and_link']} per candidate and link: "
          f"({len(sr['ladder'])} ladder loads + {sr['bisection_steps']} bisections) x {seeds} seed{'s' * (seeds > 1)})")
    cp = result["provenance"]["control_plane"]
    print(f"control-plane cores ({ACTS_THROUGH.split(':')[0]}; CPU per token: tandem {cp['tandem']}; "
          f"colocated {cp['colocated']}):")
    for c in rec["ranking"]:
        print(f"  {c:<22} {line(result['control_plane_need'][c])}")
    print(f"the recommended {rec['candidate']} needs {line(rec['control_plane'])}")


def _seed_range(cap: dict) -> str:
    if "by_seed" not in cap:
        return ""
    return f" [{min(cap['by_seed']):.2f}-{max(cap['by_seed']):.2f}]"


def plot_sized(result: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rec = result["recommendation"]
    bandwidths = sorted({r["bandwidth_gbps"] for r in result["rows"]})
    fig, axes = plt.subplots(1, len(bandwidths), figsize=(5.5 * len(bandwidths), 4.6), squeeze=False)
    for ax, bw in zip(axes[0], bandwidths):
        for c in rec["ranking"]:
            rows = sorted((r for r in result["rows"] if r["bandwidth_gbps"] == bw and r["candidate"] == c),
                          key=lambda r: r["rate_rps"])
            style = dict(linewidth=3, color="black") if c == rec["candidate"] else dict(linewidth=1, alpha=0.8)
            drawn = ax.plot([r["rate_rps"] for r in rows], [r["goodput_rps"] for r in rows], marker="o",
                            label=c + (" (recommended)" if c == rec["candidate"] else ""), **style)
            if rows and "by_seed" in rows[0]:  # the seeds' lowest to highest goodput at each load
                ax.fill_between([r["rate_rps"] for r in rows], [min(b["goodput_rps"] for b in r["by_seed"]) for r in rows],
                                [max(b["goodput_rps"] for b in r["by_seed"]) for r in rows], alpha=0.15,
                                color=drawn[0].get_color(), linewidth=0)
            at = capacity(rows).run
            if at is not None:  # the capacity: the search's last load that met the SLO
                ax.plot([at["rate_rps"]], [at["goodput_rps"]], marker="*", markersize=14, color=drawn[0].get_color())
        seeds = result["search"]["seeds"]
        ax.set(title=f"KV link {bw:g} Gbit/s (*: capacity" + (f"; band: {seeds} seeds' range)" if seeds > 1 else ")"),
               xlabel="offered load (req/s)",
               ylabel="goodput under the SLO (req/s)" + (f", {seeds} seeds pooled" if seeds > 1 else ""))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    b = result["budget"]
    fig.suptitle(f"{LABEL}: not measured. {b['gpus']}x{b['gpu']}, {tp_text(b)}: recommended {rec['candidate']}\n"
                 + "\n".join(f"step time: {t}" for t in step_lines(result["provenance"]["step_time"])),
                 fontsize=8, color="darkred", wrap=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
