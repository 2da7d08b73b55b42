"""The prefill pool's autoscaling through Ray Serve's own controller with tandem's policy
(cluster/autoscaling/serve_policy.py), FakeEngine in every replica: queued prompt tokens scale
it 1 → 2, idleness back to 1, every request answered, and each change logged with its reason.
Last in the folder (its name): the other tests count on one prefill replica.
The same cycle with real vLLM engines and NIXL: tests/integration/test_tiers_autoscaling.py."""

from __future__ import annotations

import json
import random
import time

import httpx
import pytest

from tests.closed_loop import ClosedLoop, running_replicas, wait_for
from tests.serve.conftest import AUTOSCALING_LOG, MODEL_NAME, replica_stats

pytestmark = pytest.mark.serve

POOL = "interactive-prefill"


def fake_load(url: str, clients: int, prefill_s: float) -> ClosedLoop:
    """Requests of 64 random prompt tokens whose prefill takes `prefill_s` (FakeEngine's knob)."""

    def send(client: httpx.Client, rng: random.Random) -> bool:
        body = {"model": MODEL_NAME, "prompt": [rng.randrange(5, 200) for _ in range(64)], "max_tokens": 2,
                "vllm_xargs": {"fake_prefill_s": prefill_s}}
        try:
            return client.post(f"{url}/v1/completions", json=body, timeout=30).status_code == 200
        except httpx.HTTPError:
            return False

    return ClosedLoop(clients, send, join_timeout_s=30)


def test_queued_prompt_tokens_scale_prefill_up_and_idleness_back_down(graph):
    assert running_replicas(POOL) == 1
    step_wall = time.time()
    with fake_load(graph.url, clients=6, prefill_s=0.5) as up:  # ~6 x 64 tokens queued: 3x the target
        wait_for("a second prefill replica", lambda: running_replicas(POOL) == 2, 90, every_s=0.25)
        wait_for("the new replica to serve prefills",
                 lambda: all(len(s.seen) > 0 for s in replica_stats("prefill", 2).values()), 30, every_s=0.25)
    with fake_load(graph.url, clients=1, prefill_s=0.0) as down:  # light: requests in flight while it leaves
        wait_for("prefill back at 1 replica", lambda: running_replicas(POOL) == 1, 60, every_s=0.25)
        time.sleep(1.0)
    assert up.outcomes[False] == 0 and down.outcomes[False] == 0, (up.outcomes, down.outcomes)
    assert up.outcomes[True] > 0 and down.outcomes[True] > 0
    ticks = [json.loads(line) for line in AUTOSCALING_LOG.read_text().splitlines()]
    reasons = [t["decision"]["reason"] for t in ticks if t["deployment"] == POOL and t["observation"]["now"] >= step_wall]
    assert any(r.startswith("scale up: queued prompt tokens") for r in reasons), reasons[-20:]
    assert any(r.startswith("scale down:") for r in reasons), reasons[-20:]
