"""Hostile input against the real cluster costs the sender, not the cluster (issue 16, request
path): bounds at the edge, the body-read deadline, /health under a flood, KV-event frames that
are not vLLM's, handoffs past their lease, and per-tenant prefix caches."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import random
import socket
import statistics
import threading
import time
import uuid
from typing import Optional

import httpx
import pytest
from vllm import SamplingParams

from cluster.protocol import EngineRequest
from loadtest.measure.percentiles import percentile
from loadtest.measure.sse import StreamReader
from tests.integration.test_faults_kv_transfer import decode_text
from tests.support.flood import flood
from tests.support.integration_cluster import GATEWAY_PORT, MODEL_NAME, metric, replica_stats, wait_for_metric


DECODE = "interactive-decode"
CHAT = [{"role": "user", "content": "hi"}]


def deep_schema(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def _error(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text
    assert "Traceback" not in resp.text
    return resp.json()["error"]


DEEP = [
    ("/v1/completions", {"prompt": "hi", "structured_outputs": {"json": deep_schema(120)}}),
    ("/v1/chat/completions", {"messages": CHAT, "structured_outputs": {"json": deep_schema(120)}}),
    ("/v1/chat/completions", {"messages": CHAT, "response_format": {
        "type": "json_schema", "json_schema": {"name": "a", "schema": deep_schema(120)}}}),
    ("/v1/chat/completions", {"messages": CHAT, "tools": [
        {"type": "function", "function": {"name": "f", "parameters": deep_schema(120)}}]}),
    ("/v1/completions", {"prompt": "hi", "structured_outputs": {"json": json.dumps(deep_schema(120))}}),
]


@pytest.mark.parametrize("route,extra", DEEP)
def test_deep_nesting_in_each_field_is_a_400(base_url, route, extra):
    error = _error(httpx.post(f"{base_url}{route}", json={"model": MODEL_NAME, **extra}, timeout=30), 400)
    assert "nested deeper than 64" in error["message"] and error["param"]


def test_a_nul_in_a_regex_is_a_400_and_the_cluster_serves_on(base_url):
    body = {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 4, "structured_outputs": {"regex": "a\x00b"}}
    error = _error(httpx.post(f"{base_url}/v1/completions", json=body, timeout=30), 400)
    assert "NUL" in error["message"] and error["param"] == "structured_outputs"
    ok = httpx.post(f"{base_url}/v1/completions", json={"model": MODEL_NAME, "prompt": "hi", "max_tokens": 2},
                    timeout=60)
    assert ok.status_code == 200, ok.text


def test_a_foreign_host_header_is_refused(base_url):
    r = httpx.get(f"{base_url}/v1/models", headers={"Host": "rebound.example:8765"}, timeout=30)
    assert _error(r, 421)["code"] == "host_not_allowed"
    assert httpx.get(f"{base_url}/v1/models", timeout=30).status_code == 200


def _latency(base_url: str) -> float:
    started = time.perf_counter()
    r = httpx.post(f"{base_url}/v1/completions", json={"model": MODEL_NAME, "prompt": "hi", "max_tokens": 1},
                   timeout=60)
    assert r.status_code == 200, r.text
    return time.perf_counter() - started


def _slow_sender(results: list, index: int) -> None:
    """Headers and a start of the body, then nothing: how long until the gateway answers, and what."""
    sock = socket.create_connection(("127.0.0.1", GATEWAY_PORT), timeout=60)
    try:
        started = time.perf_counter()
        sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{GATEWAY_PORT}\r\n"
                     "Content-Type: application/json\r\nContent-Length: 500\r\n\r\n{\"model\": ".encode())
        answer = b""
        while b"\r\n\r\n" not in answer:
            part = sock.recv(4096)
            if not part:
                break
            answer += part
        results[index] = (answer.split(b"\r\n", 1)[0].decode(errors="replace"), time.perf_counter() - started)
    finally:
        sock.close()


def test_a_slow_body_is_a_408_within_the_deadline_while_others_keep_their_latency(base_url):
    deadline_s = 10.0  # gateway.body_read_timeout_s default
    before = [_latency(base_url) for _ in range(5)]
    results: list = [None] * 16
    threads = [threading.Thread(target=_slow_sender, args=(results, i)) for i in range(len(results))]
    for t in threads:
        t.start()
    time.sleep(1)
    during = [_latency(base_url) for _ in range(5)]
    for t in threads:
        t.join(timeout=deadline_s + 30)
    print(f"\nslow senders: {results[0]}; latency p50 before {statistics.median(before):.3f} s, "
          f"during {statistics.median(during):.3f} s")
    for status_line, took in results:
        assert " 408 " in status_line, status_line
        assert deadline_s - 0.5 <= took < deadline_s + 5
    assert statistics.median(during) < 3 * statistics.median(before) + 0.2


def _stream_gaps(base_url: str, max_tokens: int = 48) -> tuple[list[float], str]:
    body = {"model": MODEL_NAME, "prompt": "count with me: one two three", "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True}
    """(the gaps between streamed tokens in ms, the text)."""
    reader = StreamReader(time.perf_counter())
    with httpx.stream("POST", f"{base_url}/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            reader.feed(line, time.perf_counter())
    return list(reader.record(time.perf_counter()).token_gaps_ms), reader.text


def test_a_health_flood_leaves_a_stream_working(base_url):
    """As many /health calls as the box takes (aiming at >= 500/s) for 10 s from two client
    processes, while a greedy stream runs: the stream gives the same answer, no call fails, and
    the engines are probed at most once per health interval (1 s) however many calls come."""
    base_gaps, base_text = _stream_gaps(base_url)
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    flood_s = 10.0
    probes_before = metric("ray_tandem_health_probes_total")
    started = time.monotonic()
    floods = [ctx.Process(target=flood, args=(f"{base_url}/health", flood_s, out)) for _ in range(2)]
    for proc in floods:
        proc.start()
    try:
        time.sleep(2.0)  # the clients are up (spawn + imports) and at full rate
        flood_gaps, flood_text = _stream_gaps(base_url)
        counts = [out.get(timeout=flood_s + 60) for _ in floods]
    finally:
        for proc in floods:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    elapsed = time.monotonic() - started
    time.sleep(2.5)  # the gateway's counter reaches the export port (1 s report interval)
    probes = metric("ray_tandem_health_probes_total") - probes_before
    done, errors = sum(c[0] for c in counts), sum(c[1] for c in counts)
    rate = done / flood_s
    p50 = statistics.median(flood_gaps) / statistics.median(base_gaps)
    p90 = percentile(flood_gaps, 90) / percentile(base_gaps, 90)
    mean = statistics.fmean(flood_gaps) / statistics.fmean(base_gaps)
    print(f"\n/health flood: {done} calls in {flood_s:g} s ({rate:.0f} calls/s), {errors} errors, "
          f"{probes:g} engine probes in {elapsed:.1f} s; stream token gap p50 "
          f"{statistics.median(base_gaps):.1f} ms -> {statistics.median(flood_gaps):.1f} ms "
          f"(x{p50:.2f}), p90 x{p90:.2f}, mean x{mean:.2f}")
    # What the HTTP path itself takes here (Serve's proxy → the gateway replica, no engine):
    # /livez at the same concurrency, for comparison with the /health rate.
    livez = [ctx.Process(target=flood, args=(f"{base_url}/livez", 3.0, out)) for _ in range(2)]
    for p in livez:
        p.start()
    livez_done = sum(out.get(timeout=60)[0] for _ in livez)
    for p in livez:
        p.join(timeout=30)
    print(f"/livez at the same concurrency: {livez_done / 3.0:.0f} calls/s")
    assert flood_text == base_text  # greedy: the same answer, not cut off
    assert errors == 0
    assert probes <= elapsed + 3  # one probe per interval at most, whatever the call rate
    assert done >= 10 * probes
    assert httpx.get(f"{base_url}/health", timeout=30).status_code == 200


def test_a_malformed_kv_frame_is_counted_and_the_index_rebuilt(base_url):
    """A real engine's KV events, through a relay that also injects frames vLLM never sends, into
    the gateway's subscriber class: it stays alive, counts them, and its index matches the blocks
    the engine holds afterwards (rebuilt from the engine's replay buffer)."""
    import zmq
    from ray import serve

    from cluster.hashing import BlockHasher
    from router.kv_events import KVEventSubscriber
    from router.prefix_index import MemoryPrefixIndex

    stats = serve.get_deployment_handle(DECODE, app_name="tandem").record_routing_stats.remote().result()
    ctx = zmq.Context.instance()
    upstream = ctx.socket(zmq.SUB)
    upstream.setsockopt(zmq.SUBSCRIBE, b"")
    upstream.setsockopt(zmq.LINGER, 0)
    upstream.connect(stats["kv_events"])
    relay = ctx.socket(zmq.PUB)
    relay.setsockopt(zmq.LINGER, 0)
    relay.bind("tcp://127.0.0.1:0")
    index = MemoryPrefixIndex()
    kinds: list[str] = []
    sub = KVEventSubscriber(stats["worker_id"], relay.getsockopt_string(zmq.LAST_ENDPOINT), stats["kv_replay"],
                            index, on_event=kinds.append)
    stop = threading.Event()
    inject: list[list[bytes]] = []

    def forward() -> None:
        while not stop.is_set():
            while inject:
                relay.send_multipart(inject.pop(0))
            if upstream.poll(20):
                relay.send_multipart(upstream.recv_multipart())

    thread = threading.Thread(target=forward, daemon=True)
    thread.start()
    sub.start()
    try:
        time.sleep(1)  # SUB sockets joined
        block = stats["block_size"]
        rng = random.Random(time.time_ns())
        prompt = [rng.randrange(5, 250) for _ in range(3 * block + 5)]
        hashes = BlockHasher(block, stats["hash_seed"]).hashes(prompt)
        decode = serve.get_deployment_handle(DECODE, app_name="tandem")
        request = EngineRequest(f"kv-frame-{uuid.uuid4()}", tuple(prompt), SamplingParams(max_tokens=2, temperature=0), tier="interactive")
        for _ in decode.options(stream=True).generate.remote(request, None):
            pass
        deadline = time.monotonic() + 30
        while index.match(hashes) != {stats["worker_id"]: len(hashes)} and time.monotonic() < deadline:
            time.sleep(0.1)
        assert index.match(hashes) == {stats["worker_id"]: len(hashes)}
        kinds.clear()
        inject.extend([[b"garbage"], [b"", (10**9).to_bytes(8, "big"), b"\xc1 not msgpack"]])
        deadline = time.monotonic() + 30
        while kinds.count("malformed") < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        # Rebuilt from the engine's replay buffer: the prompt's blocks are known again (polled:
        # the rebuild runs after the count), and the subscriber follows new batches.
        deadline = time.monotonic() + 30
        while index.match(hashes) != {stats["worker_id"]: len(hashes)} and time.monotonic() < deadline:
            time.sleep(0.1)
        print(f"\nsubscriber events after the injection: {kinds}")
        assert kinds.count("malformed") >= 2 and kinds.count("rebuild") >= 2
        assert not sub.crashed
        assert index.match(hashes) == {stats["worker_id"]: len(hashes)}
        prompt2 = [rng.randrange(5, 250) for _ in range(2 * block)]
        request2 = EngineRequest(f"kv-frame-{uuid.uuid4()}", tuple(prompt2), SamplingParams(max_tokens=2), tier="interactive")
        for _ in decode.options(stream=True).generate.remote(request2, None):
            pass
        hashes2 = BlockHasher(block, stats["hash_seed"]).hashes(prompt2)
        deadline = time.monotonic() + 30
        while index.match(hashes2) != {stats["worker_id"]: len(hashes2)} and time.monotonic() < deadline:
            time.sleep(0.1)
        assert index.match(hashes2) == {stats["worker_id"]: len(hashes2)}
    finally:
        sub.stop()
        stop.set()
        thread.join(timeout=5)
        upstream.close()
        relay.close()


def test_a_handoff_past_its_lease_is_recomputed_never_pulled(base_url):
    from ray import serve

    prefill = serve.get_deployment_handle("interactive-prefill", app_name="tandem")
    decode = serve.get_deployment_handle(DECODE, app_name="tandem")
    rng = random.Random(time.time_ns())
    prompt = tuple(rng.randrange(5, 250) for _ in range(300))
    sampling = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    request = EngineRequest(f"lease-{uuid.uuid4()}", prompt, sampling, tier="interactive")
    result = prefill.prefill.remote(request).result()
    assert result.handoff.lease_deadline is not None and result.handoff.lease_deadline > time.time()
    expired = dataclasses.replace(result.handoff, lease_deadline=time.time() - 1)
    counted = metric("ray_tandem_handoffs_expired_total", tier="interactive")
    before = next(iter(replica_stats(DECODE, 1).values()))
    ids, text = decode_text(decode, request, expired)
    after = next(iter(replica_stats(DECODE, 1).values()))
    expected = decode_text(decode, EngineRequest(f"lease-ref-{uuid.uuid4()}", prompt, sampling, tier="interactive"), None)
    assert (ids, text) == expected and len(ids) == 8  # the request's own answer
    assert after.prompt_tokens_transferred == before.prompt_tokens_transferred  # nothing pulled
    wait_for_metric("ray_tandem_handoffs_expired_total", counted + 1, tier="interactive")


def test_two_tenants_salts_keep_their_prefix_caches_apart(base_url):
    """Through the decode engine's handle, as the gateway sends them with auth.prefix_cache
    isolate: the same prompt under tenant B's salt finds nothing of tenant A's in the cache; with
    the same salt (or share: none) it does."""
    from ray import serve

    from router.auth import cache_salt

    decode = serve.get_deployment_handle(DECODE, app_name="tandem")
    rng = random.Random(time.time_ns())
    prompt = tuple(rng.randrange(5, 250) for _ in range(200))

    def cached_tokens(salt: Optional[str]) -> float:
        before = next(iter(replica_stats(DECODE, 1).values())).prompt_tokens_cached
        request = EngineRequest(f"tenant-{uuid.uuid4()}", prompt, SamplingParams(max_tokens=1), cache_salt=salt, tier="interactive")
        decode_text(decode, request, None)
        return next(iter(replica_stats(DECODE, 1).values())).prompt_tokens_cached - before

    a, b = cache_salt("tenant-a"), cache_salt("tenant-b")
    first_a = cached_tokens(a)
    again_a = cached_tokens(a)
    then_b = cached_tokens(b)
    shared_1, shared_2 = cached_tokens(None), cached_tokens(None)
    print(f"\ncached prompt tokens: A {first_a:g}, A again {again_a:g}, B {then_b:g}; share {shared_1:g}, "
          f"{shared_2:g}")
    assert first_a == 0 and then_b == 0 and shared_1 == 0  # isolate: B gets no hit on A's prefix
    assert again_a > 0 and again_a == shared_2  # the same tenant (or share) does: every full block of 200
