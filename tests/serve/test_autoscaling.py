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

from tests.support.closed_loop import ClosedLoop, running_replicas, wait_for
from tests.support.serve_graph import AUTOSCALING_LOG, MODEL_NAME, replica_stats


POOL = "interactive-prefill"


def fake_load(url: str, clients: int, prompt_tokens: int, prefill_s: float) -> ClosedLoop:
    """Requests of `prompt_tokens` random prompt tokens whose prefill takes `prefill_s`
    (FakeEngine's knob). Few, long prefills: queued tokens without a flood of requests, whose
    CPU (on 2 cores) would slow the new replica's start."""

    def send(client: httpx.Client, rng: random.Random) -> bool:
        body = {"model": MODEL_NAME, "prompt": [rng.randrange(5, 200) for _ in range(prompt_tokens)], "max_tokens": 2,
                "vllm_xargs": {"fake_prefill_s": prefill_s}}
        try:
            return client.post(f"{url}/v1/completions", json=body, timeout=30).status_code == 200
        except httpx.HTTPError:
            return False

    return ClosedLoop(clients, send, join_timeout_s=30)


@pytest.mark.usefixtures("scales_prefill")
def test_queued_prompt_tokens_scale_prefill_up_and_idleness_back_down(graph):
    assert running_replicas(POOL) == 1
    step_wall = time.time()
    # ~3 x 128 tokens queued, 2.5-3x the target; each prefill well inside the 2 s prefill timeout.
    with fake_load(graph.url, clients=3, prompt_tokens=128, prefill_s=0.75) as up:
        wait_for("a second prefill replica", lambda: running_replicas(POOL) == 2, 90, every_s=0.25)
        wait_for("the new replica to serve prefills",
                 lambda: all(len(s.seen) > 0 for s in replica_stats("prefill", 2).values()), 30, every_s=0.25)
    # Light (at most 16 tokens queued, a scale-down needs under 64): requests in flight while it leaves.
    with fake_load(graph.url, clients=1, prompt_tokens=16, prefill_s=0.1) as down:
        wait_for("prefill back at 1 replica", lambda: running_replicas(POOL) == 1, 60, every_s=0.25)
        time.sleep(1.0)
    assert up.outcomes[False] == 0 and down.outcomes[False] == 0, (up.outcomes, down.outcomes)
    assert up.outcomes[True] > 0 and down.outcomes[True] > 0
    ticks = [json.loads(line) for line in AUTOSCALING_LOG.read_text().splitlines()]
    reasons = [t["decision"]["reason"] for t in ticks if t["deployment"] == POOL and t["observation"]["now"] >= step_wall]
    assert any(r.startswith("scale up: queued prompt tokens") for r in reasons), reasons[-20:]
    assert any(r.startswith("scale down:") for r in reasons), reasons[-20:]
