"""A decode replica removed by the autoscaler while long streams run on it, on real engines
(issue 29, item 2's test on real vLLM): `tandem run` of a config whose interactive decode pool
starts with two replicas and autoscales between 1 and 2, long greedy streams sent on both as
soon as the cluster is ready, and tandem's own policy scaling the pool down to one replica for
low load while they run. Serve's graceful shutdown is the drain (the removed replica gets no new
request and stops once its streams end, or at the pool's drain_timeout_s; the streams still
running then would migrate). Writes JSON and a plot.

    flock /tmp/tandem-cluster.lock .venv/bin/python -m loadtest.bench.decode_drain [--streams 4] [--max-tokens 600]

Recorded every half second: Serve's decode replica states and each engine's running requests
(vLLM's `vllm:num_requests_running`, per replica, from Ray's metrics port). The removed replica
is the one whose series goes away; the streams it drained are its running requests when Serve
began stopping it. Per stream: tokens, errors, the longest token gap and when it ended. Passed
when every stream streamed all its tokens with no error, none migrated (a migration is a stream
cut at the drain deadline and continued elsewhere), the removed replica had streams when it was
told to stop, and it was gone only after they ended.

The tier's itl objective is set to 1 s here: the policy counts the token gap against it as load
(a 50 ms gap is half of a 0.1 s objective, too much load to give up a replica); everything else
is the default config.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import httpx
import yaml

from loadtest.bench.loadgen import stream_one
from loadtest.bench.figures import pyplot, save
from loadtest.bench.tandem_run import TandemRun, machine, replica_states, resolved_config
from loadtest.bench.workload import ScheduledRequest
from loadtest.measure.prom import metric_by

RESULTS = Path(__file__).resolve().parent / "results"
DECODE = "interactive-decode"


def write_config(config: Path, folder: Path, metrics_port: int, downscale_delay_s: float) -> tuple[Path, dict]:
    """The config with the interactive decode pool autoscaled 2 → 1 (the batch tier left out: its
    idle engines would share the cores), a known Ray metrics port, and the autoscaler's decisions
    logged."""
    cfg = resolved_config(config)
    cfg["tiers"] = {"interactive": cfg["tiers"]["interactive"]}
    tier = cfg["tiers"]["interactive"]
    tier["slo"] = {**tier.get("slo", {}), "itl_s": 1.0}
    tier["decode"].update({
        "replicas": 2, "num_cpus": 0.5, "cpu_binding": ["1", "0"],
        "autoscaling": {"min_replicas": 1, "max_replicas": 2, "downscale_delay_s": downscale_delay_s,
                        "cooldown_s": 0, "upscale_delay_s": 3600, "metrics_interval_s": 1.0, "look_back_s": 5.0,
                        "decision_log": str(folder / "decisions.jsonl")},
    })
    cfg.setdefault("ray", {})["metrics_export_port"] = metrics_port
    path = folder / "decode-drain.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, cfg


def running_per_replica(cluster: TandemRun) -> dict[str, float]:
    text = httpx.get(cluster.metrics_url, timeout=30).text
    return metric_by(text, "ray_vllm_num_requests_running", "replica", pool="decode")


async def watch(cluster: TandemRun, t0: float, stop: asyncio.Event, out: list[dict]) -> None:
    """Every half second: Serve's decode replica states and each decode engine's running requests."""
    while not stop.is_set():
        states, running = await asyncio.gather(asyncio.to_thread(replica_states, DECODE),
                                               asyncio.to_thread(running_per_replica, cluster))
        out.append({"t_s": round(time.monotonic() - t0, 2), "states": states, "running": running})
        await asyncio.sleep(0.5)


def removal(timeline: list[dict], streams_ended_s: float) -> dict[str, Any]:
    """When Serve began stopping a decode replica, which one it was (the engine whose series went
    away: Ray drops a gauge some seconds after its process ends), what it was running then, and
    when it was gone (pure: the unit test gives a timeline). Where no series has gone yet, the
    removed one is not known, and what it drained is at least the fewest any engine ran then."""
    stopping = next((s for s in timeline if s["states"].get("STOPPING", 0) > 0), None)
    if stopping is None:
        return {"scaled_down": False}
    gone_sample = next((s for s in timeline if s["t_s"] > stopping["t_s"] and s["states"].get("STOPPING", 0) == 0), None)
    removed = sorted(set(stopping["running"]) - set(timeline[-1]["running"]))
    if removed:
        drained = sum(stopping["running"][r] for r in removed)
        # vLLM's gauge moves only when its engine steps: a removed engine's last reading can stay
        # at its streams' count past their end, so the client's end bounds it.
        seen_busy = max((s["t_s"] for s in timeline for r in removed if s["running"].get(r, 0) > 0), default=None)
        last_busy = streams_ended_s if seen_busy is None else min(seen_busy, streams_ended_s)
    else:
        drained = min(stopping["running"].values(), default=0)
        last_busy = streams_ended_s
    return {"scaled_down": True, "stopping_at_s": stopping["t_s"], "gone_at_s": gone_sample and gone_sample["t_s"],
            "removed_replica": removed, "identified": bool(removed), "running_at_stop": stopping["running"],
            "drained_streams": drained, "removed_last_busy_s": last_busy}


async def run(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    config, cfg = write_config(args.config, folder, args.metrics_port, args.downscale_delay_s)
    rng = random.Random(args.seed)
    timeline: list[dict] = []
    async with TandemRun(config, cfg, folder) as cluster:
        await asyncio.to_thread(cluster.connect_driver)
        print(f"[decode-drain] cluster ready in {cluster.ready_s:.0f} s", flush=True)
        migrated_before = cluster.metric("ray_tandem_migrations_total")
        t0 = time.monotonic()
        stop = asyncio.Event()
        watcher = asyncio.create_task(watch(cluster, t0, stop, timeline))
        async with httpx.AsyncClient(timeout=httpx.Timeout(900, connect=30)) as client:
            schedule = [ScheduledRequest(i, 0.0, "long", tuple(rng.randrange(1000, 40000) for _ in range(args.prompt_tokens)),
                                         args.max_tokens) for i in range(args.streams)]
            records = await asyncio.gather(*(stream_one(client, cluster.url, cluster.model, r) for r in schedule))
        ended_s = time.monotonic() - t0
        # Until the removed replica is gone and its engine's series has left the scrape (which
        # names it), or a minute more.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not removal(timeline, ended_s).get("identified"):
            await asyncio.sleep(1)
        stop.set()
        await watcher
        await asyncio.sleep(3)  # Ray exports the gateway's counters every few seconds
        migrated = cluster.metric("ray_tandem_migrations_total") - migrated_before
        model = cluster.model
    decisions = [json.loads(line) for line in (folder / "decisions.jsonl").read_text().splitlines() if line.strip()] \
        if (folder / "decisions.jsonl").exists() else []
    return summarize(args, cfg, model, records, ended_s, timeline, migrated, decisions)


def summarize(args: argparse.Namespace, cfg: dict, model: str, records: list, ended_s: float, timeline: list[dict],
              migrated: float, decisions: list[dict]) -> dict[str, Any]:
    streams = [{"index": r.index, "tokens": r.usage_tokens, "error": r.error or None,
                "seconds": round(r.e2e_ms / 1000, 1), "ttft_ms": r.ttft_ms and round(r.ttft_ms, 1),
                "max_gap_ms": round(max(r.token_gaps_ms, default=0), 1)} for r in records]
    gone = removal(timeline, ended_s)
    checks = {
        "every_stream_whole": all(s["error"] is None and s["tokens"] == args.max_tokens for s in streams),
        "none_migrated": migrated == 0,
        "scaled_down_while_streaming": gone["scaled_down"] and gone["stopping_at_s"] < ended_s,
        "removed_replica_had_streams": gone.get("drained_streams", 0) > 0,
        "gone_after_its_streams": bool(gone.get("gone_at_s")) and gone.get("removed_last_busy_s") is not None
        and gone["gone_at_s"] >= gone["removed_last_busy_s"],
    }
    scale_downs = [d for d in decisions if str(d.get("decision", {}).get("reason", "")).startswith("scale down")]
    return {
        "benchmark": "decode_drain",
        "command": " ".join(["python -m loadtest.bench.decode_drain", *sys.argv[1:]]),
        "machine": machine(), "config": str(args.config), "model": model, "dtype": cfg["model"].get("dtype", "auto"),
        "workload": {"streams": args.streams, "max_tokens": args.max_tokens, "prompt_tokens": args.prompt_tokens,
                     "api": "/v1/completions, streaming, greedy, ignore_eos, all sent at once"},
        "autoscaling": cfg["tiers"]["interactive"]["decode"]["autoscaling"],
        "passed": all(checks.values()), "checks": checks, "migrations": migrated, "removal": gone,
        "streams_ended_at_s": round(ended_s, 1), "streams": streams,
        "scale_down_decisions": scale_downs[:3], "timeline": timeline,
    }


def plot(result: dict[str, Any], path: Path) -> Optional[Path]:
    """Each decode engine's running streams over time, the removal marked."""
    plt = pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(9, 4))
    replicas = sorted({r for s in result["timeline"] for r in s["running"]})
    for r in replicas:
        points = [(s["t_s"], s["running"][r]) for s in result["timeline"] if r in s["running"]]
        removed = r in result["removal"].get("removed_replica", ())
        ax.step(*zip(*points), where="post", label=f"{r}{' (removed)' if removed else ''}", lw=2 if removed else 1.2)
    gone = result["removal"]
    if gone.get("scaled_down"):
        ax.axvline(gone["stopping_at_s"], color="tab:red", ls="--", label="Serve stops a replica (scale-down)")
        if gone.get("gone_at_s"):
            ax.axvline(gone["gone_at_s"], color="k", ls=":", label="removed replica gone")
    ax.set_xlabel("s since the streams were sent")
    ax.set_ylabel("running streams (vLLM)")
    whole = sum(s["error"] is None and s["tokens"] == result["workload"]["max_tokens"] for s in result["streams"])
    ax.set_title(f"{result['model']}: decode 2 → 1 under {len(result['streams'])} streams of "
                 f"{result['workload']['max_tokens']} tokens: {whole} whole, {result['migrations']:.0f} migrated",
                 fontsize=9)
    ax.legend(fontsize=8)
    return save(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=Path("cluster/configs/local.yaml"))
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=600)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--downscale-delay-s", type=float, default=30.0,
                        help="the decode pool's downscale_delay_s: the scale-down lands this long after the pool's "
                             "first low-load tick, which is about when the cluster gets ready")
    parser.add_argument("--metrics-port", type=int, default=18082)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / f"decode_drain-{time.strftime('%Y-%m-%d')}.json")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tandem-decode-drain-") as tmp:
        result = asyncio.run(run(args, Path(tmp)))
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    plot(result, args.out.with_suffix(".png"))
    gone = result["removal"]
    print(f"[decode-drain] {'passed' if result['passed'] else 'FAILED'} {result['checks']}; removed "
          f"{gone.get('removed_replica')} draining {gone.get('drained_streams')} streams, stopping at "
          f"{gone.get('stopping_at_s')} s, gone at {gone.get('gone_at_s')} s; streams ended at "
          f"{result['streams_ended_at_s']} s; {args.out}", flush=True)
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
