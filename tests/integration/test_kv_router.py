"""KV-aware routing on the real session cluster: two prefill engines in the interactive tier.

1. The router's block hashes equal the hashes a real vLLM engine publishes in BlockStored
   for the same prompt (same block size, same hash chain).
2. Repeated prompts sharing a prefix all go to the engine that holds the prefix, and that
   engine's own prefix-cache counter (vLLM's prompt_tokens_by_source, local_cache_hit) rises.
"""

from __future__ import annotations

import random
import time

import httpx
import msgspec
import zmq

from cluster.hashing import BlockHasher
from tests.support.integration_cluster import MODEL_NAME, metric, replica_stats, wait_for_metric


PREFILL = "interactive-prefill"


def routing_stats() -> dict[str, dict]:
    """{worker_id: routing stats} of both prefill replicas, as the gateway's router sees them."""
    from ray import serve

    handle = serve.get_deployment_handle(PREFILL, app_name="tandem")
    seen: dict[str, dict] = {}
    for _ in range(100):
        stats = handle.record_routing_stats.remote().result()
        seen[stats["worker_id"]] = stats
        if len(seen) == 2:
            return seen
    raise AssertionError(f"only {sorted(seen)} answered")


def complete(base_url: str, ids: list[int]) -> None:
    body = {"model": MODEL_NAME, "prompt": ids, "max_tokens": 2, "temperature": 0}
    r = httpx.post(f"{base_url}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text


def tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(5, 250) for _ in range(n)]


def test_router_hashes_equal_the_engines_block_stored_hashes(base_url):
    workers = routing_stats()
    layout = next(iter(workers.values()))
    assert all(s["block_size"] == layout["block_size"] for s in workers.values())
    block = layout["block_size"]
    ctx = zmq.Context.instance()
    subs = []
    for stats in workers.values():
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.setsockopt(zmq.LINGER, 0)
        sub.connect(stats["kv_events"])
        subs.append(sub)
    try:
        time.sleep(1)  # let the SUB sockets join before the request (ZMQ drops earlier messages)
        prompt = tokens(random.Random(time.time_ns()), 2 * block + 7)
        expected = BlockHasher(block, layout["hash_seed"]).hashes(prompt)
        complete(base_url, prompt)
        published: set[int] = set()
        deadline = time.monotonic() + 30
        while not set(expected) <= published and time.monotonic() < deadline:
            for sub in subs:
                while sub.poll(50):
                    _topic, _seq, payload = sub.recv_multipart()
                    for event in msgspec.msgpack.decode(payload)[1]:
                        if event.get("type") == "BlockStored":
                            published.update(event["block_hashes"])
        assert len(expected) == 2
        assert set(expected) <= published, "the engine published other hashes than the router computes"
    finally:
        for sub in subs:
            sub.close()


def test_shared_prefixes_go_to_the_engine_holding_them(base_url):
    block = next(iter(routing_stats().values()))["block_size"]
    rng = random.Random(time.time_ns())
    complete(base_url, tokens(rng, block + 3))  # the gateway follows both engines' events by now
    wait_for_metric("ray_tandem_kv_events_total", 1, kind="batch")  # the gateway received KV events

    prefix = tokens(rng, 2 * block)  # two full blocks shared by every prompt below
    prompts = [prefix + tokens(rng, 20) for _ in range(4)]
    before = replica_stats(PREFILL, 2)
    time.sleep(2)  # earlier requests' metrics reach the export port (1 s report interval)
    hits_before = metric("ray_tandem_routing_decisions_total", tier="interactive", reason="prefix_hit")
    predicted_before = metric("ray_tandem_routing_predicted_hit_tokens_total", tier="interactive", pool="prefill")
    for ids in prompts:
        complete(base_url, ids)
    after = replica_stats(PREFILL, 2)

    def seen(worker: str) -> float:  # prompt tokens this engine handled, computed or cached
        return (after[worker].prompt_tokens_computed + after[worker].prompt_tokens_cached
                - before[worker].prompt_tokens_computed - before[worker].prompt_tokens_cached)

    total = sum(len(p) for p in prompts)
    [holder] = [w for w in after if seen(w) > 0]  # every prompt went to one engine
    assert seen(holder) == total
    cached = after[holder].prompt_tokens_cached - before[holder].prompt_tokens_cached
    assert cached >= 3 * len(prefix)  # prompts 2..4 found the prefix in that engine's cache
    wait_for_metric("ray_tandem_routing_decisions_total", hits_before + 3, tier="interactive", reason="prefix_hit")
    wait_for_metric("ray_tandem_routing_predicted_hit_tokens_total", predicted_before + 3 * len(prefix),
                    tier="interactive", pool="prefill")
