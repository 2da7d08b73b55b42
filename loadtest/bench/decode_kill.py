"""Decode replicas SIGKILLed mid-answer on real engines (issue 29, item 1's figures): `tandem run`
of a config with two interactive decode replicas, then rounds of: greedy streams answered once
uninterrupted (the reference), the same prompts again with one decode replica's process killed
once every stream has streamed `--kill-after` tokens, and a wait until Serve's replacement serves.
Per round: the time from the kill to each stream's next token, whether each answer's text equals
the reference token for token, and the migrations the gateway counted (tandem_migrations_total
from the Ray metrics port). Writes JSON and a plot.

    .venv/bin/python -m loadtest.bench.decode_kill [--config cluster/configs/local.yaml] [--rounds 5]

Which streams were on the killed replica is not visible to a client: the k largest
kill-to-next-token gaps of a round, k the migrations counted in it, are the migrated streams'.
Greedy text equality across a cut is exact only where the engine's numerics are the same for a
prompt computed at once and token by token (float32 yes; bfloat16 may flip a near tie): the
dtype is recorded, and unequal answers are counted, not hidden.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import httpx
import psutil
import yaml

from loadtest.bench.figures import pyplot, save
from loadtest.bench.tandem_run import TandemRun, machine, replica_states, resolved_config
from loadtest.measure.percentiles import latency_summary

RESULTS = Path(__file__).resolve().parent / "results"
DECODE = "interactive-decode"


def write_config(config: Path, folder: Path, metrics_port: int, dtype: str) -> tuple[Path, dict]:
    """The config with two interactive decode replicas sharing the cores, the batch tier left out
    (its idle engines would share them too), and a known Ray metrics port."""
    cfg = resolved_config(config)
    cfg["tiers"] = {"interactive": cfg["tiers"]["interactive"]}
    decode = cfg["tiers"]["interactive"]["decode"]
    decode.update({"replicas": 2, "num_cpus": 0.5, "cpu_binding": ["1", "0"]})
    decode.pop("autoscaling", None)
    cfg.setdefault("ray", {})["metrics_export_port"] = metrics_port
    if dtype:
        cfg["model"]["dtype"] = dtype
    path = folder / "decode-kill.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, cfg


def decode_processes() -> list[psutil.Process]:
    """The decode replicas' Ray actor processes (not their vLLM children)."""
    found = [p for p in psutil.process_iter(["cmdline"])
             if " ".join(p.info["cmdline"] or []).startswith(f"ray::ServeReplica:tandem:{DECODE}")]
    pids = {p.pid for p in found}
    return [p for p in found if p.ppid() not in pids]


class Stream:
    """One greedy streamed completion: each token's text and arrival time."""

    def __init__(self, prompt: list[int], max_tokens: int) -> None:
        self.prompt, self.max_tokens = prompt, max_tokens
        self.texts: list[str] = []
        self.times: list[float] = []
        self.error: Optional[str] = None

    async def run(self, client: httpx.AsyncClient, url: str, model: str) -> "Stream":
        body = {"model": model, "prompt": self.prompt, "max_tokens": self.max_tokens, "temperature": 0,
                "ignore_eos": True, "stream": True}
        try:
            async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
                if r.status_code != 200:
                    self.error = f"status {r.status_code}"
                    return self
                async for line in r.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        self.error = str(chunk["error"])[:200]
                    for choice in chunk.get("choices", ()):
                        if choice.get("text"):
                            self.texts.append(choice["text"])
                            self.times.append(time.monotonic())
        except httpx.HTTPError as exc:
            self.error = repr(exc)[:200]
        return self

    @property
    def text(self) -> str:
        return "".join(self.texts)


def running_decode_replicas() -> int:
    return replica_states(DECODE).get("RUNNING", 0)


async def serving_again(deadline: float, before: frozenset[int] = frozenset()) -> float:
    """Until Serve runs both decode replicas again (a replica is RUNNING once its engine started),
    one of them a process not in `before` (Serve's replacement, not the dead one it has not yet
    noticed); when (monotonic)."""
    while time.monotonic() < deadline:
        pids = {p.pid for p in decode_processes()}
        if pids - before and await asyncio.to_thread(running_decode_replicas) == 2:
            return time.monotonic()
        await asyncio.sleep(1)
    raise TimeoutError("the killed decode replica was not replaced in time")


def migrations(cluster: TandemRun) -> float:
    return cluster.metric("ray_tandem_migrations_total", result="continued")


