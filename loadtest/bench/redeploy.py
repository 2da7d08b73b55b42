"""A rolling upgrade on real engines under load (issue 29, item 3): `tandem run` of a config,
clients each streaming one greedy completion after another on new connections, then `tandem
redeploy` of the same config with one setting changed (every deployment is replaced: tandem has
no `user_config`), the load kept on until `--after-s` past it. Writes JSON: every request
(status, tokens, TTFT, longest gap, error, when it was sent relative to the redeploy), the
failed ones by error, TTFT and gap summaries of the requests sent during the redeploy.

    .venv/bin/python -m loadtest.bench.redeploy [--config cluster/configs/local.yaml] [--clients 4]

A request counts as answered when it streamed exactly `--max-tokens` tokens (the server's usage;
a chunk may carry several) with status 200, no error event and [DONE]. Nothing else may use the config's port or Ray meanwhile.
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
from loadtest.bench.tandem_run import TANDEM, TandemRun, machine, resolved_config
from loadtest.bench.workload import ScheduledRequest
from loadtest.measure.percentiles import latency_summary

RESULTS = Path(__file__).resolve().parent / "results"
PROMPT_TOKENS = 32


def write_configs(config: Path, model_path: str, folder: Path) -> tuple[Path, Path, dict]:
    """The config as given (model path resolved) and the same with gateway.body_read_timeout_s
    one second longer: a change every deployment restarts for."""
    cfg = resolved_config(config, model_path)
    before, after = folder / "before.yaml", folder / "after.yaml"
    before.write_text(yaml.safe_dump(cfg))
    gateway = cfg.setdefault("gateway", {})
    gateway["body_read_timeout_s"] = float(gateway.get("body_read_timeout_s", 10.0)) + 1.0
    after.write_text(yaml.safe_dump(cfg))
    return before, after, cfg


async def client_loop(index: int, url: str, model: str, max_tokens: int, stop: asyncio.Event,
                      out: list[dict], t0: float) -> None:
    """One client: a request on a new connection, then the next, until `stop`."""
    rng = random.Random(index)
    n = 0
    while not stop.is_set():
        prompt = tuple(rng.randrange(1000, 40000) for _ in range(PROMPT_TOKENS))  # distinct: no prefix hits
        sent = time.monotonic() - t0
        async with httpx.AsyncClient(timeout=httpx.Timeout(600, connect=30)) as client:
            rec = await stream_one(client, url, model, ScheduledRequest(n, sent, f"client-{index}", prompt, max_tokens))
        out.append({"client": index, "n": n, "sent_s": round(sent, 3), "status": rec.status,
                    "tokens": rec.usage_tokens, "chunks": rec.tokens,
                    "ttft_ms": rec.ttft_ms, "max_gap_ms": max(rec.token_gaps_ms, default=None),
                    "error": rec.error or None})
        n += 1


async def run(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    before, after, cfg = write_configs(args.config, args.model_path, folder)
    records: list[dict] = []
    async with TandemRun(before, cfg, folder, ready_timeout_s=args.start_timeout_s) as cluster:
        url, model = cluster.url, cluster.model
        print(f"[redeploy] cluster ready in {cluster.ready_s:.0f} s; {args.clients} clients", flush=True)
        t0 = time.monotonic()
        stop = asyncio.Event()
        clients = [asyncio.create_task(client_loop(i, url, model, args.max_tokens, stop, records, t0))
                   for i in range(args.clients)]
        await asyncio.sleep(args.before_s)
        redeploy_from = time.monotonic() - t0
        print(f"[redeploy] {len(records)} answered; redeploying", flush=True)
        with open(folder / "redeploy.log", "wb") as log:
            redeploy = await asyncio.create_subprocess_exec(*TANDEM, "redeploy", "--config", str(after), stdout=log,
                                                            stderr=asyncio.subprocess.STDOUT)
            rc = await redeploy.wait()
        redeploy_to = time.monotonic() - t0
        print(f"[redeploy] done in {redeploy_to - redeploy_from:.0f} s (rc {rc}); "
              f"{sum(1 for r in records if r['error'])} failed so far", flush=True)
        await asyncio.sleep(args.after_s)
        stop.set()
        await asyncio.gather(*clients)
    return summarize(args, records, redeploy_from, redeploy_to, rc, model)


def summarize(args: argparse.Namespace, records: list[dict], redeploy_from: float, redeploy_to: float, rc: int,
              model: str) -> dict[str, Any]:
    def answered(r: dict) -> bool:  # stream_one's error covers a missing [DONE] and another token count
        return r["status"] == 200 and not r["error"]

    during = [r for r in records if redeploy_from <= r["sent_s"] <= redeploy_to]
    failed = [r for r in records if not answered(r)]
    errors: dict[str, int] = {}
    for r in failed:
        key = f"{r['status']} {r['error'][:80]}"
        errors[key] = errors.get(key, 0) + 1
    return {
        "benchmark": "redeploy",
        "command": " ".join(["python -m loadtest.bench.redeploy", *sys.argv[1:]]),
        "machine": machine(),
        "config": str(args.config), "model": model,
        "workload": {"clients": args.clients, "max_tokens": args.max_tokens, "prompt_tokens": PROMPT_TOKENS,
                     "api": "/v1/completions, streaming, greedy, ignore_eos, random token-id prompts, a new connection per request"},
        "redeploy": {"from_s": round(redeploy_from, 1), "to_s": round(redeploy_to, 1),
                     "seconds": round(redeploy_to - redeploy_from, 1), "rc": rc},
        "requests": len(records), "failed": len(failed), "errors": errors,
        "sent_during_redeploy": {"requests": len(during), "failed": sum(not answered(r) for r in during),
                                 "ttft": latency_summary(r["ttft_ms"] for r in during if answered(r)),
                                 "max_gap": latency_summary(r["max_gap_ms"] for r in during
                                                            if answered(r) and r["max_gap_ms"] is not None)},
        "all": {"ttft": latency_summary(r["ttft_ms"] for r in records if answered(r)),
                "max_gap": latency_summary(r["max_gap_ms"] for r in records
                                           if answered(r) and r["max_gap_ms"] is not None)},
        "records": records,
    }


def plot(result: dict[str, Any], path: Path) -> Optional[Path]:
    """Each request's TTFT against when it was sent, failed ones marked, the redeploy shaded;
    None when matplotlib is missing (the JSON holds every figure)."""
    plt = pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(9, 4))
    window = result["redeploy"]
    ax.axvspan(window["from_s"], window["to_s"], color="0.9", label="tandem redeploy running")
    for failed, style in ((False, dict(marker="o", color="tab:blue", label="answered")),
                          (True, dict(marker="x", color="tab:red", label="failed"))):
        points = [(r["sent_s"], (r["ttft_ms"] or 0) / 1000) for r in result["records"]
                  if bool(r["error"] or r["status"] != 200) == failed]
        if points:
            ax.scatter(*zip(*points), s=18, **style)
    ax.set_xlabel("request sent (s into the load)")
    ax.set_ylabel("TTFT (s)")
    ax.set_title(f"{result['requests']} requests, {result['failed']} failed: {result['workload']['clients']} "
                 f"clients through a redeploy ({result['model']})", fontsize=10)
    ax.legend(loc="upper left", fontsize=8)
    return save(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=Path("cluster/configs/local.yaml"))
    parser.add_argument("--model-path", default="", help="override model.path (a local folder)")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=120)
    parser.add_argument("--before-s", type=float, default=30.0, help="load before the redeploy")
    parser.add_argument("--after-s", type=float, default=30.0, help="load after it")
    parser.add_argument("--start-timeout-s", type=float, default=900.0)
    parser.add_argument("--out", type=Path, default=RESULTS / f"redeploy-{time.strftime('%Y-%m-%d')}.json")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tandem-redeploy-") as tmp:
        result = asyncio.run(run(args, Path(tmp)))
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    plot(result, args.out.with_suffix(".png"))
    print(f"[redeploy] {result['requests']} requests, {result['failed']} failed "
          f"({result['sent_during_redeploy']['requests']} sent during the {result['redeploy']['seconds']} s redeploy, "
          f"{result['sent_during_redeploy']['failed']} of them failed; their TTFT max "
          f"{result['sent_during_redeploy']['ttft'].get('max_ms')} ms); {args.out}", flush=True)
    return 0 if result["failed"] == 0 and result["redeploy"]["rc"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
