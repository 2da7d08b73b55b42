"""Adapter-aware routing vs round-robin with two decode replicas and two LoRA adapters, on real
engines (issue 31's routing figure). Per mode, `tandem run` of the same config but for
`routing.picker` (the cluster started afresh, so each mode starts cold), then the same trace:
requests naming one of two adapters at random (seeded), each adapter's prompts sharing its own
system prompt, Poisson arrivals. Writes JSON and a plot.

    flock /tmp/tandem-cluster.lock .venv/bin/python -m loadtest.bench.lora_routing [--requests 40] [--rate 0.5]

Cluster: the interactive tier of the default config with one prefill engine (core 0) and two
decode engines (cores 1 and 0), `max_loras: 1` per engine, so an engine holds one adapter and
serving the other evicts it. Per mode, from Ray's metrics port (deltas over the trace):
- adapter hit rate of routing: of the LoRA requests sent to each pool, the share whose engine
  held the adapter when the gateway picked it (`tandem_lora_routes_total{affinity}`);
- adapter evictions per pool (`tandem_lora_evictions_total`: vLLM's adapter cache seen once a
  second, a lower bound);
- prompt tokens by source per pool (vLLM's `vllm:prompt_tokens_by_source`: computed, local
  prefix-cache hit, pulled over NIXL): where prompts found their adapter's prefix cached;
- TTFT p50/p90 client-side, and errors.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import httpx
import yaml

from cluster.models.lora import make_lora_adapter
from loadtest.bench.figures import pyplot, save
from loadtest.bench.tandem_run import TandemRun, machine, resolved_config
from loadtest.measure.percentiles import latency_summary
from loadtest.measure.prom import metric_by
from loadtest.measure.sse import stream_async

RESULTS = Path(__file__).resolve().parent / "results"
ADAPTERS = ("lora-a", "lora-b")
MODES = {"adapter-aware": "max_score", "round-robin": "round_robin"}
POOLS = ("prefill", "decode")


@dataclass(frozen=True)
class Request:
    at_s: float
    adapter: str
    prompt: tuple[int, ...]


def make_trace(requests: int, rate: float, prefix_tokens: int, seed: int) -> list[Request]:
    """Each adapter's own system prompt (random token ids, `prefix_tokens` long) + a unique 24-token turn."""
    rng = random.Random(seed)
    prefixes = {a: tuple(rng.randrange(1000, 40000) for _ in range(prefix_tokens)) for a in ADAPTERS}
    trace, at = [], 0.0
    for _ in range(requests):
        at += rng.expovariate(rate)
        adapter = rng.choice(ADAPTERS)
        trace.append(Request(round(at, 3), adapter, prefixes[adapter] + tuple(rng.randrange(1000, 40000) for _ in range(24))))
    return trace


def write_config(config: Path, folder: Path, adapters: dict[str, str], picker: str, metrics_port: int) -> tuple[Path, dict]:
    cfg = resolved_config(config)
    cfg["model"].update({"lora_adapters": adapters, "max_loras": 1, "max_lora_rank": 8})
    cfg["tiers"] = {"interactive": cfg["tiers"]["interactive"]}
    cfg["tiers"]["interactive"]["decode"].update({"replicas": 2, "num_cpus": 0.5, "cpu_binding": ["1", "0"]})
    cfg["tiers"]["interactive"]["decode"].pop("autoscaling", None)
    cfg["routing"] = {**cfg.get("routing", {}), "picker": picker}
    cfg.setdefault("ray", {})["metrics_export_port"] = metrics_port
    path = folder / f"lora-routing-{picker}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, cfg


def counters(cluster: TandemRun) -> dict[str, Any]:
    """The counters a mode is judged by, now (the caller takes deltas)."""
    text = httpx.get(cluster.metrics_url, timeout=30).text
    evictions = metric_by(text, "ray_tandem_lora_evictions_total", "pool")
    return {
        "routes": {pool: metric_by(text, "ray_tandem_lora_routes_total", "affinity", pool=pool) for pool in POOLS},
        "evictions": {pool: evictions.get(pool, 0.0) for pool in POOLS},
        "prompt_tokens": {pool: metric_by(text, "ray_vllm_prompt_tokens_by_source_total", "source", pool=pool)
                          for pool in POOLS},
    }


def delta(after: dict, before: dict) -> dict:
    if isinstance(after, dict):
        return {k: delta(v, before.get(k, 0.0) if isinstance(before, dict) else 0.0) for k, v in after.items()}
    return round(after - (before or 0.0), 1)


async def replay(url: str, trace: list[Request], max_tokens: int) -> list[dict]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(600, connect=30), limits=httpx.Limits(max_connections=256)) as client:
        start = time.perf_counter()

        async def one(r: Request) -> dict:
            await asyncio.sleep(max(0.0, start + r.at_s - time.perf_counter()))
            body = {"model": r.adapter, "prompt": list(r.prompt), "max_tokens": max_tokens, "temperature": 0,
                    "ignore_eos": True, "stream": True}
            record, _ = await stream_async(client, f"{url}/v1/completions", body, expect_tokens=max_tokens)
            return {"adapter": r.adapter, "ttft_ms": record.ttft_ms and round(record.ttft_ms, 1), "error": record.error or None}

        return await asyncio.gather(*(one(r) for r in trace))


