"""What a removed prefill replica's teardown waits on (prefill_workers/lease_drain.py) read from a
real engine: vLLM's KV usage on the producer stays above 0 while its handoff waits for the pull,
and falls to 0 once the decode engine has pulled the KV over NIXL."""

from __future__ import annotations

import random
import time
import uuid

from vllm import SamplingParams

from cluster.protocol import EngineRequest
from tests.support.integration_cluster import replica_stats

PREFILL, DECODE = "interactive-prefill", "interactive-decode"
PREFILL_REPLICAS = 2
LEASE_S = 35  # vLLM's kv_lease_duration (30 s): what an earlier test left unpulled is let go by then


def _usage(worker_id: str) -> float:
    return replica_stats(PREFILL, PREFILL_REPLICAS)[worker_id].kv_cache_usage


def _wait(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return condition()


def test_a_producer_holds_its_kv_until_the_decode_pulled_it(base_url):
    from ray import serve

    prefill = serve.get_deployment_handle(PREFILL, app_name="tandem")
    decode = serve.get_deployment_handle(DECODE, app_name="tandem")
    assert _wait(lambda: all(s.kv_cache_usage == 0 for s in replica_stats(PREFILL, PREFILL_REPLICAS).values()),
                 LEASE_S), "a prefill engine kept KV blocks past vLLM's lease"
    rng = random.Random(time.time_ns())
    prompt = tuple(rng.randrange(5, 250) for _ in range(300))
    request = EngineRequest(f"lease-{uuid.uuid4()}", prompt, SamplingParams(max_tokens=4, temperature=0,
                                                                           ignore_eos=True), tier="interactive")
    result = prefill.prefill.remote(request).result()
    held = _usage(result.worker_id)
    time.sleep(1.0)  # no pull yet: the blocks stay (the engine steps while it holds them)
    still_held = _usage(result.worker_id)
    before = next(iter(replica_stats(DECODE, 1).values()))
    tokens = [t for chunk in decode.options(stream=True).generate.remote(request, result.handoff)
              for t in chunk.outputs[0].token_ids]
    after = next(iter(replica_stats(DECODE, 1).values()))
    pulled = after.prompt_tokens_transferred - before.prompt_tokens_transferred
    print(f"\nproducer KV usage after the prefill {held:.3f}, 1 s later {still_held:.3f}; "
          f"decode pulled {pulled:g} prompt tokens")
    assert len(tokens) == 4
    assert pulled > 0  # the decode pulled over NIXL (not a recompute)
    assert held > 0 and still_held == held
    assert _wait(lambda: _usage(result.worker_id) == 0, 5.0), "the producer kept its KV after the pull"
