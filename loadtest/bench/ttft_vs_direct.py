"""Cluster overhead: TTFT and ITL at concurrency 1 through tandem (gateway, router, prefill
hop, KV transfer, decode) against the same model served by one vLLM engine directly, for a
short prompt (small KV transfer) and a long one, side by side in one run; plus cold start
to ready, memory per engine and the share of TTFT spent in the KV transfer. Writes JSON.

    flock /tmp/tandem-cluster.lock .venv/bin/python -m loadtest.bench.ttft_vs_direct [--config FILE] [--requests 20]

Both sides get the same model, dtype, KV cache size and one CPU core per engine (the direct
engine is bound to the core the prefill engine uses); only the config's default tier is
started, so no idle engine of another tier shares the cores. Prompts are random token ids,
distinct per request, so nothing is served from a prefix cache; streaming /v1/completions
with ignore_eos and a fixed max_tokens. TTFT: request sent → first streamed token; ITL: a
request's mean inter-token latency. The KV transfer time is vLLM's own NIXL transfer-duration
histogram on the decode engine (EngineStats.kv_transfer_seconds), averaged per request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import sys
import time
from pathlib import Path

import psutil

from loadtest.bench.engines import DirectEngines, DirectEngineSpec
from loadtest.bench.loadgen import stream_one
from loadtest.bench.workload import ScheduledRequest
from loadtest.measure.percentiles import latency_summary
from cluster.config import ClusterConfig
from cluster.hardware import cpu_flags, engine_dtype

RESULTS = Path(__file__).resolve().parent / "results"
BENCH_ADAPTER = "bench-lora"  # --adapter's name
DIRECT_PORT = 8100


def prompts(name: str, tokens: int, n: int, seed: int) -> list[tuple[int, ...]]:
    rng = random.Random(f"{seed}:{name}")
    return [tuple(rng.randrange(1000, 40000) for _ in range(tokens)) for _ in range(n)]


def measure(url: str, model: str, name: str, batch: list[tuple[int, ...]], max_tokens: int, warmup: int) -> dict:
    """Requests one at a time; the first `warmup` are not counted."""
    async def run() -> list:
        import httpx

        out = []
        async with httpx.AsyncClient(timeout=300) as client:
            for i, prompt in enumerate(batch):
                rec = await stream_one(client, url, model, ScheduledRequest(i, 0.0, name, prompt, max_tokens))
                if rec.error:
                    raise RuntimeError(f"{name} request {i} failed: {rec.error}")
                print(f"  {name} {'warmup' if i < warmup else 'request'} {i + 1}/{len(batch)}: "
                      f"TTFT {rec.ttft_ms:.1f} ms, ITL {rec.mean_itl_ms:.1f} ms", flush=True)
                if i >= warmup:
                    out.append(rec)
        return out

    records = asyncio.run(run())
    ttft = [r.ttft_ms for r in records]
    itl = [r.mean_itl_ms for r in records]
    return {"ttft": latency_summary(ttft, digits=2), "itl": latency_summary(itl, digits=2),
            "ttft_ms": [round(v, 2) for v in ttft]}


def tree_pss_mib(root: psutil.Process) -> float:
    total = 0
    for proc in [root, *root.children(recursive=True)]:
        try:
            total += proc.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total / (1 << 20)


def replica_memory_mib() -> dict[str, float]:
    """PSS of each Serve engine replica with its EngineCore and worker children."""
    out = {}
    for proc in psutil.process_iter(["cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if cmd.startswith("ray::ServeReplica:tandem:") and ("prefill" in cmd or "decode" in cmd):
            out[cmd.split("ServeReplica:tandem:")[1].split()[0]] = round(tree_pss_mib(proc), 1)
    return out


def decode_stats(cfg: ClusterConfig):
    from ray import serve

    from cluster.types import APP_NAME, PoolId

    handle = serve.get_deployment_handle(PoolId(cfg.default_tier, "decode").deployment_name, app_name=APP_NAME)
    return handle.stats.remote().result()


def run_cluster(cfg: ClusterConfig, cases: dict, args) -> dict:
    from cluster.local import LocalCluster

    cluster = LocalCluster(cfg)
    t0 = time.monotonic()
    cluster.start()
    out = {}
    try:
        out["cold_start_to_ready_s"] = round(time.monotonic() - t0, 1)
        out["memory_pss_mib"] = replica_memory_mib()
        for name, (batch, model) in cases.items():
            print(f"[bench] tandem cluster, {name} prompt ({len(batch[0])} tokens, model {model})", flush=True)
            measure(cluster.url, model, name, batch[:args.warmup], args.max_tokens, args.warmup)
            time.sleep(1)  # the warm-up's transfer stats reach the engine's metrics
            before = decode_stats(cfg)
            result = measure(cluster.url, model, name, batch[args.warmup:], args.max_tokens, 0)
            time.sleep(1)
            after = decode_stats(cfg)
            transfers = after.kv_transfers - before.kv_transfers
            seconds = after.kv_transfer_seconds - before.kv_transfer_seconds
            kv_bytes = after.kv_bytes_transferred - before.kv_bytes_transferred
            # Per request (concurrency 1: transfers never overlap), whatever the number of
            # NIXL transfers vLLM splits one request's KV into.
            n = args.requests
            result["kv_transfer"] = {
                "transfers": transfers,
                "mean_ms": round(seconds / n * 1000, 2) if transfers else None,
                "mean_bytes": round(kv_bytes / n) if transfers else None,
                "failed": after.kv_failed_transfers - before.kv_failed_transfers,
            }
            out[name] = result
    finally:
        cluster.stop()
    return out


def run_direct(cfg: ClusterConfig, cases: dict, args) -> dict:
    spec = DirectEngineSpec.like_tandem(cfg, DIRECT_PORT)
    out = {}
    with DirectEngines([spec]) as engines:
        out["cold_start_to_ready_s"] = round(engines.cold_start_s, 1)
        out["memory_pss_mib"] = round(tree_pss_mib(psutil.Process(engines.procs[0].pid)), 1)
        for name, (batch, model) in cases.items():
            print(f"[bench] direct engine, {name} prompt ({len(batch[0])} tokens, model {model})", flush=True)
            out[name] = measure(spec.url, model, name, batch, args.max_tokens, args.warmup)
    return out


def overhead(tandem: dict, direct: dict) -> dict:
    over = round(tandem["ttft"]["p50_ms"] - direct["ttft"]["p50_ms"], 2)
    transfer = tandem["kv_transfer"]["mean_ms"]
    beyond = round(over - transfer, 2) if transfer is not None else None
    return {"ttft_p50_overhead_ms": over,
            "ttft_p50_ratio_tandem_over_direct": round(tandem["ttft"]["p50_ms"] / direct["ttft"]["p50_ms"], 3),
            "kv_transfer_mean_ms": transfer,
            "kv_transfer_share_of_ttft_p50": round(transfer / tandem["ttft"]["p50_ms"], 4) if transfer else None,
            "ttft_p50_overhead_beyond_transfer_ms": beyond,
            "itl_p50_overhead_ms": round(tandem["itl"]["p50_ms"] - direct["itl"]["p50_ms"], 2),
            "target": "TTFT p50 overhead <= 5 ms beyond the KV transfer",
            "target_met": beyond is not None and beyond <= 5.0}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=Path(__file__).resolve().parents[2] / "cluster" / "configs" / "local.yaml")
    parser.add_argument("--requests", type=int, default=20, help="measured requests per prompt length and side")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--short-prompt", type=int, default=128, help="tokens")
    parser.add_argument("--long-prompt", type=int, default=1500, help="tokens")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--adapter", action="store_true",
                        help="also measure each prompt through a LoRA adapter (seeded, rank 8, written for the model) "
                             "on both sides: the adapter's cost beside the base model's")
    args = parser.parse_args()
    full = ClusterConfig.load(args.config)
    tier = full.tiers[full.default_tier]
    # dtype auto is decided per host (cluster/hardware.py); decide it once here, so the direct
    # engine gets the very dtype tandem's engines get.
    dtype = engine_dtype(full.model.dtype, tier.prefill.num_gpus > 0, cpu_flags())
    cfg = full.model_copy(update={"tiers": {full.default_tier: tier},
                                  "model": full.model.model_copy(update={"dtype": dtype})})
    n = args.warmup + args.requests
    base = cfg.model.served_name
    cases = {"short": (prompts("short", args.short_prompt, n, args.seed), base),
             "long": (prompts("long", args.long_prompt, n, args.seed), base)}
    if args.adapter:
        from cluster.models.lora import make_lora_adapter

        path = make_lora_adapter(cfg.model.path, cfg.model.path.parent / f"{base}-lora-bench", seed=0, rank=8)
        cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={
            "lora_adapters": {BENCH_ADAPTER: str(path)}, "max_loras": 1, "max_lora_rank": 8})})
        for name in ("short", "long"):  # their own prompts: nothing from the base runs' prefix cache
            cases[f"{name}-lora"] = (prompts(f"{name}-lora", len(cases[name][0][0]), n, args.seed), BENCH_ADAPTER)

    tandem = run_cluster(cfg, cases, args)
    direct = run_direct(cfg, cases, args)
    result = {
        "benchmark": "ttft_vs_direct",
        "command": " ".join(["python -m loadtest.bench.ttft_vs_direct", *sys.argv[1:]]),
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                    "memory_gib": round(psutil.virtual_memory().total / (1 << 30), 1)},
        "model": cfg.model.served_name, "dtype": cfg.model.dtype,
        "workload": {"prompts_tokens": {"short": args.short_prompt, "long": args.long_prompt},
                     "max_tokens": args.max_tokens, "concurrency": 1, "requests": args.requests,
                     "api": "/v1/completions, streaming, random token-id prompts, ignore_eos"},
        "tandem": tandem, "direct_vllm": direct,
        "overhead": {name: overhead(tandem[name], direct[name]) for name in cases},
    }
    if args.adapter:  # the adapter's TTFT and ITL over the base model's, per side
        result["adapter_cost"] = {
            side: {name: {"ttft_p50_ratio": round(res[f"{name}-lora"]["ttft"]["p50_ms"] / res[name]["ttft"]["p50_ms"], 3),
                          "itl_p50_ratio": round(res[f"{name}-lora"]["itl"]["p50_ms"] / res[name]["itl"]["p50_ms"], 3)}
                   for name in ("short", "long")}
            for side, res in (("tandem", tandem), ("direct_vllm", direct))}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / ("ttft_vs_direct-lora.json" if args.adapter else "ttft_vs_direct.json")
    path.write_text(json.dumps(result, indent=2))
    print(json.dumps({k: result[k] for k in ("overhead", "adapter_cost") if k in result}, indent=2))
    for side, res in (("tandem", tandem), ("direct", direct)):
        print(f"{side}: " + ", ".join(f"{name} TTFT p50 {res[name]['ttft']['p50_ms']} ms ITL p50 "
                                       f"{res[name]['itl']['p50_ms']} ms" for name in cases)
              + f"; cold start {res['cold_start_to_ready_s']} s, memory {res['memory_pss_mib']} MiB")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
