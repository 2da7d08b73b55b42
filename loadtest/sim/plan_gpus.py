"""`tandem plan --gpus 16xH200`: every way to spend a GPU budget (plan_sizing.py), each simulated
with tandem's real policies (run.py: router, decider, admission, autoscaler) or as colocated
vLLM engines, at the KV-link bandwidths; each candidate's capacity under the tier's SLO found by
a bounded search over offered loads (plan_search.py), the highest recommended, with its reason
and the runners-up. SIMULATED, every figure.

The config supplies the tier's SLO, admission, routing and engine arguments; the split supplies
the replica counts and each pool's TP (num_gpus = TP: --prefill-tp, --decode-tp, colocated
engines --tp), and each pool's engines step at their own TP's step time. Their KV cache: the
config's kv_cache_memory_bytes where written, else (null or left out) what their GPUs leave
after the weights at their TP (validate_gpu.py `kv_blocks`, vLLM's gpu_memory_utilization and an
assumed reserve), so one config plans any budget. A pool's autoscaling bounds are pinned to the
split's count: the budget leaves no GPU to scale onto, and the real policy still ticks in the
loop (its decisions are traced, clamped). The console and the picture: plan_report.py.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Optional

from cluster.config import ClusterConfig
from cluster.config.pools import PoolConfig
from loadtest.bench.workload import Mix, summarize
from loadtest.sim import LABEL
from loadtest.sim.control_plane import from_benchmark
from loadtest.sim.engine import EngineParams
from loadtest.sim.network import LinkSpec
from loadtest.sim.plan_cli import ATTAINMENT, MIX_MAX_REQUESTS, SEARCH_STEPS, SEEDS
from loadtest.sim.plan_control import ACTS_THROUGH, best_run, need
from loadtest.sim.plan_inputs import (GPU_BLOCK_SIZE, accelerator, cluster_config, kinds, load, max_output, objectives,
                                      rates, step_choice, tensor_parallel, workload, describe as describe_workload)
from loadtest.sim.plan_search import Bisection, Search, capacity, seed_capacities
from loadtest.sim.plan_sizing import (GpuBudget, Split, TensorParallel, auto_rates, capacity_rps, drain_s, fit_duration,
                                      recommend, score, splits)
from loadtest.sim.plan_step import StepChoice
from loadtest.sim.pools import Hardware, engine_params
from loadtest.sim.run import RunResult, simulate_colocated, simulate_tandem
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


def _pool(pool: PoolConfig, replicas: int, tp: int, kv_bytes: dict[int, Optional[int]]) -> PoolConfig:
    engine = pool.engine
    if gpu_sized(pool):
        engine = engine.model_copy(update={"kv_cache_memory_bytes": kv_bytes[tp]})
    update = {"replicas": replicas, "num_gpus": float(tp), "engine": engine}
    if pool.autoscaling is not None:
        update["autoscaling"] = pool.autoscaling.model_copy(update={"min_replicas": replicas, "max_replicas": replicas})
    return pool.model_copy(update=update)


def sized_config(cfg: ClusterConfig, tier_name: str, split: Split, mode: str,
                 kv_bytes: dict[int, Optional[int]]) -> ClusterConfig:
    """The config with only the planned tier, its pools sized to the split, in `mode`. `kv_bytes`:
    an engine's KV cache by its TP (gpu_kv_bytes), for the pools the config leaves to the GPU."""
    tier = cfg.tiers[tier_name]
    tier = tier.model_copy(update={"prefill": _pool(tier.prefill, split.prefill, split.prefill_tp, kv_bytes),
                                   "decode": _pool(tier.decode, split.decode, split.decode_tp, kv_bytes)})
    return cfg.model_copy(update={"tiers": {tier_name: tier}, "default_tier": tier_name,
                                  "routing": cfg.routing.model_copy(update={"disaggregation": mode})})


@dataclass(frozen=True)
class Role:
    """One kind of engine in the candidates (colocated, prefill or decode): its step time and the
    engine its pool's config makes, both at its TP."""

    choice: StepChoice
    params: EngineParams


