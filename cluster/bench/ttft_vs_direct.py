"""TTFT through the tandem cluster against the same model served by one vLLM engine directly,
side by side in one run, plus cold start to ready and memory per engine. Writes JSON.

    python -m cluster.bench.ttft_vs_direct [--config FILE] [--requests 30] [--out runs/bench]

Both sides get the same model, dtype, KV cache size and one CPU core per engine (the direct
engine is bound to the core the prefill engine uses). Each request gets a distinct prefix so
no prompt is served from a prefix cache; TTFT is measured from the request to the first
streamed content chunk at concurrency 1.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

from cluster.bench.stats import latency_summary
from cluster.config import ClusterConfig
from cluster.local import LocalCluster

DIRECT_PORT = 8100
BODY_TEXT = (
    "Summarize the following notes about running language models in production. "
    "Prefill is compute-bound, decode is bandwidth-bound, and mixing them on one engine makes "
    "each wait for the other. Disaggregation moves the finished KV cache between pools. "
) * 4


def measure_ttft(url: str, model: str, n: int, warmup: int = 3) -> list[float]:
    ttfts = []
    with httpx.Client(timeout=120) as client:
        for i in range(warmup + n):
            body = {"model": model, "max_tokens": 16, "temperature": 0, "stream": True,
                    "messages": [{"role": "user", "content": f"Request {i} of a benchmark. {BODY_TEXT}"}]}
            t0 = time.perf_counter()
            with client.stream("POST", f"{url}/v1/chat/completions", json=body) as resp:
                resp.raise_for_status()
                first = None
                for line in resp.iter_lines():
                    if first is None and line.startswith("data: {") and '"content"' in line:
                        first = time.perf_counter() - t0
            if i >= warmup:
                ttfts.append(first * 1000)
            print(f"  {'warmup' if i < warmup else 'request'} {i + 1}/{warmup + n}: TTFT {first * 1000:.1f} ms",
                  flush=True)
    return ttfts


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


def run_cluster(cfg: ClusterConfig, n: int) -> dict:
    cluster = LocalCluster(cfg)
    t0 = time.monotonic()
    cluster.start()
    cold_start = time.monotonic() - t0
    try:
        memory = replica_memory_mib()
        print("[bench] tandem cluster TTFT", flush=True)
        ttft = measure_ttft(cluster.url, cfg.model.served_name, n)
    finally:
        cluster.stop()
    return {"cold_start_to_ready_s": round(cold_start, 1), "memory_pss_mib": memory, "ttft": latency_summary(ttft),
            "ttft_ms": [round(v, 2) for v in ttft]}


def run_direct(cfg: ClusterConfig, n: int) -> dict:
    tier = cfg.tiers[cfg.default_tier]
    env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND=(tier.prefill.cpu_binding or ("0",))[0],
               VLLM_ENABLE_V1_MULTIPROCESSING="1")
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(cfg.model.path),
           "--served-model-name", cfg.model.served_name, "--dtype", cfg.model.dtype,
           "--max-model-len", str(cfg.model.max_model_len),
           "--kv-cache-memory-bytes", str(tier.prefill.engine.kv_cache_bytes),
           "--host", "127.0.0.1", "--port", str(DIRECT_PORT), "--enforce-eager"]
    print(f"[bench] starting one vLLM engine directly: {' '.join(cmd[2:4])} ...", flush=True)
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{DIRECT_PORT}"
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vLLM api_server exited with {proc.returncode}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        cold_start = time.monotonic() - t0
        memory = round(tree_pss_mib(psutil.Process(proc.pid)), 1)
        print("[bench] direct engine TTFT", flush=True)
        ttft = measure_ttft(url, cfg.model.served_name, n)
    finally:
        proc.terminate()
        proc.wait(60)
    return {"cold_start_to_ready_s": round(cold_start, 1), "memory_pss_mib": memory, "ttft": latency_summary(ttft),
            "ttft_ms": [round(v, 2) for v in ttft]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=Path(__file__).resolve().parents[1] / "configs" / "local.yaml")
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--out", type=Path, default=Path("runs/bench"))
    args = parser.parse_args()
    cfg = ClusterConfig.load(args.config)

    tandem = run_cluster(cfg, args.requests)
    direct = run_direct(cfg, args.requests)
    result = {
        "benchmark": "ttft_vs_direct",
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                    "memory_gib": round(psutil.virtual_memory().total / (1 << 30), 1)},
        "model": cfg.model.served_name, "dtype": cfg.model.dtype,
        "workload": {"prompt": "chat, ~190 prompt tokens, distinct prefix per request", "max_tokens": 16,
                     "concurrency": 1, "requests": args.requests},
        "tandem": tandem, "direct_vllm": direct,
        "ttft_p50_ratio_tandem_over_direct": round(tandem["ttft"]["p50_ms"] / direct["ttft"]["p50_ms"], 3),
        "ttft_p50_overhead_ms": round(tandem["ttft"]["p50_ms"] - direct["ttft"]["p50_ms"], 2),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "ttft_vs_direct.json"
    path.write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k not in ("tandem", "direct_vllm")}, indent=2))
    print(f"tandem: TTFT p50 {tandem['ttft']['p50_ms']} ms, cold start {tandem['cold_start_to_ready_s']} s, "
          f"memory {tandem['memory_pss_mib']} MiB")
    print(f"direct: TTFT p50 {direct['ttft']['p50_ms']} ms, cold start {direct['cold_start_to_ready_s']} s, "
          f"memory {direct['memory_pss_mib']} MiB")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
