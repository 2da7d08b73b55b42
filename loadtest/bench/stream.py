"""Stream smoothness, first token, gateway responsiveness and CPU per token: tandem (`make
run`'s cluster, the default config) against one direct vLLM api_server on the same model,
dtype and core, interleaved batch by batch. Writes JSON and a PNG plot (issue 14).

    flock /tmp/tandem-cluster.lock .venv/bin/python -m loadtest.bench.stream [--config FILE] [--batches 1:6,4:3]
    .venv/bin/python -m loadtest.bench.stream --replot runs/bench/stream.json

tandem is started as `tandem run --config FILE` (a child process, as a user starts it; its
"ready in N s" line is the readiness figure); the direct server as in loadtest/bench/engines.py,
bound to the core of the default tier's prefill engine, with its KV cache and max_num_seqs,
and the dtype tandem picks on this host. Cells: a ~60-token and a ~1,000-token chat prompt
(random words, distinct per request, so nothing is served from a prefix cache) at
concurrency 1 and 4: a batch is `concurrency` streams sent at once, streaming
/v1/chat/completions with ignore_eos, a fixed max_tokens and return_token_ids. Batches
alternate tandem, direct, direct, tandem, ..., so only one system is under load at a time.

Per system and cell: TTFT (sent → first token), token gaps (between successive tokens of one
stream, client-side arrival times; tokens of one SSE chunk arrive together), ITL (a stream's
mean gap), GET /v1/models latency from a poller running while the batch streams, and CPU
seconds per streamed token by process kind (loadtest/bench/procs.py; psutil, before and after
each batch). Also: each system's first request after start, and both idle.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import signal
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import httpx
import psutil

from loadtest.bench import procs
from loadtest.bench.engines import ROOT, DirectEngines, DirectEngineSpec, TandemRun
from loadtest.bench.stream_report import SYSTEMS, SystemCell, cpu_table, figures_table, plot, summarize, targets, targets_table
from loadtest.measure.percentiles import latency_summary
from loadtest.measure.record import RequestRecord
from loadtest.measure.sse import stream_async

DEFAULT_CONFIG = ROOT / "cluster" / "configs" / "local.yaml"
DIRECT_PORT = 8100


def log(line: str) -> None:
    print(line, flush=True)


# ---------------------------------------------------------------- prompts

def make_prompts(tokenizer_path: Path, targets_tokens: dict[str, int], n: int, seed: int) -> dict[str, list[list[dict]]]:
    """`n` chat conversations per prompt kind, each of about its target token count once
    templated. Words are whole-word tokens of the model's vocabulary, drawn at random, so a
    word is usually one token and no two prompts share a prefix beyond the template's first
    few tokens."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_path))
    words = sorted(w[1:] for w in tok.get_vocab() if w.startswith("Ġ") and len(w) >= 5 and w[1:].isascii()
                   and w[1:].isalpha() and w[1:].islower())

    def count(messages: list[dict]) -> int:
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return len(tok(text, add_special_tokens=False)["input_ids"])

    out = {}
    for name, target in targets_tokens.items():
        rng = random.Random(f"{seed}:{name}")
        convs = []
        for _ in range(n):
            system = " ".join(rng.choice(words) for _ in range(6))
            pool = [rng.choice(words) for _ in range(target + 64)]
            k = max(1, target - 20)
            for _ in range(8):  # converges in one or two steps: most words are one token
                msgs = [{"role": "system", "content": system}, {"role": "user", "content": " ".join(pool[:k])}]
                diff = target - count(msgs)
                if diff == 0 or (diff > 0 and k >= len(pool)):
                    break
                k = min(len(pool), max(1, k + diff))
            convs.append(msgs)
        out[name] = convs
    return out


# ---------------------------------------------------------------- measurement

async def stream_chat(client: httpx.AsyncClient, url: str, model: str, messages: list[dict],
                      max_tokens: int) -> RequestRecord:
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}, "return_token_ids": True}
    record, _ = await stream_async(client, f"{url}/v1/chat/completions", body)
    return record


