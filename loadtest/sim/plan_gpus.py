"""`tandem plan --gpus 16xH200`: every way to spend a GPU budget (plan_sizing.py), each simulated
with tandem's real policies (run.py: router, decider, admission, autoscaler) or as colocated
vLLM engines, at the KV-link bandwidths; each candidate's capacity under the tier's SLO found by
a bounded search over offered loads (plan_search.py), the highest recommended, with its reason
and the runners-up. SIMULATED, every figure.

The config supplies the tier's SLO, admission, routing and engine arguments; the split supplies
the replica counts (num_gpus = TP). Its KV cache: the config's kv_cache_memory_bytes where written,
else (null or left out) what the GPUs leave after the weights (validate_gpu.py `kv_blocks`, vLLM's
gpu_memory_utilization and an assumed reserve), so one config plans any budget. A pool's
autoscaling bounds are pinned to the split's count: the budget leaves no GPU to scale onto,
and the real policy still ticks in the loop (its decisions are traced, clamped).
"""

from __future__ import annotations

import argparse
from typing import Optional

from cluster.config import ClusterConfig
from cluster.config.pools import PoolConfig
from loadtest.bench.workload import Mix
from loadtest.sim import LABEL
from loadtest.sim.control_plane import from_benchmark
from loadtest.sim.engine import EngineParams
from loadtest.sim.network import LinkSpec
from loadtest.sim.plan_cli import ATTAINMENT, MIX_MAX_REQUESTS, SEARCH_STEPS
from loadtest.sim.plan_control import ACTS_THROUGH, best_run, line, need
from loadtest.sim.plan_inputs import (GPU_BLOCK_SIZE, cluster_config, kinds, load, max_output, objectives, rates, step_choice, workload,
                                      describe as describe_workload)
from loadtest.sim.plan_search import Bisection, Search, capacity
from loadtest.sim.plan_sizing import (GpuBudget, Split, auto_rates, capacity_rps, drain_s, fit_duration, recommend,
                                      score, splits)
from loadtest.sim.plan_step import describe
from loadtest.sim.pools import Hardware, engine_params
from loadtest.sim.run import simulate_colocated, simulate_tandem
from loadtest.sim.step_time import MODELS
from loadtest.sim.validate_gpu import EMBED_PARAMS, EngineDefaults, kv_blocks
from loadtest.sim.workload_trace import Load

DEFAULT_DURATION_S = 10.0  # seconds of load per run unless --max-requests shortens it


def gpu_kv_bytes(gpu: str, model: str, tp: int, gemm: str) -> Optional[int]:
    """KV bytes one engine of `tp` GPUs holds after its weights (None: no weight size known)."""
    if model not in EMBED_PARAMS:
        return None
    d = EngineDefaults()
    return kv_blocks(gpu, model, tp, gemm, d) * d.block_size * MODELS[model].kv_bytes_per_token


def gpu_sized(pool: PoolConfig) -> bool:
    """Whether the config leaves the pool's KV cache to the GPU's memory: null, or not written
    (tandem's 256 MiB default exists for CPU engines; on a GPU vLLM would size it)."""
    e = pool.engine
    return e.kv_cache_memory_bytes is None or "kv_cache_memory_bytes" not in e.model_fields_set


def _pool(pool: PoolConfig, replicas: int, tp: int, kv_bytes: Optional[int]) -> PoolConfig:
    engine = pool.engine
    if gpu_sized(pool):
        engine = engine.model_copy(update={"kv_cache_memory_bytes": kv_bytes})
    update = {"replicas": replicas, "num_gpus": float(tp), "engine": engine}
    if pool.autoscaling is not None:
        update["autoscaling"] = pool.autoscaling.model_copy(update={"min_replicas": replicas, "max_replicas": replicas})
    return pool.model_copy(update=update)


def sized_config(cfg: ClusterConfig, tier_name: str, split: Split, mode: str, kv_bytes: Optional[int]) -> ClusterConfig:
    """The config with only the planned tier, its pools sized to the split, in `mode`."""
    tier = cfg.tiers[tier_name]
    tier = tier.model_copy(update={"prefill": _pool(tier.prefill, split.prefill, split.tp, kv_bytes),
                                   "decode": _pool(tier.decode, split.decode, split.tp, kv_bytes)})
    return cfg.model_copy(update={"tiers": {tier_name: tier}, "default_tier": tier_name,
                                  "routing": cfg.routing.model_copy(update={"disaggregation": mode})})


