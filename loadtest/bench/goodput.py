"""Goodput of tandem disaggregated vs colocated vLLM, side by side in one run, on the same
machine and the same cores. Writes JSON and a PNG plot.

    flock /tmp/tandem-cluster.lock .venv/bin/python -m loadtest.bench.goodput [--model PATH] [--rates 0.5,1,1.5,2]

Systems, each started afresh and given the same two cores (or, with a GPU, two GPUs):
  tandem      1 prefill + 1 decode engine, one core each, through tandem's gateway
  colocated   two plain vLLM api_servers, one core each; the client round-robins requests
  single      one plain vLLM api_server on both cores
Every engine gets the same model, dtype, max_num_seqs, max_num_batched_tokens and KV cache
per core. Workload (loadtest/bench/workload.py): a seeded Poisson mix of prefill-heavy and
decode-heavy streaming /v1/completions requests, open loop, the same trace per rate for every
system. Goodput counts requests that meet the SLO (TTFT and mean inter-token latency); a
second figure also bounds every gap between streamed tokens (no stall).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from pathlib import Path

import psutil

from loadtest.bench.engines import DirectEngines, DirectEngineSpec
from loadtest.bench.loadgen import replay
from loadtest.bench.workload import Mix, RequestKind, ScheduledRequest, poisson_schedule, summarize
from loadtest.measure.slo import Objective
from cluster.config import ClusterConfig
from cluster.hardware import cpu_flags, engine_dtype

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = ROOT / ".tandem" / "models" / "SmolLM2-135M-Instruct"
RESULTS = Path(__file__).resolve().parent / "results"
SYSTEMS = ("tandem", "colocated", "single")
GATEWAY_PORT = 8000
DIRECT_PORTS = (8101, 8102)


def log(line: str) -> None:
    print(line, flush=True)


def on_gpu() -> bool:
    """Two GPUs: each engine gets one (the single engine both, tensor-parallel). None: CPU cores."""
    try:
        import torch

        count = torch.cuda.device_count()
    except ImportError:
        return False
    if count == 1:
        raise SystemExit("goodput compares systems on the same two devices; this machine has one GPU. "
                         "Run it where two GPUs are visible (CUDA_VISIBLE_DEVICES), or hide the GPU for a CPU run.")
    return count >= 2


def tandem_config(args, gpu: bool) -> ClusterConfig:
    engine = {"kv_cache_bytes": args.kv_cache_mib << 20, "max_num_seqs": args.max_num_seqs,
              "max_num_batched_tokens": args.max_num_batched_tokens}
    pool = {"num_gpus": 1, "num_cpus": 0} if gpu else {"num_cpus": 1}
    return ClusterConfig.model_validate({
        "model": {"path": str(args.model), "name": args.model.name, "dtype": args.dtype,
                  "max_model_len": args.max_model_len},
        "gateway": {"host": "127.0.0.1", "port": GATEWAY_PORT},
        "tiers": {"interactive": {
            "prefill": {"replicas": 1, "cpu_binding": ["0"], "engine": engine, **pool},
            "decode": {"replicas": 1, "cpu_binding": ["1"], "engine": engine, **pool},
            "slo": {"ttft_s": args.ttft_slo, "itl_s": args.itl_slo},
            # Generous bounds: the baselines have no admission control, so neither may tandem
            # turn load away here; a request that waits too long misses its SLO instead.
            "admission": {"max_running": 1024, "max_queued": 4096, "queue_timeout_s": 600},
        }},
        "ray": {"num_cpus": None if gpu else 2},
    })


def direct_specs(args, system: str, gpu: bool) -> list[DirectEngineSpec]:
    common = dict(model_path=args.model, served_name=args.model.name, dtype=args.dtype,
                  max_model_len=args.max_model_len, on_gpu=gpu, max_num_seqs=args.max_num_seqs,
                  max_num_batched_tokens=args.max_num_batched_tokens)
    kv = args.kv_cache_mib << 20
    if system == "colocated":
        return [DirectEngineSpec(**common, kv_cache_bytes=kv, port=port, devices=dev)
                for port, dev in zip(DIRECT_PORTS, ("0", "1"))]
    # One engine with both cores (or GPUs) gets both engines' KV cache.
    return [DirectEngineSpec(**common, kv_cache_bytes=2 * kv, port=DIRECT_PORTS[0],
                             devices="0,1" if gpu else "0-1")]


def warm_up(urls: list[str], model: str, mix: Mix) -> None:
    """Two requests of each kind per server, one at a time: first-call costs (NIXL handshake,
    allocator growth) stay out of the measurement."""
    i = 0
    for url in urls:
        for kind in (mix.prefill_heavy, mix.decode_heavy) * 2:
            prompt = tuple(range(1000 + 7 * i, 1000 + 7 * i + kind.prompt_tokens))
            req = ScheduledRequest(i, 0.0, kind.name, prompt, min(kind.output_tokens, 16))
            records, _ = asyncio.run(replay([url], model, [req], 120, lambda _: None, "warm-up"))
            if records[0].error:
                raise RuntimeError(f"warm-up request failed on {url}: {records[0].error}")
            i += 1


def serve_rates(system: str, urls: list[str], args, mix: Mix, slo: Objective, strict: Objective,
                cores: int) -> list[dict]:
    out = []
    for rate in args.rates:
        schedule = poisson_schedule(mix, rate, args.duration, args.seed)
        log(f"[goodput] {system} at {rate} req/s: {len(schedule)} requests over {args.duration:.0f} s")
        records, span = asyncio.run(replay(urls, args.model.name, schedule, args.drain_timeout, log,
                                           f"{system} @ {rate}/s"))
        summary = summarize(records, slo, args.duration, span, cores)
        no_stall = summarize(records, strict, args.duration, span, cores)
        summary["goodput_rps_max_gap"] = no_stall["goodput_rps"]
        summary["met_slo_max_gap"] = no_stall["met_slo"]
        log(f"[goodput] {system} at {rate} req/s: goodput {summary['goodput_rps']} req/s "
            f"({summary['met_slo']}/{summary['requests']} met SLO, {summary['errors']} errors; "
            f"{summary['goodput_rps_max_gap']} with the max-gap bound), "
            f"TTFT p50 {summary['ttft'].get('p50_ms')} ms p99 {summary['ttft'].get('p99_ms')} ms, "
            f"mean ITL p50 {summary['mean_itl'].get('p50_ms')} ms p99 {summary['mean_itl'].get('p99_ms')} ms, "
            f"{summary['output_tokens_per_s_per_core']} output tok/s/core")
        errors = sorted({r.error for r in records if r.error})
        out.append({"rate_rps": rate, "offered_rps": round(len(schedule) / args.duration, 3), **summary,
                    "error_kinds": errors[:5],
                    "records": [{"kind": r.workload, "ttft_ms": _round(r.ttft_ms, 1),
                                 "mean_itl_ms": _round(r.mean_itl_ms, 2), "max_gap_ms": round(r.max_gap_ms, 1),
                                 "tokens": r.output_tokens, "error": r.error or None} for r in records]})
        time.sleep(2)  # the engines finish aborting what the drain cut off
    return out


def _round(v, digits: int):
    return None if v is None else round(v, digits)


def run_system(system: str, args, mix: Mix, slo: Objective, strict: Objective, gpu: bool) -> dict:
    cores = 2
    t0 = time.monotonic()
    if system == "tandem":
        from cluster.local import LocalCluster

        cfg = tandem_config(args, gpu)
        cluster = LocalCluster(cfg, progress=log)
        cluster.start()
        try:
            cold = time.monotonic() - t0
            warm_up([cluster.url], args.model.name, mix)
            rates = serve_rates(system, [cluster.url], args, mix, slo, strict, cores)
        finally:
            cluster.stop()
    else:
        with DirectEngines(direct_specs(args, system, gpu), progress=log) as engines:
            cold = time.monotonic() - t0
            warm_up(engines.urls, args.model.name, mix)
            rates = serve_rates(system, engines.urls, args, mix, slo, strict, cores)
    return {"cold_start_s": round(cold, 1), "rates": rates}


def compare(systems: dict) -> dict:
    """Goodput of tandem over colocated per rate and at each system's best rate."""
    out = {}
    if "tandem" in systems and "colocated" in systems:
        per_rate = {}
        for a, b in zip(systems["tandem"]["rates"], systems["colocated"]["rates"]):
            per_rate[str(a["rate_rps"])] = round(a["goodput_rps"] / b["goodput_rps"], 3) if b["goodput_rps"] else None
        best = {key: {name: max(r[key] for r in s["rates"]) for name, s in systems.items()}
                for key in ("goodput_rps", "goodput_rps_max_gap")}
        ratios = {key: round(b["tandem"] / b["colocated"], 3) if b["colocated"] else None for key, b in best.items()}
        ratio = ratios["goodput_rps"]
        out = {"goodput_ratio_tandem_over_colocated_per_rate": per_rate,
               "best_goodput_rps": best["goodput_rps"],
               "best_goodput_ratio_tandem_over_colocated": ratio,
               "best_goodput_rps_max_gap": best["goodput_rps_max_gap"],
               "best_goodput_ratio_tandem_over_colocated_max_gap": ratios["goodput_rps_max_gap"],
               "target": "best goodput of tandem >= 1.5x that of two colocated engines, same SLO, prefill-heavy mix",
               "target_met": ratio is not None and ratio >= 1.5}
    return out


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax1, ax2) = plt.subplots(1, 3, figsize=(15, 4.4))
    for name, system in result["systems"].items():
        # The realized load of each trace (arrivals / window): a short Poisson trace strays
        # from its nominal rate, and every system served the same trace.
        rates = [r["offered_rps"] for r in system["rates"]]
        ax.plot(rates, [r["goodput_rps"] for r in system["rates"]], marker="o", label=name)
        ax1.plot(rates, [r["goodput_rps_max_gap"] for r in system["rates"]], marker="o", label=name)
        ax2.plot(rates, [r["ttft"].get("p90_ms") for r in system["rates"]], marker="o", label=name)
    top = max(r["offered_rps"] for s in result["systems"].values() for r in s["rates"])
    slo = result["slo"]
    for a in (ax, ax1):
        a.plot([0, top], [0, top], color="grey", linestyle=":", label="every request meets the SLO")
        a.set(xlabel="offered load, arrivals / window (requests/s)", ylabel="goodput (requests/s meeting the SLO)")
    ax.set_title(f"SLO: TTFT <= {slo['ttft_s']} s, mean ITL <= {slo['itl_s'] * 1000:.0f} ms", fontsize=10)
    ax1.set_title(f"same SLO and every token gap <= {slo['max_gap_s'] * 1000:.0f} ms", fontsize=10)
    ax2.set(xlabel="offered load, arrivals / window (requests/s)", ylabel="TTFT p90 (ms)", yscale="log")
    ax2.set_title("TTFT p90 (completed requests)", fontsize=10)
    for a in (ax, ax1, ax2):
        a.grid(alpha=0.3)
        a.legend()
    fig.suptitle(f"{result['model']} on {result['machine']['cpus']} CPU cores: "
                 f"{result['workload']['prefill_share']:.0%} prefill-heavy mix", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="checkpoint folder (any vLLM model)")
    p.add_argument("--dtype", default="auto", help="auto: as tandem decides it on this host (cluster/hardware.py), "
                                                  "for all three systems alike")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--systems", default=",".join(SYSTEMS), help=f"subset of {','.join(SYSTEMS)}")
    p.add_argument("--rates", default="0.25,0.5,1,1.5,2", help="offered loads in requests/s")
    p.add_argument("--duration", type=float, default=40.0, help="arrival window per rate (s)")
    p.add_argument("--drain-timeout", type=float, default=30.0, help="wait after the last arrival (s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prefill-share", type=float, default=0.7, help="share of prefill-heavy requests")
    p.add_argument("--long-prompt", type=int, default=512, help="prompt tokens of a prefill-heavy request")
    p.add_argument("--long-output", type=int, default=8)
    p.add_argument("--short-prompt", type=int, default=64, help="prompt tokens of a decode-heavy request")
    p.add_argument("--short-output", type=int, default=128)
    p.add_argument("--ttft-slo", type=float, default=2.5, help="seconds")
    p.add_argument("--itl-slo", type=float, default=0.1, help="seconds, bound on a request's mean ITL")
    p.add_argument("--max-gap-slo", type=float, default=0.25,
                   help="seconds, bound on every token gap for the second goodput figure")
    p.add_argument("--kv-cache-mib", type=int, default=256, help="per engine (per core)")
    p.add_argument("--max-num-seqs", type=int, default=32)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--replot", action="store_true", help="only redraw goodput.png from goodput.json in --out")
    args = p.parse_args(argv)
    args.rates = [float(r) for r in args.rates.split(",")]
    args.systems = [s for s in args.systems.split(",") if s]
    unknown = set(args.systems) - set(SYSTEMS)
    if unknown:
        p.error(f"unknown systems {sorted(unknown)}; choose from {SYSTEMS}")
    if not (args.model / "config.json").exists():
        p.error(f"no model at {args.model}; run `tandem prepare-model` or pass --model PATH")
    args.model = args.model.resolve()
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.replot:
        plot(json.loads((args.out / "goodput.json").read_text()), args.out / "goodput.png")
        log(f"wrote {args.out / 'goodput.png'}")
        return 0
    gpu = on_gpu()
    args.dtype = engine_dtype(args.dtype, gpu, cpu_flags())  # one concrete dtype for every system
    mix = Mix(RequestKind("prefill-heavy", args.long_prompt, args.long_output),
              RequestKind("decode-heavy", args.short_prompt, args.short_output), args.prefill_share)
    slo = Objective(args.ttft_slo * 1000, args.itl_slo * 1000)
    strict = Objective(args.ttft_slo * 1000, args.itl_slo * 1000, args.max_gap_slo * 1000)
    result = {
        "benchmark": "goodput",
        "command": " ".join(["python -m loadtest.bench.goodput", *(argv if argv is not None else sys.argv[1:])]),
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                    "memory_gib": round(psutil.virtual_memory().total / (1 << 30), 1), "gpu": gpu},
        "model": args.model.name, "dtype": args.dtype,
        "engines": {"max_num_seqs": args.max_num_seqs, "max_num_batched_tokens": args.max_num_batched_tokens,
                    "kv_cache_mib_per_core": args.kv_cache_mib, "enforce_eager": True},
        "workload": {"prefill_share": args.prefill_share, "rates_rps": args.rates, "duration_s": args.duration,
                     "drain_timeout_s": args.drain_timeout, "seed": args.seed,
                     "kinds": {"prefill-heavy": [args.long_prompt, args.long_output],
                               "decode-heavy": [args.short_prompt, args.short_output]},
                     "api": "/v1/completions, streaming, random token-id prompts, ignore_eos"},
        "slo": {"ttft_s": args.ttft_slo, "itl_s": args.itl_slo, "itl_is": "per-request mean inter-token latency",
                "max_gap_s": args.max_gap_slo,
                "max_gap_is": "bound on every gap between streamed tokens, for the *_max_gap goodput only"},
        "systems": {},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "goodput.json"
    for system in args.systems:
        log(f"[goodput] === {system} ===")
        result["systems"][system] = run_system(system, args, mix, slo, strict, gpu)
        result["comparison"] = compare(result["systems"])
        path.write_text(json.dumps(result, indent=1))  # after each system: a crash keeps what ran
    plot(result, args.out / "goodput.png")
    log(json.dumps(result["comparison"], indent=2))
    for name, system in result["systems"].items():
        log(f"{name:10s} " + "  ".join(f"{r['rate_rps']}/s: {r['goodput_rps']} ({r['goodput_rps_max_gap']})"
                                       for r in system["rates"]))
    log(f"wrote {path} and {args.out / 'goodput.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