def _roles(args: argparse.Namespace, cfg: ClusterConfig, tier_name: str, budget: GpuBudget, tp: TensorParallel,
           candidates: tuple[Split, ...], kv_bytes: dict[int, Optional[int]]) -> dict[str, Role]:
    """Each kind of engine the candidates run, checked before any run: room for a KV cache at its
    TP, and one that holds model.max_model_len (pools.engine_params). Colocated engines are the
    decode pool's engine arguments at --tp; prefill and decode only where a split exists."""
    tier = cfg.tiers[tier_name]
    each = {"prefill": (tier.prefill, tp.prefill, candidates[-1]), "decode": (tier.decode, tp.decode, candidates[-1]),
            "colocated": (tier.decode, tp.colocated, candidates[0])}
    if len(candidates) == 1:  # no split fits: colocated alone
        del each["prefill"], each["decode"]
    shape = MODELS[args.model]
    hw = Hardware(step_model=lambda t, r: None, kv_bytes_per_token=shape.kv_bytes_per_token,
                  default_block_size=GPU_BLOCK_SIZE, link=LinkSpec(1.0, 0.0))
    out = {}
    for role, (pool, t, split) in each.items():
        pool_role = "decode" if role == "colocated" else role
        where = f"tiers.{tier_name}.{pool_role}" + (" as colocated engines" if role == "colocated" else "")
        if gpu_sized(pool):
            if not kv_bytes[t]:
                raise SystemExit(f"{args.model} on TP{t} {budget.gpu} ({role} engines): no room for a KV cache after "
                                 "the weights (or no weight size known: set engine.kv_cache_memory_bytes in the config)")
            where += (f" (TP{t} on {budget.gpu}, its KV cache what the GPUs leave after the weights: a higher "
                      f"{'--tp' if role == 'colocated' else f'--{role}-tp'} leaves more)")
        sized = getattr(sized_config(cfg, tier_name, split, "never", kv_bytes).tiers[tier_name], pool_role)
        out[role] = Role(step_choice(args, t), engine_params(sized, hw, cfg.model.max_model_len, where))
    return out