def run_sized(args: argparse.Namespace) -> dict:
    budget = GpuBudget.parse(args.gpus)
    cfg = cluster_config(args)
    tier_name, tier = next(iter(cfg.tiers.items()))
    choice = step_choice(args)
    step = choice.model
    shape = MODELS[args.model]
    engines = budget.engines(args.tp)
    if engines < 1:
        raise SystemExit(f"--gpus {budget} holds no whole engine of TP{args.tp}")
    kv_bytes = gpu_kv_bytes(budget.gpu, args.model, args.tp, args.gemm)
    for pool in (tier.prefill, tier.decode):
        if gpu_sized(pool) and not kv_bytes:
            raise SystemExit(f"{args.model} on TP{args.tp} {budget.gpu}: no room for a KV cache after the weights "
                             "(or no weight size known: set engine.kv_cache_memory_bytes in the config)")
    modes = [m for m in args.modes.split(",") if m]
    if not modes or any(m not in ("adaptive", "always") for m in modes):
        raise SystemExit(f"--modes: adaptive and/or always (colocated is run anyway), got {args.modes!r}")
    candidates = splits(engines, args.tp, args.max_splits)
    wl = workload(args)
    mean, every = objectives(tier)
    hw0 = Hardware(step_model=lambda t, r: step, kv_bytes_per_token=shape.kv_bytes_per_token,
                   default_block_size=GPU_BLOCK_SIZE, link=LinkSpec(1.0, 0.0))
    # Both pools' engines, checked before any run (a KV cache under max_model_len is refused);
    # colocated engines are the decode pool's.
    sized = sized_config(cfg, tier_name, candidates[0], "never", kv_bytes).tiers[tier_name]
    params = {role: engine_params(getattr(sized, role), hw0, cfg.model.max_model_len, f"tiers.{tier_name}.{role}" + (
        f" (TP{args.tp} on {budget.gpu}, its KV cache what the GPUs leave after the weights: a higher --tp leaves more)"
        if gpu_sized(getattr(tier, role)) else "")) for role in ("prefill", "decode")}
    colocated = params["decode"]
    estimate = capacity_rps(step, kinds(wl), engines, colocated.max_num_batched_tokens, colocated.max_num_seqs)
    ladder = tuple(sorted(set(rates(args, wl, None) or auto_rates(estimate))))  # req/s of the mix, or replay speeds
    try:
        spec = Search(ladder, SEARCH_STEPS if args.search_steps is None else args.search_steps,
                      ATTAINMENT if args.attainment is None else args.attainment)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    bandwidths = [float(x) for x in args.bandwidths_gbps.split(",")]
    tandem_cost, vllm_cost = from_benchmark("tandem"), from_benchmark("vllm")
    # Colocated engines pull no KV: one search serves every bandwidth's comparison.
    keys = [None] + [(gbps, split, mode) for gbps in bandwidths for split in candidates[1:] for mode in modes]
    # The most one search can offer: the ladder, then bisections, each below its highest load.
    bound = ladder + (ladder[-1],) * spec.steps
    max_requests = MIX_MAX_REQUESTS if args.max_requests is None else args.max_requests
    if isinstance(wl, Mix):
        duration = args.duration if args.duration is not None else \
            fit_duration(DEFAULT_DURATION_S, bound, len(keys), max_requests, max(4.0, 4 * tier.slo.ttft_s))
        requests = round(sum(bound) * duration * len(keys))
    else:  # the trace is the load: --max-requests does not shorten it
        duration = wl.span_s
        requests = len(wl.requests) * len(bound) * len(keys)
    # The wall time follows the simulated requests: say it first. ~360 per CPU-second, drains
    # included, measured for the 16xH200 70B example on a 2-core VM (25,460 in 70 s): a rough guide.
    each = f"{duration:.3g} s" + ("" if isinstance(wl, Mix) else " at speed 1")
    print(f"{LABEL}: at most {len(keys) * spec.max_runs} runs of {each}, ~{requests:,} simulated requests at most "
          f"(colocated + {len(candidates) - 1} P:D splits x {len(modes)} modes x {len(bandwidths)} KV links, each a "
          f"capacity search of {len(ladder)} loads + {spec.steps} bisections at most); roughly "
          f"{max(requests / 360 / 60, 0.1):.1f} min at most", flush=True)
    searches = {key: Bisection(spec) for key in keys}
    rows, drains = [], {}
    # Breadth-first: every search's next load in a round, each load's trace built once per round.
    while True:
        pending: dict[float, list] = {}
        for key, b in searches.items():
            x = b.next_load()
            if x is not None:
                pending.setdefault(x, []).append(key)
        if not pending:
            break
        for x in sorted(pending):
            offered = load(wl, x, duration, args.seed)
            drain = drains[offered.rate_rps] = drain_s(offered.duration_s, tier.slo.ttft_s, tier.slo.itl_s, max_output(wl))
            for key in pending[x]:
                if key is None:
                    res = simulate_colocated(engines, colocated, step, vllm_cost, offered.schedule, drain_timeout_s=drain,
                                             control_cores=args.control_cores, shares_engine_cores=None)
                    row = _row(candidates[0], "colocated", offered, res, mean, every, spec)
                    rows += [{**row, "bandwidth_gbps": bw} for bw in bandwidths]
                else:
                    gbps, split, mode = key
                    hw = Hardware(step_model=lambda t, r: step, kv_bytes_per_token=shape.kv_bytes_per_token,
                                  default_block_size=GPU_BLOCK_SIZE,
                                  link=LinkSpec(gbps * 1e9 / 8, args.transfer_fixed_ms / 1000))
                    res = simulate_tandem(sized_config(cfg, tier_name, split, mode, kv_bytes), hw, tandem_cost,
                                          offered.schedule, seed=args.seed, drain_timeout_s=drain,
                                          control_cores=args.control_cores, shares_engine_cores=None, tier=tier_name)
                    row = {**_row(split, mode, offered, res, mean, every, spec), "bandwidth_gbps": gbps}
                    rows.append(row)
                searches[key].add(x, row)
    slo = f">= {spec.attainment:.0%} of requests within TTFT {mean.ttft_ms:g} ms, mean ITL {mean.mean_itl_ms:g} ms"
    rec = recommend(score(rows, {s.label: s for s in candidates}), budget.gpu, slo)
    by_candidate = {c: [r for r in rows if r["candidate"] == c] for c in rec["ranking"]}
    control = {c: need(rs, args.control_cores, best_run(rs)) for c, rs in by_candidate.items()}
    rec["control_plane"] = control[rec["candidate"]]
    return {"label": LABEL, "what": f"tandem plan --gpus {budget}: simulated capacity under the SLO of every P:D split and colocated",
            "recommendation": rec,
            "budget": {"gpus": budget.count, "gpu": budget.gpu, "tp": args.tp, "engines": engines,
                       "idle_gpus": budget.count - engines * args.tp,
                       "swept": [s.label for s in candidates], "modes": modes, "max_splits": args.max_splits},
            "provenance": {"step_time": choice.provenance(),
                           "kv_link": {"bandwidths_gbps": args.bandwidths_gbps, "fixed_ms": args.transfer_fixed_ms},
                           "control_plane": {"tandem": tandem_cost.source, "colocated": vllm_cost.source,
                                             "cores": args.control_cores, "acts_through": ACTS_THROUGH},
                           "kv_cache_bytes_per_engine": colocated.num_blocks * colocated.block_size * shape.kv_bytes_per_token,
                           "kv_cache_from": "config" if not gpu_sized(tier.decode) else
                           "GPU memory after weights (validate_gpu.py kv_blocks)",
                           "config": str(args.config), "tier": tier_name,
                           "estimated_capacity_rps": round(estimate, 2),
                           "capacity_note": "a rough estimate from the step time, only to place the search's ladder",
                           "score": "per candidate: its capacity (plan_search.py: the highest offered load that meets "
                                    "the SLO criterion), least over the bandwidths"},
            "workload": {**describe_workload(wl), "rates_rps": sorted({r["rate_rps"] for r in rows}),
                         "duration_s": duration, "seed": args.seed,
                         "drain_s": drain if len(set(drains.values())) == 1 else {f"{r:g}": d for r, d in drains.items()},
                         "simulated_requests": requests,
                         "duration_from": "the trace (its last arrival)" if not isinstance(wl, Mix) else
                         "--duration" if args.duration is not None else
                         f"the default {DEFAULT_DURATION_S:g} s" if duration >= DEFAULT_DURATION_S else
                         f"the default {DEFAULT_DURATION_S:g} s shortened to fit --max-requests {max_requests}"},
            "objectives": {"ttft_ms": mean.ttft_ms, "mean_itl_ms": mean.mean_itl_ms, "max_gap_ms": every.max_gap_ms},
            "search": {**spec.describe("replay speeds of the trace" if not isinstance(wl, Mix) else "req/s of the mix"),
                       "runs": len({(r["candidate"], r["bandwidth_gbps"], r["rate_rps"]) for r in rows
                                    if r["mode"] != "colocated" or r["bandwidth_gbps"] == bandwidths[0]}),
                       "capacity_rps": _capacities(rows)},
            "control_plane_need": control,
            "rows": rows}


