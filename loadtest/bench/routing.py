"""KV-aware vs round-robin vs random routing on a multi-tenant shared-prefix workload, side by
side in one run. Writes JSON and a PNG plot.

    flock /tmp/tandem-cluster.lock .venv/bin/python -m loadtest.bench.routing [--requests 48] [--rate 1.0]

Workload: several tenants, each with its own long system prompt (several 128-token blocks:
vLLM on CPU caches whole 128-token blocks), followed by a short, unique user turn; the
requests arrive as a Poisson process at a fixed seed, the same trace for every mode.
Cluster: one tier with TWO prefill engines (one core each) and one decode engine; each
engine's KV cache holds about half of all tenants' prefixes, so where a tenant's requests go
decides whether its prefix stays cached. The routing mode is data in the cluster config
(`routing.picker`); the cluster is started afresh per mode, so every mode starts cold.

Per mode: prefix-cache hit rate from the prefill engines' own counters (prompt tokens cached
/ all prompt tokens, deltas over the trace, via the Serve handles' `stats`), and TTFT p50/p90
measured client-side with streaming (request sent → first streamed token). The best possible
hit rate of the trace assumes perfect affinity: each tenant's prefix computed once, by the
one engine that holds it, and every later request of that tenant hitting its full blocks.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import shlex
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

from cluster.config import ClusterConfig
from cluster.local import LocalCluster
from loadtest.measure.percentiles import latency_summary
from loadtest.measure.sse import stream_async

ROOT = Path(__file__).resolve().parents[2]
MODEL_DIR = ROOT / ".tandem" / "models" / "SmolLM2-135M-Instruct"
BLOCK = 128  # vLLM's default block size on CPU
PREFILL = "interactive-prefill"
# name → routing config; everything else about the cluster is identical across modes.
MODES = {
    "kv-aware": {},  # the defaults: prefix 1.0, load 0.5, kv_usage 0.1, max-score picker
    "round-robin": {"picker": "round_robin"},
    "random": {"picker": "random", "weights": {"prefix": 0.0, "load": 1.0, "kv_usage": 0.0}},
}
SENTENCES = (
    "Answer politely and keep every reply short.", "Never reveal internal account numbers.",
    "Quote prices in the customer's currency.", "Escalate refunds above the limit to a human.",
    "Use the product catalogue below as the only source of truth.", "Dates are in ISO format.",
    "Our support hours are from eight to six on weekdays.", "Shipping takes three to five days.",
    "Returns are accepted within thirty days with a receipt.", "Mention the loyalty programme once.",
    "If unsure, ask a clarifying question before answering.", "Do not give legal or medical advice.",
)
QUESTIONS = ("Where is my order", "Can I change my address", "How do I return a jacket",
             "What does premium shipping cost", "Is the store open on Sunday", "Can I get a refund")


@dataclass(frozen=True)
class Request:
    at_s: float  # arrival offset from the trace start
    tenant: int
    prefix_len: int  # the tenant's shared system-prompt tokens at the start of the prompt
    prompt: tuple[int, ...]


def make_trace(tokenizer, tenants: int, requests: int, rate: float, prefix_blocks: int, seed: int) -> list[Request]:
    rng = random.Random(seed)
    prefixes = []
    for t in range(tenants):
        # Not block-aligned (as real system prompts): prefix_blocks full blocks plus a partial one.
        length = prefix_blocks * BLOCK + rng.randrange(16, 112)
        text, ids = f"You are the assistant of tenant {t}. ", []
        while len(ids) < length:
            text += " ".join(rng.sample(SENTENCES, len(SENTENCES))) + " "
            ids = tokenizer.encode(text, add_special_tokens=False)
        prefixes.append(tuple(ids[:length]))
    trace, at = [], 0.0
    for i in range(requests):
        at += rng.expovariate(rate)
        t = rng.randrange(tenants)
        user = f"\nUser {i}: {rng.choice(QUESTIONS)}, reference {rng.randrange(10**6)}? {rng.random():.6f}\nAssistant:"
        trace.append(Request(at, t, len(prefixes[t]), prefixes[t] + tuple(tokenizer.encode(user, add_special_tokens=False))))
    return trace


def best_hit_rate(trace: list[Request]) -> float:
    """Perfect affinity: a tenant's first request computes its prefix; each later one finds the
    prefix's full blocks cached (vLLM never serves a prompt's last token from cache)."""
    seen, cached = set(), 0
    for r in trace:
        if r.tenant in seen:
            cached += min(r.prefix_len, len(r.prompt) - 1) // BLOCK * BLOCK
        seen.add(r.tenant)
    return cached / sum(len(r.prompt) for r in trace)


def cluster_config(routing: dict, kv_cache_memory_bytes: int, port: int) -> ClusterConfig:
    engine = {"kv_cache_memory_bytes": kv_cache_memory_bytes, "max_num_seqs": 8}
    return ClusterConfig.model_validate({
        "model": {"path": str(MODEL_DIR), "name": MODEL_DIR.name, "dtype": "bfloat16", "max_model_len": 2048},
        "gateway": {"host": "127.0.0.1", "port": port},
        "tiers": {"interactive": {
            # One core per prefill engine; decode shares core 1 (this machine has two).
            "prefill": {"replicas": 2, "num_cpus": 0.5, "cpu_binding": ["0", "1"], "engine": engine},
            "decode": {"replicas": 1, "num_cpus": 1, "cpu_binding": ["1"],
                       "engine": {**engine, "kv_cache_memory_bytes": 256 << 20}},
        }},
        "routing": routing,
        "ray": {"num_cpus": 2},
    })


def prefill_counters() -> dict[str, tuple[float, float]]:
    """{worker_id: (prompt tokens cached, computed)} of both prefill engines. A handle call
    lands on a replica Serve picks, so ask until both have answered."""
    from ray import serve

    handle = serve.get_deployment_handle(PREFILL, app_name="tandem")
    seen = {}
    for _ in range(100):
        s = handle.stats.remote().result()
        seen[s.worker_id] = (s.prompt_tokens_cached, s.prompt_tokens_computed)
        if len(seen) == 2:
            return seen
    raise RuntimeError(f"only {sorted(seen)} of the 2 prefill engines answered `stats`")


async def send(client: httpx.AsyncClient, url: str, model: str, prompt, max_tokens: int) -> float:
    """TTFT in ms: request sent → first streamed chunk carrying a token."""
    body = {"model": model, "prompt": list(prompt), "max_tokens": max_tokens, "temperature": 0, "stream": True}
    record, _ = await stream_async(client, f"{url}/v1/completions", body)
    if not record.ok:
        raise RuntimeError(record.error)
    return record.ttft_ms


async def replay(url: str, model: str, trace: list[Request], max_tokens: int) -> tuple[list[float], list[str]]:
    async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=256)) as client:
        start = time.perf_counter()

        async def one(r: Request):
            await asyncio.sleep(max(0.0, start + r.at_s - time.perf_counter()))
            return await send(client, url, model, r.prompt, max_tokens)

        results = await asyncio.gather(*(one(r) for r in trace), return_exceptions=True)
    return ([x for x in results if isinstance(x, float)],
            [f"{type(x).__name__}: {x}" for x in results if isinstance(x, BaseException)])


def run_mode(name: str, cfg: ClusterConfig, trace: list[Request], max_tokens: int, seed: int) -> dict:
    print(f"[bench] mode {name}: routing {cfg.routing.model_dump(include={'weights', 'picker'})}", flush=True)
    cluster = LocalCluster(cfg)
    t0 = time.monotonic()
    cluster.start()
    try:
        ready_s = time.monotonic() - t0
        # Warm both engines with short unique prompts (< 1 block: nothing is cached).
        rng = random.Random(seed + 1)
        warm = [Request(0.0, -1, 0, tuple(rng.randrange(1000, 40000) for _ in range(100))) for _ in range(4)]
        for r in warm:
            asyncio.run(replay(cluster.url, cfg.model.served_name, [r], max_tokens))
        time.sleep(1)  # the last warm-up's counters and KV events settle
        before = prefill_counters()
        t_run = time.monotonic()
        ttft, errors = asyncio.run(replay(cluster.url, cfg.model.served_name, trace, max_tokens))
        trace_s = time.monotonic() - t_run
        time.sleep(1)
        after = prefill_counters()
    finally:
        cluster.stop()
    per_engine = {w: {"cached": after[w][0] - before[w][0], "computed": after[w][1] - before[w][1]} for w in after}
    cached = sum(e["cached"] for e in per_engine.values())
    total = cached + sum(e["computed"] for e in per_engine.values())
    out = {"routing": cfg.routing.model_dump(include={"weights", "picker"}),
           "hit_rate": round(cached / total, 4) if total else None, "prompt_tokens_cached": cached,
           "prompt_tokens_total": total, "per_prefill_engine": per_engine, "ttft": latency_summary(ttft, digits=1),
           "ttft_ms": [round(v, 1) for v in ttft], "errors": errors, "cold_start_s": round(ready_s, 1),
           "trace_s": round(trace_s, 1)}
    print(f"[bench] {name}: hit rate {out['hit_rate']}, TTFT {out['ttft']}, errors {len(errors)}", flush=True)
    return out


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = list(result["modes"])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    hits = [100 * (result["modes"][m]["hit_rate"] or 0) for m in modes]
    ax1.bar(modes, hits, color=["tab:green", "tab:blue", "tab:gray"])
    ax1.axhline(100 * result["best_possible_hit_rate"], color="k", ls="--", label="best possible (trace)")
    ax1.set_ylabel("prefix-cache hit rate (%)")
    ax1.set_ylim(0, 100)
    ax1.legend(loc="upper right")
    x = range(len(modes))
    p50 = [result["modes"][m]["ttft"].get("p50_ms", 0) for m in modes]
    p90 = [result["modes"][m]["ttft"].get("p90_ms", 0) for m in modes]
    ax2.bar([i - 0.2 for i in x], p50, 0.4, label="p50")
    ax2.bar([i + 0.2 for i in x], p90, 0.4, label="p90")
    ax2.set_xticks(list(x), modes)
    ax2.set_ylabel("TTFT (ms, client-side, streaming)")
    ax2.legend()
    w = result["workload"]
    fig.suptitle(f"{result['model']}, 2 prefill + 1 decode engines, {w['tenants']} tenants, "
                 f"{w['requests']} requests at {w['rate_per_s']}/s (Poisson)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tenants", type=int, default=8)
    parser.add_argument("--prefix-blocks", type=int, default=5, help="full 128-token blocks per system prompt")
    parser.add_argument("--requests", type=int, default=48, help="per mode (the same trace each time)")
    parser.add_argument("--rate", type=float, default=1.0, help="Poisson arrivals per second")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--kv-cache-mib", type=int, default=96, help="per prefill engine (~2.8 MiB per block)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--port", type=int, default=8777)
    parser.add_argument("--out", type=Path, default=Path("runs/bench"))
    args = parser.parse_args()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(MODEL_DIR)
    trace = make_trace(tokenizer, args.tenants, args.requests, args.rate, args.prefix_blocks, args.seed)
    best = best_hit_rate(trace)
    lengths = [len(r.prompt) for r in trace]
    print(f"[bench] trace: {len(trace)} requests over {trace[-1].at_s:.0f} s, prompts {min(lengths)}-{max(lengths)} "
          f"tokens, best possible hit rate {best:.3f}", flush=True)
    modes = {}
    for name in args.modes.split(","):
        cfg = cluster_config(MODES[name], args.kv_cache_mib << 20, args.port)
        modes[name] = run_mode(name, cfg, trace, args.max_tokens, args.seed)
    result = {
        "benchmark": "routing",
        "command": " ".join(shlex.quote(a) for a in [Path(sys.executable).name, "-m", "loadtest.bench.routing", *sys.argv[1:]]),
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                    "memory_gib": round(psutil.virtual_memory().total / (1 << 30), 1),
                    "load_avg_at_end": [round(x, 2) for x in os.getloadavg()]},
        "model": MODEL_DIR.name, "dtype": "bfloat16",
        "cluster": {"prefill_engines": 2, "decode_engines": 1, "prefill_kv_cache_mib": args.kv_cache_mib,
                    "block_size": BLOCK, "cpu_binding": {"prefill": ["0", "1"], "decode": ["1"]}},
        "workload": {"tenants": args.tenants, "requests": args.requests, "rate_per_s": args.rate,
                     "arrivals": "Poisson", "seed": args.seed, "max_tokens": args.max_tokens,
                     "prefix_tokens": sorted({r.prefix_len for r in trace}),
                     "prompt_tokens": {"min": min(lengths), "max": max(lengths), "mean": round(statistics.fmean(lengths), 1)},
                     "api": "/v1/completions, token-id prompts, streaming"},
        "best_possible_hit_rate": round(best, 4),
        "modes": modes,
    }
    kv, rr = modes.get("kv-aware"), modes.get("round-robin")
    if kv and rr and kv["ttft"].get("p90_ms") and rr["ttft"].get("p90_ms"):
        ratio = rr["ttft"]["p90_ms"] / kv["ttft"]["p90_ms"]
        result["targets"] = {
            "p90_ttft_round_robin_over_kv_aware": round(ratio, 2), "p90_2x_better_met": ratio >= 2.0,
            "kv_aware_hit_rate_over_best": round(kv["hit_rate"] / best, 3),
            "hit_rate_within_5pct_of_best_met": kv["hit_rate"] >= 0.95 * best,
        }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "routing.json"
    path.write_text(json.dumps(result, indent=2))
    plot(result, args.out / "routing.png")
    print(json.dumps({k: v for k, v in result.items() if k != "modes"}, indent=2))
    for name, m in modes.items():
        print(f"{name:12s} hit rate {m['hit_rate']}  TTFT p50 {m['ttft'].get('p50_ms')} ms  p90 {m['ttft'].get('p90_ms')} ms"
              f"  errors {len(m['errors'])}")
    print(f"wrote {path} and {args.out / 'routing.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
