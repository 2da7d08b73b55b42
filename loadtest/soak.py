"""Soak test (not in CI): N minutes of moderate load against a running cluster, with the
resident memory of every Ray and vLLM process sampled along the way.

    python -m loadtest.soak --host http://127.0.0.1:8000 --minutes 20 [--concurrency 4]
        [--warmup-minutes 3] [--sample-s 30] [--out runs/soak]

Load: `--concurrency` clients in a closed loop, each sending streamed chat completions with
prompts of 20-400 words (`--max-words`) and 16-96 output tokens (ignore_eos, so lengths are exact). Every
request must stream to `[DONE]` with a finish reason and no error event.

Memory: every `--sample-s` seconds, RSS and PSS (the process's proportional share of
shared pages, so a page shared by ten workers is not counted ten times) of the cluster's
processes: the `tandem run` process (`.tandem/run.pid`, or `--pid`) and all its
descendants: Ray's GCS, raylet, workers, Serve replicas, vLLM EngineCores. Without a pid,
every process whose command line names Ray or vLLM.

Writes `<out>/soak.json` (every sample, per process) and `<out>/soak.png` (totals and each
process over time). Exits 1 on any failed request, a process that went away, or memory
growth over `--max-growth` (default 10%) between the first sample after the warm-up and the
end (mean of the last two samples, so one sample's noise does not decide); 0 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import httpx
import psutil

from loadtest.measure.sse import stream_async

WORDS = ("the cluster serves requests with prefill and decode engines that share key value caches over "
         "a fast transfer path while a router keeps related prompts together and admission control "
         "protects latency for interactive users during bursts of traffic").split()
PATTERNS = ("ray::", "raylet", "gcs_server", "/ray/", "vllm", "VLLM", "EngineCore")
MIB = 1 << 20


@dataclass
class LoadCounts:
    ok: int = 0
    failed: int = 0
    output_tokens: int = 0
    errors: list[str] = field(default_factory=list)  # the first few, for the report

    def fail(self, why: str) -> None:
        self.failed += 1
        if len(self.errors) < 20:
            self.errors.append(why)


def cluster_processes(root_pid: Optional[int]) -> list[psutil.Process]:
    if root_pid is not None:
        root = psutil.Process(root_pid)
        return [root, *root.children(recursive=True)]
    found = []
    for proc in psutil.process_iter(["cmdline", "name"]):
        text = " ".join(proc.info["cmdline"] or []) + " " + (proc.info["name"] or "")
        if any(p in text for p in PATTERNS) and "loadtest.soak" not in text:
            found.append(proc)
    return found


def label(proc: psutil.Process) -> str:
    try:
        cmd = proc.cmdline()
    except psutil.Error:
        return "?"
    text = cmd[0] if cmd else proc.name()
    return text.split()[0][:60] if text.startswith("ray::") or "VLLM" in text else " ".join(cmd[:3])[-60:]


def sample_memory(root_pid: Optional[int]) -> dict:
    procs = {}
    for proc in cluster_processes(root_pid):
        try:
            info = proc.memory_full_info()
            procs[str(proc.pid)] = {"name": label(proc), "rss": info.rss, "pss": getattr(info, "pss", info.rss)}
        except psutil.Error:
            continue  # exited between listing and reading
    return {"t": time.time(), "rss": sum(p["rss"] for p in procs.values()),
            "pss": sum(p["pss"] for p in procs.values()), "procs": procs}


async def client(http: httpx.AsyncClient, host: str, model: str, rng: random.Random, stop_at: float,
                 counts: LoadCounts, max_words: int) -> None:
    while time.monotonic() < stop_at:
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randrange(max_words // 20, max_words)))
        max_tokens = rng.randrange(16, 97)
        body = {"model": model, "messages": [{"role": "user", "content": words}], "max_tokens": max_tokens,
                "ignore_eos": True, "temperature": 0.7, "stream": True}
        record, reader = await stream_async(http, f"{host}/v1/chat/completions", body)
        if not record.ok:
            counts.fail(record.error)
        elif not reader.finished:
            counts.fail("stream ended without a finish reason")
        else:
            counts.ok += 1
            counts.output_tokens += record.tokens


async def sampler(root_pid: Optional[int], every_s: float, stop_at: float, samples: list[dict],
                  started: float) -> None:
    while True:
        sample = await asyncio.to_thread(sample_memory, root_pid)
        samples.append(sample)
        print(f"[{(time.monotonic() - started) / 60:5.1f} min] {len(sample['procs'])} processes, "
              f"RSS {sample['rss'] / MIB:.0f} MiB, PSS {sample['pss'] / MIB:.0f} MiB", flush=True)
        if time.monotonic() + every_s > stop_at + 1:
            return
        await asyncio.sleep(every_s)


async def run(args: argparse.Namespace, root_pid: Optional[int]) -> tuple[LoadCounts, list[dict]]:
    counts, samples = LoadCounts(), []
    started = time.monotonic()
    stop_at = started + args.minutes * 60
    async with httpx.AsyncClient(timeout=120) as http:
        model = args.model or (await http.get(f"{args.host}/v1/models")).json()["data"][0]["id"]
        rngs = [random.Random(args.seed + i) for i in range(args.concurrency)]
        await asyncio.gather(sampler(root_pid, args.sample_s, stop_at, samples, started),
                             *(client(http, args.host, model, rng, stop_at, counts, args.max_words) for rng in rngs))
    return counts, samples


def growth(samples: list[dict], warmup_s: float, key: str) -> tuple[float, float, float]:
    """(baseline after the warm-up, end = mean of the last two samples, relative growth)."""
    t0 = samples[0]["t"]
    after = [s for s in samples if s["t"] - t0 >= warmup_s] or samples[-1:]
    base = after[0][key]
    end = sum(s[key] for s in samples[-2:]) / len(samples[-2:])
    return base, end, (end - base) / base if base else 0.0


def plot(samples: list[dict], path: Path, warmup_s: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = samples[0]["t"]
    minutes = [(s["t"] - t0) / 60 for s in samples]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 8), sharex=True)
    top.plot(minutes, [s["rss"] / MIB for s in samples], marker="o", label="total RSS")
    top.plot(minutes, [s["pss"] / MIB for s in samples], marker="o", label="total PSS")
    top.axvline(warmup_s / 60, color="grey", linestyle="--", label="end of warm-up")
    top.set_ylabel("MiB")
    top.legend()
    top.set_title("tandem soak: resident memory of the Ray and vLLM processes")
    for pid in samples[0]["procs"]:
        series = [(m, s["procs"][pid]["pss"] / MIB) for m, s in zip(minutes, samples) if pid in s["procs"]]
        bottom.plot([m for m, _ in series], [v for _, v in series], label=f"{samples[0]['procs'][pid]['name']} ({pid})")
    bottom.set_xlabel("minutes")
    bottom.set_ylabel("PSS per process, MiB")
    bottom.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="http://127.0.0.1:8000")
    parser.add_argument("--model", help="served model name (default: the first of /v1/models)")
    parser.add_argument("--minutes", type=float, default=20)
    parser.add_argument("--warmup-minutes", type=float, default=3)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-words", type=int, default=400, help="longest prompt, in words")
    parser.add_argument("--sample-s", type=float, default=30)
    parser.add_argument("--max-growth", type=float, default=0.10)
    parser.add_argument("--pid", type=int, help="root process of the cluster (default: .tandem/run.pid)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("runs/soak"))
    args = parser.parse_args(argv)
    if args.warmup_minutes >= args.minutes:
        parser.error("--warmup-minutes must be shorter than --minutes")
    run_pid = Path(".tandem/run.pid")
    root_pid = args.pid or (int(run_pid.read_text()) if run_pid.exists() else None)

    counts, samples = asyncio.run(run(args, root_pid))
    warmup_s = args.warmup_minutes * 60
    verdict = {}
    for key in ("rss", "pss"):
        base, end, rel = growth(samples, warmup_s, key)
        verdict[key] = {"baseline_mib": round(base / MIB, 1), "end_mib": round(end / MIB, 1), "growth": round(rel, 4)}
    lost = sorted(set(samples[0]["procs"]) - set(samples[-1]["procs"]))
    failures = []
    if counts.failed:
        failures.append(f"{counts.failed} failed requests")
    if lost:
        failures.append(f"processes gone during the run: {[samples[0]['procs'][p]['name'] + ' ' + p for p in lost]}")
    for key, v in verdict.items():
        if v["growth"] > args.max_growth:
            failures.append(f"total {key.upper()} grew {v['growth']:.1%} (> {args.max_growth:.0%}) after the warm-up")

    args.out.mkdir(parents=True, exist_ok=True)
    report = {"host": args.host, "minutes": args.minutes, "warmup_minutes": args.warmup_minutes,
              "concurrency": args.concurrency, "root_pid": root_pid, "requests_ok": counts.ok,
              "requests_failed": counts.failed, "output_tokens": counts.output_tokens, "errors": counts.errors,
              "memory": verdict, "passed": not failures, "failures": failures, "samples": samples}
    (args.out / "soak.json").write_text(json.dumps(report, indent=1))
    plot(samples, args.out / "soak.png", warmup_s)
    print(json.dumps({k: v for k, v in report.items() if k != "samples"}, indent=1))
    print(f"wrote {args.out / 'soak.json'} and {args.out / 'soak.png'}")
    if failures:
        print("SOAK FAILED: " + "; ".join(failures), file=sys.stderr)
        return 1
    print("SOAK PASSED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