def _capacities(rows: list[dict]) -> dict:
    """Per candidate and KV link (Gbit/s): its capacity, the lowest load that failed (None: every
    load met, not bracketed) and the loads run."""
    out: dict[str, dict] = {}
    for r in rows:
        out.setdefault(r["candidate"], {}).setdefault(f"{r['bandwidth_gbps']:g}", []).append(r)
    return {c: {bw: {"capacity_rps": (cap := capacity(rs)).rate_rps, "failed_at_rps": cap.failed_rps,
                     "loads_run_rps": [r["rate_rps"] for r in rs]} for bw, rs in by_bw.items()}
            for c, by_bw in out.items()}


def _row(split: Split, mode: str, offered: Load, res, mean, every, spec: Search) -> dict:
    s = res.summary(mean, every, offered.duration_s, split.engines)
    return {"candidate": split.label if split.colocated else f"{mode} {split.label}", "split": split.label,
            "mode": mode, "rate_rps": offered.rate_rps, "replay_speed": offered.speed,
            "slo_attainment": s["slo_attainment"], "meets": spec.meets(s["slo_attainment"]), "goodput_rps": s["goodput_rps"],
            "goodput_rps_max_gap": s["goodput_rps_max_gap"], "ttft_p90_ms": s["ttft"].get("p90_ms"),
            "mean_itl_p50_ms": s["mean_itl"].get("p50_ms"), "reasons": res.trace.reasons(),
            "control_plane": res.control}