async def one_round(index: int, cluster: TandemRun, args: argparse.Namespace, rng: random.Random) -> dict[str, Any]:
    url, model = cluster.url, cluster.model
    prompts = [[rng.randrange(1000, 40000) for _ in range(args.prompt_tokens)] for _ in range(args.streams)]
    async with httpx.AsyncClient(timeout=httpx.Timeout(600, connect=30)) as client:
        reference = await asyncio.gather(*(Stream(p, args.max_tokens).run(client, url, model) for p in prompts))
        before = migrations(cluster)
        streams = [Stream(p, args.max_tokens) for p in prompts]
        tasks = [asyncio.create_task(s.run(client, url, model)) for s in streams]
        while min(len(s.texts) for s in streams) < args.kill_after and not all(t.done() for t in tasks):
            await asyncio.sleep(0.01)
        processes = decode_processes()
        victim = rng.choice(processes)
        killed_at = time.monotonic()
        os.kill(victim.pid, signal.SIGKILL)
        await asyncio.gather(*tasks)
    await asyncio.sleep(3)  # Ray exports the gateway's counters every few seconds
    migrated = migrations(cluster) - before
    gaps = sorted((next((t for t in s.times if t > killed_at), float("nan")) - killed_at) * 1000 for s in streams)
    k = int(migrated)
    record = {"round": index, "killed_pid": victim.pid, "migrations": migrated,
              "kill_to_next_token_ms": [round(g, 1) for g in gaps],
              "migrated_streams_ms": [round(g, 1) for g in gaps[len(gaps) - k:]] if k else [],
              "errors": [s.error for s in streams if s.error],
              "reference_errors": [s.error for s in reference if s.error],
              "equal_to_reference": sum(s.text == r.text and not s.error for s, r in zip(streams, reference)),
              "streams": len(streams)}
    record["replaced_in_s"] = round(await serving_again(killed_at + args.recovery_timeout_s,
                                                     frozenset(p.pid for p in processes)) - killed_at, 1)
    print(f"[decode-kill] round {index + 1}/{args.rounds}: {k} migrated, kill to next token "
          f"{record['migrated_streams_ms']} ms, {record['equal_to_reference']}/{len(streams)} equal to the "
          f"uninterrupted run, {len(record['errors'])} errors; replaced in {record['replaced_in_s']} s", flush=True)
    return record


async def run(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    config, cfg = write_config(args.config, folder, args.metrics_port, args.dtype)
    rng = random.Random(args.seed)
    rounds = []
    async with TandemRun(config, cfg, folder, ready_timeout_s=args.recovery_timeout_s) as cluster:
        await asyncio.to_thread(cluster.connect_driver)
        await serving_again(time.monotonic() + args.recovery_timeout_s)
        print(f"[decode-kill] cluster ready in {cluster.ready_s:.0f} s", flush=True)
        for i in range(args.rounds):
            rounds.append(await one_round(i, cluster, args, rng))
    model = cluster.model
    migrated = [g for r in rounds for g in r["migrated_streams_ms"]]
    return {
        "benchmark": "decode_kill",
        "command": " ".join(["python -m loadtest.bench.decode_kill", *sys.argv[1:]]),
        "machine": machine(),
        "config": str(args.config), "model": model, "dtype": cfg["model"].get("dtype", "auto"),
        "workload": {"rounds": args.rounds, "streams": args.streams, "max_tokens": args.max_tokens,
                     "prompt_tokens": args.prompt_tokens, "kill_after_tokens": args.kill_after,
                     "decode_replicas": 2, "api": "/v1/completions, streaming, greedy, ignore_eos"},
        "kills": len(rounds), "migrations": sum(r["migrations"] for r in rounds),
        "failed_streams": sum(len(r["errors"]) for r in rounds),
        "equal_to_reference": sum(r["equal_to_reference"] for r in rounds),
        "streams": sum(r["streams"] for r in rounds),
        "kill_to_next_token_migrated": latency_summary(migrated),
        "rounds": rounds,
    }


def plot(result: dict[str, Any], path: Path) -> Optional[Path]:
    """Each round's kill-to-next-token gaps, the migrated streams' marked."""
    plt = pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(8, 4))
    for r in result["rounds"]:
        others = r["kill_to_next_token_ms"][:len(r["kill_to_next_token_ms"]) - len(r["migrated_streams_ms"])]
        ax.scatter([r["round"] + 1] * len(others), others, color="tab:gray", s=18)
        ax.scatter([r["round"] + 1] * len(r["migrated_streams_ms"]), r["migrated_streams_ms"], color="tab:red", s=24)
    ax.scatter([], [], color="tab:red", label="streams on the killed replica (migrated)")
    ax.scatter([], [], color="tab:gray", label="streams on the other replica")
    ax.set_xlabel("kill")
    ax.set_ylabel("kill to the client's next token (ms)")
    ax.set_title(f"{result['model']} ({result['dtype']}), 2 decode replicas: {result['equal_to_reference']}/"
                 f"{result['streams']} answers equal to an uninterrupted run, {result['failed_streams']} failed",
                 fontsize=9)
    ax.legend(fontsize=8)
    return save(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=Path("cluster/configs/local.yaml"))
    parser.add_argument("--dtype", default="", help="override model.dtype (float32: exact greedy across a cut)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--kill-after", type=int, default=40, help="tokens every stream has streamed at the kill")
    parser.add_argument("--metrics-port", type=int, default=18081)
    parser.add_argument("--recovery-timeout-s", type=float, default=600.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / f"decode_kill-{time.strftime('%Y-%m-%d')}.json")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tandem-decode-kill-") as tmp:
        result = asyncio.run(run(args, Path(tmp)))
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    plot(result, args.out.with_suffix(".png"))
    print(f"[decode-kill] {result['kills']} kills, {result['migrations']:.0f} migrations, {result['failed_streams']} "
          f"failed, {result['equal_to_reference']}/{result['streams']} equal; kill to next token (migrated) "
          f"{result['kill_to_next_token_migrated']}; {args.out}", flush=True)
    return 0 if result["failed_streams"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
