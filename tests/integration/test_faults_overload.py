"""Open-loop load at about 3x capacity on the interactive tier: the excess gets 429 with
Retry-After, nothing crashes, every admitted request completes.

Capacity is measured first (closed loop, as many clients as the tier admits, a few seconds);
then requests arrive at 3x that rate regardless of answers (open loop) for 25 s. The tier
admits 16 running and 32 queued (tests/integration/conftest.py), so the backlog overflows
within seconds and the gateway must refuse it before any engine work.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tests.integration.conftest import MODEL_NAME, replica_stats

pytestmark = pytest.mark.integration

BODY = {"model": MODEL_NAME, "prompt": "Under heavy load the gateway", "max_tokens": 16, "ignore_eos": True,
        "temperature": 0}
OPEN_LOOP_S = 25
POOLS = {"interactive-prefill": 2, "interactive-decode": 1}


async def closed_loop_rate(base_url: str, clients: int, seconds: float) -> float:
    done = 0
    deadline = time.monotonic() + seconds
    async with httpx.AsyncClient(timeout=120) as http:
        async def loop() -> None:
            nonlocal done
            while time.monotonic() < deadline:
                r = await http.post(f"{base_url}/v1/completions", json=BODY)
                assert r.status_code == 200, r.text
                done += 1
        started = time.monotonic()
        await asyncio.gather(*(loop() for _ in range(clients)))
        return done / (time.monotonic() - started)


async def open_loop(base_url: str, rate: float, seconds: float) -> list[tuple[int, float, str]]:
    results: list[tuple[int, float, str]] = []
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
    async with httpx.AsyncClient(timeout=180, limits=limits) as http:
        async def one() -> None:
            sent = time.monotonic()
            r = await http.post(f"{base_url}/v1/completions", json=BODY)
            results.append((r.status_code, time.monotonic() - sent,
                            r.headers.get("retry-after", "") if r.status_code == 429 else r.text))
        tasks = []
        started = time.monotonic()
        n = 0
        while time.monotonic() - started < seconds:
            tasks.append(asyncio.ensure_future(one()))
            n += 1
            await asyncio.sleep(max(0.0, started + n / rate - time.monotonic()))
        await asyncio.gather(*tasks)
    return results


def test_three_times_capacity_gets_429_for_the_excess_and_the_rest_completes(base_url):
    workers_before = {w for pool, n in POOLS.items() for w in replica_stats(pool, n)}
    capacity = asyncio.run(closed_loop_rate(base_url, clients=16, seconds=8))
    rate = 3 * capacity
    results = asyncio.run(open_loop(base_url, rate, OPEN_LOOP_S))

    statuses = [s for s, _, _ in results]
    ok = [lat for s, lat, _ in results if s == 200]
    refused = [(lat, retry) for s, lat, retry in results if s == 429]
    lat = sorted(ok)
    print(f"\ncapacity {capacity:.1f} req/s closed loop; open loop {rate:.1f} req/s for {OPEN_LOOP_S} s: "
          f"{len(results)} sent, {len(ok)} ok (latency p50 {lat[len(lat) // 2]:.2f} s, "
          f"p95 {lat[int(len(lat) * 0.95)]:.2f} s), {len(refused)} got 429 "
          f"(answered within {max(r[0] for r in refused):.3f} s)" if refused and lat else f"\n{results[:5]}")
    assert set(statuses) <= {200, 429}, [r for r in results if r[0] not in (200, 429)][:5]
    assert refused, "3x capacity never overflowed the tier's queue"
    assert all(retry.isdigit() for _, retry in refused)  # Retry-After on every 429
    assert len(ok) >= capacity * OPEN_LOOP_S * 0.5  # the admitted share kept being served
    # No crash, no out-of-memory: the same engines answer, and the gateway is ready.
    assert {w for pool, n in POOLS.items() for w in replica_stats(pool, n)} == workers_before
    assert httpx.get(f"{base_url}/health", timeout=30).status_code == 200