def report(result: dict) -> None:
    rec, b = result["recommendation"], result["budget"]
    print(f"{LABEL} plan for {b['gpus']}x{b['gpu']}, TP{b['tp']}: {b['engines']} engines"
          + (f" ({b['idle_gpus']} GPUs idle)" if b["idle_gpus"] else "")
          + f"; capacity search from the ladder {', '.join(f'{x:g}' for x in result['search']['ladder'])} "
          + result["search"]["ladder_unit"]
          + (f" {result['workload']['trace']['path']}" if "trace" in result["workload"] else ""))
    print(f"recommended: {rec['reason']}")
    sr = result["search"]
    print(f"capacity, req/s: the highest offered load with >= {sr['attainment']:.0%} of requests within the SLO, "
          f"within {sr['resolution']:g} ({sr['ladder_unit']}) unless marked '>=' (met at the top of the ladder); "
          "per KV link Gbit/s:")
    for c in rec["ranking"]:
        cells = sorted(sr["capacity_rps"][c].items(), key=lambda kv: float(kv[0]))
        print(f"  {c:<22} " + "  ".join(f"{bw:>5}: {'>=' if cap['failed_at_rps'] is None else '  '}"
                                        f"{cap['capacity_rps']:7.2f}" for bw, cap in cells))
    print(f"{sr['runs']} runs (at most {sr['max_runs_per_candidate_and_link']} per candidate and link: "
          f"{len(sr['ladder'])} ladder loads + {sr['bisection_steps']} bisections)")
    cp = result["provenance"]["control_plane"]
    print(f"control-plane cores ({ACTS_THROUGH.split(':')[0]}; CPU per token: tandem {cp['tandem']}; "
          f"colocated {cp['colocated']}):")
    for c in rec["ranking"]:
        print(f"  {c:<22} {line(result['control_plane_need'][c])}")
    print(f"the recommended {rec['candidate']} needs {line(rec['control_plane'])}")


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
            at = capacity(rows).run
            if at is not None:  # the capacity: the search's last load that met the SLO
                ax.plot([at["rate_rps"]], [at["goodput_rps"]], marker="*", markersize=14, color=drawn[0].get_color())
        ax.set(title=f"KV link {bw:g} Gbit/s (*: capacity)", xlabel="offered load (req/s)",
               ylabel="goodput under the SLO (req/s)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    b = result["budget"]
    fig.suptitle(f"{LABEL}: not measured. {b['gpus']}x{b['gpu']}, TP{b['tp']}: recommended {rec['candidate']}\n"
                 f"step time: {describe(result['provenance']['step_time'])}", fontsize=8, color="darkred", wrap=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