async def run_mode(name: str, args: argparse.Namespace, folder: Path, adapters: dict[str, str],
                   trace: list[Request]) -> dict[str, Any]:
    config, cfg = write_config(args.config, folder, adapters, MODES[name], args.metrics_port)
    async with TandemRun(config, cfg, folder) as cluster:
        print(f"[lora-routing] {name}: cluster ready in {cluster.ready_s:.0f} s", flush=True)
        # One request per adapter first, as any service's first users: each engine loads an adapter.
        await replay(cluster.url, [Request(0.0, a, tuple(range(1000, 1032))) for a in ADAPTERS], args.max_tokens)
        await asyncio.sleep(3)  # Ray exports counters every few seconds
        before = await asyncio.to_thread(counters, cluster)
        t0 = time.monotonic()
        records = await replay(cluster.url, trace, args.max_tokens)
        trace_s = time.monotonic() - t0
        await asyncio.sleep(4)
        after = await asyncio.to_thread(counters, cluster)
    d = delta(after, before)
    hit_rate = {pool: (round(d["routes"][pool].get("held", 0) / sum(d["routes"][pool].values()), 3)
                       if sum(d["routes"][pool].values()) else None) for pool in POOLS}
    cached = {pool: (round(d["prompt_tokens"][pool].get("local_cache_hit", 0) / sum(d["prompt_tokens"][pool].values()), 3)
                     if sum(d["prompt_tokens"][pool].values()) else None) for pool in POOLS}
    ok = [r for r in records if not r["error"]]
    out = {"picker": MODES[name], "adapter_hit_rate": hit_rate, "routes": d["routes"], "evictions": d["evictions"],
           "prompt_tokens_by_source": d["prompt_tokens"], "prefix_cache_hit_share": cached,
           "ttft": latency_summary([r["ttft_ms"] for r in ok], digits=1), "errors": [r["error"] for r in records if r["error"]],
           "trace_s": round(trace_s, 1), "cold_start_s": round(cluster.ready_s or 0, 1)}
    print(f"[lora-routing] {name}: adapter hit rate {hit_rate}, evictions {d['evictions']}, prefix-cache hit share "
          f"{cached}, TTFT {out['ttft']}, {len(out['errors'])} errors", flush=True)
    return out


def plot(result: dict[str, Any], path: Path) -> Optional[Path]:
    plt = pyplot()
    if plt is None:
        return None
    modes = list(result["modes"])
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(12, 4))
    for i, pool in enumerate(POOLS):
        ax1.bar([x + 0.4 * i for x in range(len(modes))],
                [100 * (result["modes"][m]["adapter_hit_rate"][pool] or 0) for m in modes], 0.4, label=pool)
        ax2.bar([x + 0.4 * i for x in range(len(modes))], [result["modes"][m]["evictions"][pool] for m in modes], 0.4,
                label=pool)
    for ax, label in ((ax1, "engine held the adapter when picked (%)"), (ax2, "adapters evicted (lower bound)")):
        ax.set_xticks([x + 0.2 for x in range(len(modes))], modes)
        ax.set_ylabel(label)
        ax.legend(fontsize=8)
    x = range(len(modes))
    ax3.bar([i - 0.2 for i in x], [result["modes"][m]["ttft"].get("p50_ms", 0) for m in modes], 0.4, label="p50")
    ax3.bar([i + 0.2 for i in x], [result["modes"][m]["ttft"].get("p90_ms", 0) for m in modes], 0.4, label="p90")
    ax3.set_xticks(list(x), modes)
    ax3.set_ylabel("TTFT (ms, client-side)")
    ax3.legend(fontsize=8)
    w = result["workload"]
    fig.suptitle(f"{result['model']}: 1 prefill + 2 decode engines, max_loras 1, 2 adapters at random, "
                 f"{w['requests']} requests at {w['rate_per_s']}/s", fontsize=10)
    return save(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=Path("cluster/configs/local.yaml"))
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--rate", type=float, default=0.5, help="Poisson arrivals per second")
    parser.add_argument("--prefix-tokens", type=int, default=300, help="each adapter's shared system prompt")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--metrics-port", type=int, default=18083)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / f"lora_routing-{time.strftime('%Y-%m-%d')}.json")
    args = parser.parse_args(argv)
    model_path = Path(resolved_config(args.config)["model"]["path"])
    adapters = {name: str(make_lora_adapter(model_path, model_path.parent / f"{model_path.name}-{name}", seed=i + 1))
                for i, name in enumerate(ADAPTERS)}
    trace = make_trace(args.requests, args.rate, args.prefix_tokens, args.seed)
    modes = {}
    with tempfile.TemporaryDirectory(prefix="tandem-lora-routing-") as tmp:
        for name in args.modes.split(","):
            folder = Path(tmp) / name
            folder.mkdir()
            modes[name] = asyncio.run(run_mode(name, args, folder, adapters, trace))
    result = {
        "benchmark": "lora_routing", "command": " ".join(["python -m loadtest.bench.lora_routing", *sys.argv[1:]]),
        "machine": machine(), "config": str(args.config), "model": model_path.name,
        "cluster": {"prefill_engines": 1, "decode_engines": 2, "max_loras": 1, "adapters": list(ADAPTERS),
                    "adapter": "seeded random rank-8 q/k/v/o (cluster/models/lora.py)"},
        "workload": {"requests": args.requests, "rate_per_s": args.rate, "arrivals": "Poisson", "seed": args.seed,
                     "adapter_choice": "uniform at random per request", "prefix_tokens": args.prefix_tokens,
                     "unique_tokens": 24, "max_tokens": args.max_tokens,
                     "api": "/v1/completions, model = the adapter, token-id prompts, streaming, greedy"},
        "modes": modes,
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    plot(result, args.out.with_suffix(".png"))
    print(f"[lora-routing] {args.out}", flush=True)
    return 0 if all(not m["errors"] for m in modes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
