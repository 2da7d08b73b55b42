"""A /health (or any GET) flood from a process of its own, for tests/integration/
test_security_edge.py. Its own module, light on imports: a spawned child imports the module of
its target, and the test's module imports vLLM (seconds per child on a busy 2-core host)."""

from __future__ import annotations

import asyncio
import time

import httpx


def flood(url: str, seconds: float, out) -> None:
    """≥ 500 /health calls per second for `seconds` (a separate process: the stream's timing is not
    disturbed by this client's own event loop)."""
    async def main() -> tuple[int, int]:
        done = errors = 0
        stop_at = time.monotonic() + seconds
        async with httpx.AsyncClient(timeout=10, limits=httpx.Limits(max_connections=64)) as client:
            async def worker() -> None:
                nonlocal done, errors
                while time.monotonic() < stop_at:
                    try:
                        r = await client.get(url)
                        done += 1
                        errors += r.status_code != 200
                    except httpx.HTTPError:
                        errors += 1
            await asyncio.gather(*(worker() for _ in range(64)))
        return done, errors

    out.put(asyncio.run(main()))