async def poll_models(client: httpx.AsyncClient, url: str, stop: asyncio.Event, interval_s: float,
                      out: list[float]) -> int:
    """GET /v1/models until `stop`, one at a time, `interval_s` apart; latencies into `out`
    (ms), returns the number of failed polls."""
    errors = 0
    while not stop.is_set():
        t0 = time.perf_counter()
        try:
            resp = await client.get(f"{url}/v1/models")
            if resp.status_code == 200:
                out.append((time.perf_counter() - t0) * 1000)
            else:
                errors += 1
        except httpx.HTTPError:
            errors += 1
        try:
            await asyncio.wait_for(stop.wait(), interval_s)
        except asyncio.TimeoutError:
            pass
    return errors


class Bench:
    def __init__(self, urls: dict[str, str], roots: dict[str, int], model: str, args, reaper: procs.Reaper):
        self.urls, self.roots, self.model, self.args, self.reaper = urls, roots, model, args, reaper
        self.table = procs.snapshot()

    def trees(self, table: dict[int, procs.ProcRecord]) -> dict[str, set[int]]:
        trees = {name: procs.descendants(root, table) for name, root in self.roots.items()}
        trees["tandem"] -= trees["direct"]  # never the case, but never count a process twice
        for pids in trees.values():
            self.reaper.note(table, pids)
        return trees

    def cpu_since(self, before: dict) -> tuple[dict, dict[str, dict], float]:
        """(snapshot now, per system {(kind, role): CPU s} since `before`, client CPU s)."""
        after = procs.snapshot()
        trees = self.trees(after)
        deltas = {name: procs.cpu_delta(before, after, pids) for name, pids in trees.items()}
        me = os.getpid()
        client = procs.cpu_delta(before, after, [me])
        return after, deltas, sum(client.values())

    async def batch(self, client, poller, system: str, convs: list[list[dict]], cell: dict[str, SystemCell]) -> tuple:
        before = procs.snapshot()
        machine_before = psutil.cpu_times()
        stop = asyncio.Event()
        models: list[float] = []
        t0 = time.perf_counter()
        poll = asyncio.create_task(poll_models(poller, self.urls[system], stop, self.args.poll_interval_ms / 1000, models))
        records = await asyncio.gather(*[stream_chat(client, self.urls[system], self.model, c, self.args.max_tokens)
                                         for c in convs])
        stop.set()
        errors = await poll
        wall = time.perf_counter() - t0
        _, deltas, client_cpu = self.cpu_since(before)
        busy, steal = procs.machine_busy_s(machine_before, psutil.cpu_times())
        own = cell[system]
        # Whatever else ran on the machine meanwhile (other users' work): the noise in the figures.
        own.foreign_cpu_s += max(0.0, busy - client_cpu - sum(sum(d.values()) for d in deltas.values()))
        own.steal_s += steal
        own.records += records
        own.models_ms += models
        own.models_errors += errors
        own.busy_s += wall
        own.client_cpu_s += client_cpu
        own.add_cpu(procs.by_process(deltas[system]), procs.by_kind(deltas[system]))
        for other in SYSTEMS:
            if other != system:
                cell[other].idle_cpu_s += sum(deltas[other].values())
                cell[other].idle_s += wall
        return records, models

    async def idle(self, poller, seconds: float) -> dict:
        """Nothing streaming: /v1/models latency of each system (polled in turn) and the CPU
        each system's processes burn anyway (cores busy, by kind)."""
        before = procs.snapshot()
        lat = {name: [] for name in self.urls}
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            for name, url in self.urls.items():
                s = time.perf_counter()
                try:
                    await poller.get(f"{url}/v1/models")
                except httpx.HTTPError:
                    continue
                lat[name].append((time.perf_counter() - s) * 1000)
            await asyncio.sleep(self.args.poll_interval_ms / 1000)
        wall = time.perf_counter() - t0
        _, deltas, _ = self.cpu_since(before)
        return {name: {"models_latency": latency_summary(lat[name]),
                       "cpu_cores_busy": round(sum(deltas[name].values()) / wall, 3),
                       "cpu_cores_busy_by_process": {k: round(v / wall, 3) for k, v in sorted(
                           procs.by_process(deltas[name]).items(), key=lambda kv: -kv[1]) if v / wall >= 0.005}}
                for name in self.urls}

    async def run(self, cells: list[dict], prompts: dict[str, list]) -> dict:
        args = self.args
        out: dict = {"first_request": {}, "warmup_ttft_ms": {}}
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=16)
        async with httpx.AsyncClient(timeout=httpx.Timeout(args.request_timeout, connect=30), limits=limits) as client, \
                httpx.AsyncClient(timeout=httpx.Timeout(30)) as poller:
            for name, url in self.urls.items():
                await poller.get(f"{url}/v1/models")  # the poller's connection is open before timing
                warm = [prompts["short"].pop() for _ in range(args.warmup)] + [prompts["long"].pop()]
                ttfts = []
                for i, conv in enumerate(warm):
                    rec = await stream_chat(client, url, self.model, conv, args.max_tokens)
                    if rec.error:
                        raise RuntimeError(f"{name}: warm-up request failed: {rec.error}")
                    ttfts.append(round(rec.ttft_ms, 1))
                    if i == 0:
                        out["first_request"][name] = {"ttft_ms": ttfts[0], "token_gap_max_ms": round(rec.max_gap_ms, 1)}
                out["warmup_ttft_ms"][name] = ttfts
                log(f"[stream] {name} warm: first request TTFT {ttfts[0]} ms, then {ttfts[1:]} ms")
            out["idle"] = await self.idle(poller, args.idle_s)
            log("[stream] idle: " + ", ".join(f"{n} /v1/models p50 {v['models_latency'].get('p50_ms')} ms, "
                                               f"{v['cpu_cores_busy']} cores busy" for n, v in out["idle"].items()))
            out["cells"] = {}
            for spec in cells:
                cell = {name: SystemCell() for name in SYSTEMS}
                key, conc, batches = spec["name"], spec["concurrency"], spec["batches"]
                for b in range(batches):
                    order = SYSTEMS if b % 2 == 0 else tuple(reversed(SYSTEMS))  # ABBA: no system always second
                    for system in order:
                        convs = [prompts[spec["prompt"]].pop() for _ in range(conc)]
                        recs, models = await self.batch(client, poller, system, convs, cell)
                        gaps = [g for r in recs for g in r.token_gaps_ms]
                        ttft = [f"{r.ttft_ms:.0f}" for r in recs if r.ttft_ms is not None]
                        errs = [r.error for r in recs if r.error]
                        log(f"[stream] {key} batch {b + 1}/{batches} {system:6s}: TTFT {','.join(ttft)} ms, "
                            f"gap max {max(gaps, default=0):.0f} ms, /v1/models max "
                            f"{max(models, default=0):.0f} ms ({len(models)} polls)"
                            + (f", ERRORS {errs}" if errs else ""))
                        await asyncio.sleep(args.pause_s)
                out["cells"][key] = {"prompt": spec["prompt"], "concurrency": conc, "batches": batches,
                                     **{name: summarize(cell[name], args.max_tokens) for name in SYSTEMS}}
        return out


