"""The control-plane cores a planned deployment needs, from each run's counted CPU
(control_plane.py `ControlPlane.summary`: CPU per streamed token and per request, measured by
the control-plane benchmark, plus a baseline of busy cores), per candidate and for the
recommendation, against `--control-cores`. SIMULATED counts; pure (no simulation here).

On GPU engines the control plane has cores of its own and the model slows nothing when it
needs more than it has: past `--control-cores` is where a real gateway would saturate and
its latency would grow, which the goodput beside it does not show.
"""

from __future__ import annotations

from typing import Optional, Sequence

from loadtest.sim.plan_search import capacity

ACTS_THROUGH = ("counted, not a limit: on GPU engines the control plane has cores of its own and the simulation "
                "slows nothing when it needs more than --control-cores; past them a real gateway would saturate, "
                "which the goodput does not show")


def need(rows: Sequence[dict], cores: float, at: Optional[dict] = None) -> dict:
    """Over `rows` (one candidate's or system's runs, each with its `control_plane` summary):
    the busiest second and the mean of the run that needed most, the lowest offered load where
    the need passed `cores`, and, where `at` (one of the rows) is given, the need at that run."""
    if not rows:
        raise ValueError("no runs to read the control plane from")
    top = max(rows, key=lambda r: r["control_plane"]["peak_cores_1s"])
    past = sorted(r["rate_rps"] for r in rows if r["control_plane"]["peak_cores_1s"] > cores)
    cost = top["control_plane"]["cost"]
    out = {"cores": cores, "peak_cores_1s": top["control_plane"]["peak_cores_1s"],
           "mean_cores": top["control_plane"]["mean_cores"], "at_rate_rps": top["rate_rps"],
           "at_bandwidth_gbps": top.get("bandwidth_gbps"),
           "exceeds_cores": bool(past), "exceeds_from_rate_rps": past[0] if past else None,
           "per_token_cpu_ms": round(cost["per_token_cpu_s"] * 1000, 4), "baseline_cores": cost["baseline_cores"],
           "source": cost["source"]}
    if at is not None:
        cp = at["control_plane"]
        out["at_best"] = {"rate_rps": at["rate_rps"], "bandwidth_gbps": at.get("bandwidth_gbps"),
                          "peak_cores_1s": cp["peak_cores_1s"], "mean_cores": cp["mean_cores"],
                          "exceeds_cores": cp["peak_cores_1s"] > cores, "meets_slo": at.get("meets")}
    return out


def best_run(rows: Sequence[dict]) -> dict:
    """The run a candidate's score came from (plan_sizing.score): the run at its capacity at the
    KV link where that capacity is least (ties: the first swept); where no load met the SLO
    there, its lowest load's run."""
    by_bw: dict[float, list[dict]] = {}
    for r in rows:
        by_bw.setdefault(r["bandwidth_gbps"], []).append(r)
    runs = min(by_bw.values(), key=lambda rs: capacity(rs).rate_rps)  # min keeps the first of equals
    return capacity(runs).run or min(runs, key=lambda r: r["rate_rps"])


def _at(rate: float, bw: Optional[float]) -> str:
    return f"{rate:g} req/s" + ("" if bw is None else f", {bw:g} Gbit/s")


def line(n: dict) -> str:
    """One console line of a `need`."""
    most = f"peak {n['peak_cores_1s']:.2f} / mean {n['mean_cores']:.2f} cores at {_at(n['at_rate_rps'], n['at_bandwidth_gbps'])}"
    text = most
    if "at_best" in n:
        b = n["at_best"]
        where = "its lowest load, which missed the SLO" if b.get("meets_slo") is False else "its capacity load"
        text = (f"peak {b['peak_cores_1s']:.2f} / mean {b['mean_cores']:.2f} cores at {where} "
                f"({_at(b['rate_rps'], b['bandwidth_gbps'])})")
        if n["peak_cores_1s"] > b["peak_cores_1s"]:
            text += f"; the most of its runs, {most}"
    if n["exceeds_cores"]:
        return text + f"; past --control-cores {n['cores']:g} from {n['exceeds_from_rate_rps']:g} req/s"
    return text + f"; within --control-cores {n['cores']:g}"
