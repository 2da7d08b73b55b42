"""200 clients hang up mid-request: every engine lets go of their work.

150 clients read a few streamed tokens and drop the connection; 50 drop it while the prompt
is still being prefilled (before the first token). The gateway must abort each request on
the engine that holds it (decode mid-stream, prefill before the handoff), so afterwards
every interactive engine is back to its baseline: no running or waiting request, KV cache
usage as before. Without the aborts the decodes would run on for minutes (300 tokens each,
ignore_eos), so settling within the bound below is the proof.
"""

from __future__ import annotations

import asyncio
import json
import random
import time

import httpx

from tests.support.integration_cluster import MODEL_NAME, replica_stats


CLIENTS = 200
EARLY = 50  # of them hang up before the first token
CONCURRENCY = 32  # clients connected at once (the interactive tier admits 4-16 and queues 32)
TOKENS_BEFORE_HANGUP = 3
POOLS = {"interactive-prefill": 2, "interactive-decode": 1}
SETTLE_S = 60


def engines() -> dict:
    return {w: s for pool, n in POOLS.items() for w, s in replica_stats(pool, n).items()}


def prompt(rng: random.Random) -> list[int]:
    return [rng.randrange(5, 250) for _ in range(rng.randrange(40, 200))]


async def client(http: httpx.AsyncClient, base_url: str, ids: list[int], early: bool, out: dict) -> None:
    body = {"model": MODEL_NAME, "prompt": ids, "max_tokens": 300, "ignore_eos": True,
            "temperature": 0.8, "stream": True}
    try:
        for _ in range(300):  # a 429 (the tier is full: a place would take too long) is retried, as SDKs do
            async with http.stream("POST", f"{base_url}/v1/completions", json=body) as resp:
                if resp.status_code == 429:
                    out["retried_429"] += 1
                    await resp.aread()
                    await asyncio.sleep(float(resp.headers["retry-after"]))
                    continue
                await _use(resp, early, out)
                return
    except httpx.TimeoutException:
        out["early_timeout"] += 1  # no response headers within the short timeout: hung up early


async def _use(resp: httpx.Response, early: bool, out: dict) -> None:
    if resp.status_code != 200:
        out.setdefault(f"status_{resp.status_code}", 0)
        out[f"status_{resp.status_code}"] += 1
        return
    if early:
        out["early"] += 1
        return  # headers only: the prefill (or the queue) still holds the request
    tokens = 0
    async for line in resp.aiter_lines():
        if line.startswith("data: {"):
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            tokens += 1
            if tokens >= TOKENS_BEFORE_HANGUP:
                out["mid_stream"] += 1
                return  # leaving the block closes the connection mid-stream


async def run_clients(base_url: str) -> dict:
    rng = random.Random(8)
    out = {"mid_stream": 0, "early": 0, "early_timeout": 0, "retried_429": 0}
    sem = asyncio.Semaphore(CONCURRENCY)
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=0)
    early_ids = set(rng.sample(range(CLIENTS), EARLY))

    async def one(i: int) -> None:
        early = i in early_ids
        # An early client gives up after 0.3 s: typically while its prompt is in the prefill.
        timeout = httpx.Timeout(0.3 if early else 120)
        async with sem:
            async with httpx.AsyncClient(timeout=timeout, limits=limits) as http:
                await client(http, base_url, prompt(rng), early, out)

    await asyncio.gather(*(one(i) for i in range(CLIENTS)))
    return out


def test_200_clients_hang_up_mid_request_and_every_engine_returns_to_baseline(base_url):
    baseline = engines()
    assert all(s.requests_running == 0 and s.requests_waiting == 0 for s in baseline.values()), baseline

    started = time.monotonic()
    out = asyncio.run(run_clients(base_url))
    clients_s = time.monotonic() - started
    assert out["mid_stream"] == CLIENTS - EARLY, out  # every streaming client got its tokens, then left
    assert out["early"] + out["early_timeout"] == EARLY, out

    hung_up = time.monotonic()
    while True:
        now = engines()
        settled = all(s.requests_running == 0 and s.requests_waiting == 0
                      and s.kv_cache_usage <= baseline[w].kv_cache_usage + 1e-6 for w, s in now.items())
        if settled or time.monotonic() - hung_up > SETTLE_S:
            break
        time.sleep(0.5)
    settle_s = time.monotonic() - hung_up
    print(f"\n{CLIENTS} clients ({out}) in {clients_s:.1f} s; engines back to baseline {settle_s:.1f} s "
          f"after the last hang-up: " + ", ".join(
              f"{w}: running {s.requests_running:g} waiting {s.requests_waiting:g} kv {s.kv_cache_usage:.4f} "
              f"(baseline {baseline[w].kv_cache_usage:.4f})" for w, s in now.items()))
    assert settled, f"engines still hold work {SETTLE_S} s after the clients left: {now}"
