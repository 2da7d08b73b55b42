"""The decode hop's deadlines: no first token within the bound is a 429 (the request gives its
admission place back instead of hanging on it), Serve's full queue is a 429, and aborts are
timed so a stuck replica cannot hold the caller."""

from __future__ import annotations

import asyncio
import time

import pytest

from cluster.app import max_queued_requests
from cluster.config import AdmissionConfig
from router.pd import hops
from router.openai.errors import OpenAIError
from tests.unit.test_disagg_abort import make_backend, request


def test_a_decode_with_no_first_token_is_a_429_within_the_deadline():
    async def main():
        backend, pools = make_backend()
        backend.hops._decode_first_token_timeout_s = 0.2
        pools.decode.hang_decode = True
        it = backend.generate(request(0))
        await anext(it)  # the prefill's token (first-token reuse); then the decode hop
        started = time.perf_counter()
        with pytest.raises(OpenAIError) as exc:
            await anext(it)
        return backend, pools, exc.value, time.perf_counter() - started

    backend, pools, error, seconds = asyncio.run(main())
    assert error.status == 429 and error.headers.get("Retry-After") is not None
    assert "first token" in error.message
    assert 0.2 <= seconds < 1.0
    assert len(pools.decode.replica_of("generate", "req-0")) == 1  # a timeout is not retried: no double hold
    assert backend.hops._in_flight == {}


def test_a_slow_first_token_within_the_deadline_streams_on():
    async def main():
        backend, _ = make_backend()
        backend.hops._decode_first_token_timeout_s = 1.0
        it = backend.generate(request(1))
        chunks = [await anext(it) for _ in range(5)]  # each 10 ms apart: later gaps are not bounded
        await it.aclose()
        return chunks

    assert len(asyncio.run(main())) == 5


def test_serve_backpressure_on_decode_is_a_429():
    from ray.serve.exceptions import BackPressureError

    async def main():
        backend, pools = make_backend()
        pools.decode.refuse = BackPressureError(num_queued_requests=40, max_queued_requests=32)
        it = backend.generate(request(2))
        await anext(it)  # the prefill's token (first-token reuse); then the decode hop
        with pytest.raises(OpenAIError) as exc:
            await anext(it)
        return pools, exc.value

    pools, error = asyncio.run(main())
    assert error.status == 429 and "queue is full" in error.message
    assert len(pools.decode.replica_of("generate", "req-2")) == 1


def test_an_abort_that_never_answers_is_given_up(monkeypatch):
    monkeypatch.setattr(hops, "ABORT_TIMEOUT_S", 0.2)

    async def main():
        backend, pools = make_backend()
        pools.decode.hang_abort = True
        it = backend.generate(request(3))
        await anext(it)  # the prefill's token
        await anext(it)  # decode's: its hop is in flight
        started = time.perf_counter()
        await backend.abort("req-3")
        seconds = time.perf_counter() - started
        await it.aclose()
        return pools, seconds

    pools, seconds = asyncio.run(main())
    assert pools.decode.replica_of("abort", "req-3")  # it was sent
    assert 0.2 <= seconds < 1.0


def test_serve_queues_are_bounded_by_admission():
    assert max_queued_requests(AdmissionConfig(max_running=16)) == 32
    from cluster.app import _pool_options
    from cluster.config import PoolConfig, SLOConfig

    options = _pool_options(PoolConfig(), "decode", SLOConfig(), AdmissionConfig(max_running=64), 2048)
    assert options["max_queued_requests"] == 80


def test_a_removed_replica_drains_for_the_tiers_longest_answer():
    """Serve's graceful shutdown is the drain (cluster/app.py drain_timeout_s): a decode replica
    waits for an answer of the whole context at the tier's inter-token objective."""
    from cluster.app import _pool_options, drain_timeout_s
    from cluster.config import PoolConfig, SLOConfig

    slo = SLOConfig(itl_s=0.05)
    assert drain_timeout_s(PoolConfig(), "decode", slo, 2048) == 2048 * 0.05
    assert drain_timeout_s(PoolConfig(), "decode", slo, 128) == 20.0  # never under what Serve had
    assert drain_timeout_s(PoolConfig(), "prefill", slo, 2048) == 20.0 + 22.0  # prompts, then the last lease
    assert drain_timeout_s(PoolConfig(drain_timeout_s=7), "decode", slo, 2048) == 7
    options = _pool_options(PoolConfig(), "decode", slo, AdmissionConfig(), 4096)
    assert options["graceful_shutdown_timeout_s"] == 4096 * 0.05
