"""The goodput benchmark's plot: goodput under each objective and TTFT p90, per offered load,
one line per system that ran (loadtest/bench/goodput.py writes the JSON it reads)."""

from __future__ import annotations

from pathlib import Path


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ran = {name: s for name, s in result["systems"].items() if s.get("rates")}
    fig, (ax, ax1, ax2) = plt.subplots(1, 3, figsize=(16, 4.8))
    for name, system in ran.items():
        # The realized load of each trace (arrivals / window): a short Poisson trace strays
        # from its nominal rate, and every system served the same trace.
        rates = [r["offered_rps"] for r in system["rates"]]
        style = {"linewidth": 2.4} if name.startswith("tandem") else {"linestyle": "--"}
        ax.plot(rates, [r["goodput_rps"] for r in system["rates"]], marker="o", label=name, **style)
        ax1.plot(rates, [r["goodput_rps_max_gap"] for r in system["rates"]], marker="o", label=name, **style)
        ax2.plot(rates, [r["ttft"].get("p90_ms") for r in system["rates"]], marker="o", label=name, **style)
    top = max((r["offered_rps"] for s in ran.values() for r in s["rates"]), default=1.0)
    obj = result["calibration"]["objectives"]
    for a in (ax, ax1):
        a.plot([0, top], [0, top], color="grey", linestyle=":", label="every request meets it")
        a.set(xlabel="offered load, arrivals / window (requests/s)", ylabel="goodput (requests/s meeting it)")
    ax.set_title(f"TTFT <= {obj['ttft_ms']:.0f} ms, mean ITL <= {obj['mean_itl_ms']:.0f} ms", fontsize=10)
    ax1.set_title(f"TTFT <= {obj['ttft_ms']:.0f} ms, every token gap <= {obj['max_gap_ms']:.0f} ms", fontsize=10)
    ax2.set(xlabel="offered load, arrivals / window (requests/s)", ylabel="TTFT p90 (ms)", yscale="log")
    ax2.set_title("TTFT p90 (completed requests)", fontsize=10)
    for a in (ax, ax1, ax2):
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    cal = result["calibration"]
    fig.suptitle(f"{result['model']} on {result['machine']['cpus']} CPU cores, mix {result['workload']['mix']} "
                 f"({result['workload']['prefill_share']:.0%} prefill-heavy); objectives = multiples of one "
                 f"engine unloaded (TTFT {cal['unloaded_ttft_ms']:.0f} ms, step {cal['unloaded_step_ms']:.0f} ms)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