# ---------------------------------------------------------------- run

def machine_facts() -> dict:
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
    for mod in ("vllm", "ray", "torch"):
        try:
            versions[mod] = __import__(mod).__version__
        except Exception:  # a missing or broken package is a fact too, not an error here
            versions[mod] = None
    return {"cpu_model": model or platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "usable_cores": len(os.sched_getaffinity(0)),
            "flags": {f: f in flags for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")},
            "memory_gib": round(psutil.virtual_memory().total / (1 << 30), 1),
            "loadavg_at_start": [round(v, 2) for v in os.getloadavg()], "versions": versions}


def parse_batches(text: str) -> dict[int, int]:
    """"1:6,4:3" → {1: 6, 4: 3}: batches per cell at each concurrency."""
    out = {}
    for part in text.split(","):
        conc, n = part.split(":")
        out[int(conc)] = int(n)
    return out


def bench(args) -> dict:
    from cluster.config import ClusterConfig

    cfg = ClusterConfig.load(args.config)
    spec = DirectEngineSpec.like_tandem(cfg, DIRECT_PORT)
    dtype, cores = spec.dtype, spec.devices
    cells = [{"name": f"{p}_c{c}", "prompt": p, "concurrency": c, "batches": n}
             for p in ("short", "long") for c, n in sorted(parse_batches(args.batches).items())]
    per_system = {p: args.warmup * (p == "short") + 1 * (p == "long")
                  + sum(c["concurrency"] * c["batches"] for c in cells if c["prompt"] == p) for p in ("short", "long")}
    log(f"[stream] building {sum(per_system.values()) * 2} distinct prompts (~{args.short_prompt} and "
        f"~{args.long_prompt} tokens)")
    prompts = make_prompts(cfg.model.path, {"short": args.short_prompt, "long": args.long_prompt},
                           2 * max(per_system.values()), args.seed)
    result = {"benchmark": "stream", "command": " ".join(["python -m loadtest.bench.stream", *sys.argv[1:]]),
              "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": machine_facts(),
              "model": cfg.model.served_name, "model_path": str(cfg.model.path), "dtype": dtype,
              "config": str(args.config), "direct_cores": cores,
              "workload": {"api": "/v1/chat/completions, streaming, ignore_eos, temperature 0, return_token_ids",
                           "prompt_tokens_target": {"short": args.short_prompt, "long": args.long_prompt},
                           "max_tokens": args.max_tokens, "poll_interval_ms": args.poll_interval_ms,
                           "cells": cells, "warmup_per_system": args.warmup + 1}}
    reaper = procs.Reaper()
    t_all = time.monotonic()
    try:
        with ExitStack() as stack:
            tandem = stack.enter_context(TandemRun(args.config, args.out.with_suffix(".tandem.log"), log))
            log(f"[stream] tandem ready: its line says {tandem.ready_line_s:.0f} s, {tandem.spawn_to_ready_s} s "
                f"from spawning `tandem run`")
            direct = stack.enter_context(DirectEngines([spec], progress=log))
            result["readiness"] = {"tandem": {"ready_line_s": tandem.ready_line_s,
                                              "spawn_to_ready_s": tandem.spawn_to_ready_s},
                                   "direct": {"spawn_to_ready_s": round(direct.cold_start_s, 1)}}
            b = Bench({"tandem": f"http://{cfg.gateway.host}:{cfg.gateway.port}", "direct": spec.url},
                      {"tandem": tandem.proc.pid, "direct": direct.procs[0].pid}, cfg.model.served_name, args, reaper)
            kinds = {}
            for name, pids in b.trees(b.table).items():
                for pid in pids:
                    kind, role = procs.label(pid, b.table)
                    kinds.setdefault(name, {}).setdefault(kind + (f" [{role}]" if role else ""), 0)
                    kinds[name][kind + (f" [{role}]" if role else "")] += 1
            result["processes"] = kinds
            log(f"[stream] processes by kind: {json.dumps(kinds)}")
            result.update(asyncio.run(b.run(cells, prompts)))
    finally:
        reaper.reap(log)
    result["wall_s"] = round(time.monotonic() - t_all, 1)
    result["machine"]["loadavg_at_end"] = [round(v, 2) for v in os.getloadavg()]
    result["targets"] = targets(result)
    return result


def report(result: dict) -> str:
    return "\n\n".join([figures_table(result), "CPU seconds per streamed token by process kind:", cpu_table(result),
                        targets_table(result["targets"])])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--batches", default="1:6,4:3", help="batches per cell and system, by concurrency")
    parser.add_argument("--short-prompt", type=int, default=60, help="tokens, chat template included")
    parser.add_argument("--long-prompt", type=int, default=1000)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=3, help="short requests per system before measuring (+1 long)")
    parser.add_argument("--poll-interval-ms", type=float, default=100)
    parser.add_argument("--idle-s", type=float, default=5)
    # > 1 s: a vLLM engine keeps spinning for 1 s after its last step (shm_broadcast's
    # busy_loop_s; tandem's engines do not, cluster/no_spin.py), so with a shorter pause the
    # system just served burns a core during the other system's batch.
    parser.add_argument("--pause-s", type=float, default=2.0, help="between batches")
    parser.add_argument("--request-timeout", type=float, default=120)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench" / "stream.json")
    parser.add_argument("--replot", type=Path, help="redraw the plot and tables from this JSON; runs nothing")
    args = parser.parse_args()
    if args.replot:
        result = json.loads(args.replot.read_text())
        plot(result, args.replot.with_suffix(".png"))
        print(report(result))
        return 0
    # SIGTERM/SIGHUP unwind like Ctrl-C, so every process this run started is stopped.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.default_int_handler)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = bench(args)
    args.out.write_text(json.dumps(result, indent=1))
    plot(result, args.out.with_suffix(".png"))
    print(report(result))
    log(f"[stream] wrote {args.out} and {args.out.with_suffix('.png')} ({result['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