def run_sized(args: argparse.Namespace) -> dict:
    cfg = cluster_config(args)
    tier_name, tier = next(iter(cfg.tiers.items()))
    accelerator(args)  # --gpus read, and checked against --accelerator, with a one-line error
    budget = GpuBudget.parse(args.gpus)
    tp = tensor_parallel(args)
    modes = [m for m in args.modes.split(",") if m]
    if not modes or any(m not in ("adaptive", "always") for m in modes):
        raise SystemExit(f"--modes: adaptive and/or always (colocated is run anyway), got {args.modes!r}")
    try:
        candidates = splits(budget.count, tp, args.max_splits)
    except ValueError as exc:
        raise SystemExit(f"--gpus {budget}: {exc}") from None
    kv_bytes = {t: gpu_kv_bytes(budget.gpu, args.model, t, args.gemm) for t in {tp.colocated, tp.prefill, tp.decode}}
    roles = _roles(args, cfg, tier_name, budget, tp, candidates, kv_bytes)
    engines = candidates[0].engines
    shape = MODELS[args.model]
    wl = workload(args)
    mean, every = objectives(tier)
    colocated = roles["colocated"].params
    step = roles["colocated"].choice.model
    # Each pool's engines step at their own TP's step time.
    steps = {role: roles[role].choice.model for role in ("prefill", "decode") if role in roles}
    estimate = capacity_rps(step, kinds(wl), engines, colocated.max_num_batched_tokens, colocated.max_num_seqs)
    ladder = tuple(sorted(set(rates(args, wl, None) or auto_rates(estimate))))  # req/s of the mix, or replay speeds
    try:
        spec = Search(ladder, SEARCH_STEPS if args.search_steps is None else args.search_steps,
                      ATTAINMENT if args.attainment is None else args.attainment, SEEDS if args.seeds is None else args.seeds)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    seeds = tuple(range(args.seed, args.seed + spec.seeds))
    bandwidths = [float(x) for x in args.bandwidths_gbps.split(",")]
    tandem_cost, vllm_cost = from_benchmark("tandem"), from_benchmark("vllm")
    # Colocated engines pull no KV: one search serves every bandwidth's comparison.
    keys = [None] + [(gbps, split, mode) for gbps in bandwidths for split in candidates[1:] for mode in modes]
    # The most one search can offer: the ladder, then bisections, each below its highest load.
    bound = ladder + (ladder[-1],) * spec.steps
    max_requests = MIX_MAX_REQUESTS if args.max_requests is None else args.max_requests
    runs_per_load = len(keys) * spec.seeds
    if isinstance(wl, Mix):
        duration = args.duration if args.duration is not None else \
            fit_duration(DEFAULT_DURATION_S, bound, runs_per_load, max_requests, max(4.0, 4 * tier.slo.ttft_s))
        requests = round(sum(bound) * duration * runs_per_load)
    else:  # the trace is the load: --max-requests does not shorten it
        duration = wl.span_s
        requests = len(wl.requests) * len(bound) * runs_per_load
    # The wall time follows the simulated requests: say it first. ~360 per CPU-second, drains
    # included, measured for the 16xH200 70B example on a 2-core VM (25,460 in 70 s): a rough guide.
    each = f"{duration:.3g} s" + ("" if isinstance(wl, Mix) else " at speed 1")
    print(f"{LABEL}: at most {len(keys) * spec.max_runs} runs of {each}, ~{requests:,} simulated requests at most "
          f"(colocated + {len(candidates) - 1} P:D splits x {len(modes)} modes x {len(bandwidths)} KV links, each a "
          f"capacity search of {len(ladder)} loads + {spec.steps} bisections at most"
          + (f", each load x {spec.seeds} seeds" if spec.seeds > 1 else "") + "); roughly "
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
            offered = [load(wl, x, duration, seed) for seed in seeds]  # one trace per seed
            drain = drains[offered[0].rate_rps] = drain_s(offered[0].duration_s, tier.slo.ttft_s, tier.slo.itl_s,
                                                           max_output(wl))
            for key in pending[x]:
                if key is None:
                    runs = [simulate_colocated(engines, colocated, step, vllm_cost, o.schedule, drain_timeout_s=drain,
                                               control_cores=args.control_cores, shares_engine_cores=None)
                            for o in offered]
                    row = pooled_row(candidates[0], "colocated", offered, runs, seeds, mean, every, spec)
                    rows += [{**row, "bandwidth_gbps": bw} for bw in bandwidths]
                else:
                    gbps, split, mode = key
                    hw = Hardware(step_model=lambda t, r: steps[r], kv_bytes_per_token=shape.kv_bytes_per_token,
                                  default_block_size=GPU_BLOCK_SIZE,
                                  link=LinkSpec(gbps * 1e9 / 8, args.transfer_fixed_ms / 1000))
                    sized = sized_config(cfg, tier_name, split, mode, kv_bytes)
                    runs = [simulate_tandem(sized, hw, tandem_cost, o.schedule, seed=seed, drain_timeout_s=drain,
                                            control_cores=args.control_cores, shares_engine_cores=None, tier=tier_name)
                            for seed, o in zip(seeds, offered)]
                    row = {**pooled_row(split, mode, offered, runs, seeds, mean, every, spec), "bandwidth_gbps": gbps}
                    rows.append(row)
                searches[key].add(x, row)
    slo = f">= {spec.attainment:.0%} of requests within TTFT {mean.ttft_ms:g} ms, mean ITL {mean.mean_itl_ms:g} ms"
    rec = recommend(score(rows, {s.label: s for s in candidates}), budget.gpu, slo)
    loads_run = len({(r["candidate"], r["bandwidth_gbps"], r["rate_rps"]) for r in rows
                     if r["mode"] != "colocated" or r["bandwidth_gbps"] == bandwidths[0]})  # colocated: once
    by_candidate = {c: [r for r in rows if r["candidate"] == c] for c in rec["ranking"]}
    control = {c: need(rs, args.control_cores, best_run(rs)) for c, rs in by_candidate.items()}
    rec["control_plane"] = control[rec["candidate"]]
    return {"label": LABEL, "what": f"tandem plan --gpus {budget}: simulated capacity under the SLO of every P:D split and colocated",
            "recommendation": rec,
            "budget": {"gpus": budget.count, "gpu": budget.gpu,
                       "tp": {"colocated": tp.colocated, "prefill": tp.prefill, "decode": tp.decode},
                       "colocated_engines": engines, "swept": [s.label for s in candidates],
                       "gpus_used": {s.label: s.gpus for s in candidates},
                       "idle_gpus": {s.label: budget.count - s.gpus for s in candidates},
                       "splits_are": "P prefill engines x prefill TP + D decode engines x decode TP GPUs within the "
                                     "budget, where no further engine of either pool fits",
                       "modes": modes, "max_splits": args.max_splits},
            "provenance": {"step_time": {role: r.choice.provenance() for role, r in roles.items()},
                           "kv_link": {"bandwidths_gbps": args.bandwidths_gbps, "fixed_ms": args.transfer_fixed_ms},
                           "control_plane": {"tandem": tandem_cost.source, "colocated": vllm_cost.source,
                                             "cores": args.control_cores, "acts_through": ACTS_THROUGH},
                           "kv_cache_bytes_per_engine": {role: r.params.num_blocks * r.params.block_size *
                                                         shape.kv_bytes_per_token for role, r in roles.items()},
                           "kv_cache_from": {role: "GPU memory after weights at its TP (validate_gpu.py kv_blocks)"
                                             if gpu_sized(tier.prefill if role == "prefill" else tier.decode)
                                             else "config" for role in roles},
                           "config": str(args.config), "tier": tier_name,
                           "estimated_capacity_rps": round(estimate, 2),
                           "capacity_note": "a rough estimate from the step time, only to place the search's ladder",
                           "score": "per candidate: its capacity (plan_search.py: the highest offered load that meets "
                                    "the SLO criterion), least over the bandwidths"},
            "workload": {**describe_workload(wl), "rates_rps": sorted({r["rate_rps"] for r in rows}),
                         "duration_s": duration, "seeds": list(seeds),
                         "drain_s": drain if len(set(drains.values())) == 1 else {f"{r:g}": d for r, d in drains.items()},
                         "simulated_requests": requests,
                         "duration_from": "the trace (its last arrival)" if not isinstance(wl, Mix) else
                         "--duration" if args.duration is not None else
                         f"the default {DEFAULT_DURATION_S:g} s" if duration >= DEFAULT_DURATION_S else
                         f"the default {DEFAULT_DURATION_S:g} s shortened to fit --max-requests {max_requests}"},
            "objectives": {"ttft_ms": mean.ttft_ms, "mean_itl_ms": mean.mean_itl_ms, "max_gap_ms": every.max_gap_ms},
            "search": {**spec.describe("replay speeds of the trace" if not isinstance(wl, Mix) else "req/s of the mix"),
                       "loads_run": loads_run, "runs": loads_run * spec.seeds,
                       "capacity_rps": _capacities(rows)},
            "control_plane_need": control,
            "rows": rows}


def _capacities(rows: list[dict]) -> dict:
    """Per candidate and KV link (Gbit/s): its capacity, the lowest load that failed (None: every
    load met, not bracketed) and the loads run; with several seeds each seed's own capacity at
    those loads and their spread."""
    out: dict[str, dict] = {}
    for r in rows:
        out.setdefault(r["candidate"], {}).setdefault(f"{r['bandwidth_gbps']:g}", []).append(r)
    table: dict[str, dict] = {}
    for c, by_bw in out.items():
        for bw, rs in by_bw.items():
            cap = capacity(rs)
            cell = {"capacity_rps": cap.rate_rps, "failed_at_rps": cap.failed_rps,
                    "loads_run_rps": [r["rate_rps"] for r in rs]}
            per_seed = [s.rate_rps for s in seed_capacities(rs)]
            if per_seed:
                cell.update(by_seed=per_seed, spread_rps=round(max(per_seed) - min(per_seed), 4))
            table.setdefault(c, {})[bw] = cell
    return table


def pooled_row(split: Split, mode: str, offered: list[Load], runs: list[RunResult], seeds: tuple[int, ...], mean, every,
               spec: Search) -> dict:
    """One load's row from its runs, one per seed: attainment, goodput and latencies over all
    their requests pooled (goodput: met requests over the seeds' windows, the mean of the seeds'
    goodputs); the decisions summed; the control plane of the seed that needed the most cores.
    With several seeds, each seed's figures and their spread beside."""
    records = [rec for res in runs for rec in res.records]
    window = sum(o.duration_s for o in offered)
    s = summarize(records, mean, window, max(res.span_s for res in runs), split.engines)
    reasons: dict[str, int] = {}
    for res in runs:
        for k, n in res.trace.reasons().items():
            reasons[k] = reasons.get(k, 0) + n
    busiest = max(range(len(runs)), key=lambda i: runs[i].control["peak_cores_1s"])  # ties: the first seed
    row = {"candidate": split.label if split.colocated else f"{mode} {split.label}", "split": split.label,
           "mode": mode, "rate_rps": offered[0].rate_rps, "replay_speed": offered[0].speed,
           "slo_attainment": s["slo_attainment"], "meets": spec.meets(s["slo_attainment"]), "goodput_rps": s["goodput_rps"],
           "goodput_rps_max_gap": round(sum(every.met_by(r) for r in records) / window, 4),
           "ttft_p90_ms": s["ttft"].get("p90_ms"), "mean_itl_p50_ms": s["mean_itl"].get("p50_ms"),
           "reasons": dict(sorted(reasons.items())), "control_plane": runs[busiest].control}
    if len(runs) == 1:
        return row
    per = [res.summary(mean, every, o.duration_s, split.engines) for res, o in zip(runs, offered)]
    by_seed = [{"seed": seed, "requests": p["requests"], "met_slo": p["met_slo"], "slo_attainment": p["slo_attainment"],
                "meets": spec.meets(p["slo_attainment"]), "goodput_rps": p["goodput_rps"],
                "peak_cores_1s": res.control["peak_cores_1s"]} for seed, p, res in zip(seeds, per, runs)]
    att = [b["slo_attainment"] for b in by_seed if b["slo_attainment"] is not None]
    return {**row, "by_seed": by_seed, "control_plane_seed": seeds[busiest],
            "spread": {"slo_attainment": round(max(att) - min(att), 4) if att else None,
                       "goodput_rps": round(max(b["goodput_rps"] for b in by_seed) - min(b["goodput_rps"] for b in by_seed), 4)}}
