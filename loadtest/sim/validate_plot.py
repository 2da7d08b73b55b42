"""The CPU validation's picture: each replayed cell's simulated goodput against the measured one,
with issue 32's band (within max(0.15 req/s, 20%)), by the machine class the run was recorded on
and the system. Labelled SIMULATED; the JSON beside it holds every figure."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from loadtest.bench.figures import pyplot, save
from loadtest.sim import LABEL

MARKERS = {"colocated": "o", "tandem-adaptive": "^", "tandem-always": "s"}  # other tandem variants: "D"


def plot(out: dict, path: Path) -> Optional[Path]:
    plt = pyplot()
    if plt is None:
        return None
    runs = out["runs"]
    top = max([c[side]["goodput_rps"] for r in runs for c in r["cells"] for side in ("measured", "simulated")] + [0.5])
    fig, ax = plt.subplots(figsize=(7.5, 6.5))
    xs = [i * top * 1.05 / 100 for i in range(101)]
    ax.fill_between(xs, [x - max(0.15, 0.2 * x) for x in xs], [x + max(0.15, 0.2 * x) for x in xs],
                    color="0.9", label="within max(0.15 req/s, 20%)")
    ax.plot(xs, xs, color="0.6", lw=0.8)
    colours = {}
    for r in runs:
        colour = colours.setdefault(r["machine"], f"C{len(colours)}")
        for c in r["cells"]:
            family = "colocated" if c["system"].startswith("colocated") else c["system"]
            ax.scatter(c["measured"]["goodput_rps"], c["simulated"]["goodput_rps"], s=28, color=colour,
                       marker=MARKERS.get(family, "D"), edgecolors="black" if not c["within"] else "none",
                       linewidths=0.8, alpha=0.8)
    by_machine = out["score"]["within_by_machine"]
    for machine, colour in colours.items():
        ax.scatter([], [], color=colour, marker="o", label=f"{machine} host: {by_machine[machine]} within")
    for family, marker in MARKERS.items():
        ax.scatter([], [], color="0.4", marker=marker, label=family)
    ax.scatter([], [], color="0.4", marker="D", label="other tandem variants")
    ax.scatter([], [], color="white", marker="o", edgecolors="black", label="outlined: outside the band")
    s = out["score"]
    own = s.get("own_engines")
    speed = ("engine speed: the run's own engines' unloaded steps where recorded, else its calibration"
             if out.get("prefill_speed") == "own-engines" else "engine speed: each run's calibration engine")
    ax.set_title(f"{LABEL}: CPU replay of recorded goodput runs\n({speed})\n{s['within']}/{s['cells']} cells within"
                 + (f"; the {own['runs']} runs at their own engines' speed: {own['within']}/{own['cells']}" if own else "")
                 + " (issue 32's bar: 80%)", fontsize=8)
    ax.set_xlabel("measured goodput, req/s (TTFT + mean ITL)")
    ax.set_ylabel("simulated goodput, req/s")
    ax.set_xlim(0, top * 1.05)
    ax.set_ylim(0, top * 1.05)
    ax.legend(fontsize=7, loc="upper left")
    return save(fig, path)
