"""`tandem plan`: simulated goodput of a cluster config under a workload, for tandem adaptive,
always-disaggregated and never-disaggregated (decode engines alone), and the same engines
colocated (each does both phases), over a range of offered loads and KV-link bandwidths; with
`--gpus 16xH200`, the P:D splits of that GPU budget instead, and a recommendation (plan_gpus.py).
The workload is the goodput benchmark's seeded mix or a trace file (`--workload`, workload_trace.py);
every run states the control-plane cores it needed, and each system's need (plan_control.py).

SIMULATED, every figure: the step time is AIConfigurator's GPU tables where they hold the GPU x
model x TP, else a roofline bound with stated efficiencies (plan_step.py), the KV link a swept
range, the control plane the CPU costs measured by the control-plane benchmark on its own cores.
The JSON and the plot carry that provenance, the tables' validation against measured vLLM rows
included (results/validation-gpu.json: TPOT within its bar on 70B, TTFT not): a GPU-scale result
here is a what-if, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from loadtest.bench.workload import Mix
from loadtest.sim import LABEL
from loadtest.sim.control_plane import from_benchmark
from loadtest.sim.network import LinkSpec
from loadtest.sim.pools import Hardware, KVCacheTooSmall, engine_params
from loadtest.sim.plan_control import ACTS_THROUGH, line, need
from loadtest.sim.plan_inputs import (GPU_BLOCK_SIZE, cluster_config, load, max_output, objectives, rates, step_choice, workload,
                                      describe as describe_workload)
from loadtest.sim.plan_sizing import drain_s
from loadtest.sim.plan_step import describe
from loadtest.sim.run import simulate_colocated, simulate_tandem
from loadtest.sim.step_time import MODELS

SYSTEMS = ("adaptive", "always", "never", "colocated")
DEFAULT_DURATION_S = 30.0  # seconds of offered load per run of the mix (a trace brings its own)


def run(args: argparse.Namespace) -> dict:
    if getattr(args, "gpus", None):
        from loadtest.sim.plan_gpus import run_sized

        return run_sized(args)
    search = [flag for flag, value in (("--search-steps", args.search_steps), ("--attainment", args.attainment),
                                       ("--seeds", args.seeds)) if value is not None]
    if search:
        raise SystemExit(f"{', '.join(search)}: the capacity search is --gpus's; without it the plan runs the --rates "
                         "loads as given: add --gpus COUNTxGPU, or drop " + ", ".join(search))
    pools = [flag for flag, value in (("--prefill-tp", args.prefill_tp), ("--decode-tp", args.decode_tp))
             if value is not None]
    if pools:
        raise SystemExit(f"{', '.join(pools)}: a pool's own TP is --gpus's (it sizes the budget's splits); without it "
                         "the config's pools run at --tp: add --gpus COUNTxGPU, or drop " + ", ".join(pools))
    wl = workload(args)
    duration = DEFAULT_DURATION_S if args.duration is None else args.duration
    xs = rates(args, wl, "1,2,4,8")
    if xs is None:
        raise SystemExit("--rates auto places the loads around a GPU budget's capacity: it needs --gpus")
    cfg = cluster_config(args)
    tier_name, tier = next(iter(cfg.tiers.items()))
    shape = MODELS[args.model]
    choice = step_choice(args, args.tp)
    step = choice.model
    mean, every = objectives(tier)
    engines = tier.prefill.replicas + tier.decode.replicas
    cost, vllm_cost = from_benchmark("tandem"), from_benchmark("vllm")
    # Both pools' engines, checked before any run (a KV cache under max_model_len is refused);
    # colocated engines are the decode pool's.
    sized = Hardware(step_model=lambda t, r: step, kv_bytes_per_token=shape.kv_bytes_per_token,
                     default_block_size=GPU_BLOCK_SIZE, link=LinkSpec(1.0, 0.0))
    params = {role: engine_params(pool, sized, cfg.model.max_model_len, f"tiers.{tier_name}.{role}")
              for role, pool in (("prefill", tier.prefill), ("decode", tier.decode))}
    rows = []
    for gbps in (float(x) for x in args.bandwidths_gbps.split(",")):
        hw = Hardware(step_model=lambda t, r: step, kv_bytes_per_token=shape.kv_bytes_per_token,
                      default_block_size=GPU_BLOCK_SIZE, link=LinkSpec(gbps * 1e9 / 8, args.transfer_fixed_ms / 1000))
        for x in xs:
            offered = load(wl, x, duration, args.seed)
            drain = drain_s(offered.duration_s, tier.slo.ttft_s, tier.slo.itl_s, max_output(wl))
            for system in SYSTEMS:
                if system == "colocated":
                    result = simulate_colocated(engines, params["decode"], step, vllm_cost, offered.schedule,
                                                drain_timeout_s=drain, control_cores=args.control_cores,
                                                shares_engine_cores=None)
                else:
                    variant = cfg.model_copy(update={"routing": cfg.routing.model_copy(update={"disaggregation": system})})
                    result = simulate_tandem(variant, hw, cost, offered.schedule, seed=args.seed, drain_timeout_s=drain,
                                             control_cores=args.control_cores, shares_engine_cores=None, tier=tier_name)
                s = result.summary(mean, every, offered.duration_s, engines)
                rows.append({"bandwidth_gbps": gbps, "rate_rps": offered.rate_rps, "replay_speed": offered.speed,
                             "system": system, "goodput_rps": s["goodput_rps"],
                             "goodput_rps_max_gap": s["goodput_rps_max_gap"], "ttft_p90_ms": s["ttft"].get("p90_ms"),
                             "mean_itl_p50_ms": s["mean_itl"].get("p50_ms"), "reasons": result.trace.reasons(),
                             "control_plane": result.control})
    return {"label": LABEL, "what": "tandem plan: simulated goodput per system, offered load and KV bandwidth",
            "provenance": {"step_time": choice.provenance(), "kv_link": {"bandwidths_gbps": args.bandwidths_gbps,
                                                                       "fixed_ms": args.transfer_fixed_ms},
                           "control_plane": {"tandem": cost.source, "colocated": vllm_cost.source,
                                             "cores": args.control_cores, "acts_through": ACTS_THROUGH},
                           "config": str(args.config), "tier": tier_name, "engines": engines,
                           "validated": {"cpu": "python -m loadtest.sim validate (results/validation.json)",
                                         "step_time": choice.validation["summary"] if choice.validation else
                                         "a roofline bound: not validated"}},
            "workload": {**describe_workload(wl), "rates_rps": sorted({r["rate_rps"] for r in rows}),
                         "duration_s": duration if isinstance(wl, Mix) else round(wl.span_s, 3), "seed": args.seed},
            "objectives": {"ttft_ms": mean.ttft_ms, "mean_itl_ms": mean.mean_itl_ms, "max_gap_ms": every.max_gap_ms},
            "control_plane_need": {system: need([r for r in rows if r["system"] == system], args.control_cores)
                                   for system in SYSTEMS},
            "rows": rows}


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bandwidths = sorted({r["bandwidth_gbps"] for r in result["rows"]})
    fig, axes = plt.subplots(1, len(bandwidths), figsize=(5 * len(bandwidths), 4.2), squeeze=False)
    for ax, bw in zip(axes[0], bandwidths):
        for system in SYSTEMS:
            rows = [r for r in result["rows"] if r["bandwidth_gbps"] == bw and r["system"] == system]
            ax.plot([r["rate_rps"] for r in rows], [r["goodput_rps"] for r in rows], marker="o", label=system)
        ax.set(title=f"KV link {bw:g} Gbit/s", xlabel="offered load (req/s)", ylabel="goodput (req/s)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{LABEL}: not measured. Step time: {describe(result['provenance']['step_time'])}",
                 fontsize=8, color="darkred", wrap=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(args: argparse.Namespace) -> int:
    started = time.monotonic()
    try:
        result = run(args)
    except KVCacheTooSmall as exc:  # a config vLLM would not start: one line, as the CLI's other input errors
        print(exc, file=sys.stderr)
        return 2
    # Not in the JSON: the same inputs and seed give the same bytes.
    wall_s = time.monotonic() - started
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "plan.json").write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    sized = "recommendation" in result
    if sized:
        from loadtest.sim.plan_report import plot_sized as draw, report
    else:
        draw = plot
    try:
        draw(result, args.out / "plan.png")
    except ImportError:
        print("plan.png not drawn: matplotlib is missing (pip install -e '.[loadtest]')")
    if sized:
        report(result)
    else:
        print(f"step time: {describe(result['provenance']['step_time'])}")
        print(f"{LABEL} goodput (req/s, TTFT + mean ITL), tier {result['provenance']['tier']}; control-plane cores "
              f"(busiest second / mean; {ACTS_THROUGH.split(':')[0]}):")
        for r in result["rows"]:
            cp = r["control_plane"]
            print(f"  link {r['bandwidth_gbps']:>6g} Gbit/s  load {r['rate_rps']:>7g}  {r['system']:<10} "
                  f"{r['goodput_rps']:.3f}   control plane {cp['peak_cores_1s']:.2f} / {cp['mean_cores']:.2f} cores"
                  + (f" (past --control-cores {cp['cores']:g})" if cp["saturated"] else ""))
        cp = result["provenance"]["control_plane"]
        print(f"{LABEL} control-plane cores needed, per system over the runs (CPU per token: tandem {cp['tandem']}; "
              f"colocated {cp['colocated']}):")
        for system, n in result["control_plane_need"].items():
            print(f"  {system:<10} {line(n)}")
    print(f"simulated in {wall_s:.1f} s")
    print(f"written {args.out / 'plan.json'} and {args.out / 'plan.png'} (marked {LABEL}, with provenance)")
    return 0
