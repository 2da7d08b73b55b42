"""The prefill pool's autoscaling through Ray Serve's own controller with tandem's policy
(cluster/autoscaling/serve_policy.py), FakeEngine in every replica: queued prompt tokens scale
it 1 → 2, idleness back to 1, every request answered, and each change logged with its reason.
Last in the folder (its name): the other tests count on one prefill replica.
The same cycle with real vLLM engines and NIXL: tests/integration/test_tiers_autoscaling.py."""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter

import httpx
import pytest

from tests.serve.conftest import AUTOSCALING_LOG, MODEL_NAME, replica_stats

pytestmark = pytest.mark.serve

POOL = "interactive-prefill"


def running_replicas() -> int:
    from ray import serve

    status = serve.status().applications["tandem"].deployments[POOL]
    return sum(n for state, n in status.replica_states.items() if getattr(state, "value", state) == "RUNNING")


def wait_for(what: str, condition, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.25)


class Load:
    """Client threads sending requests whose prefill takes `prefill_s`, until stopped."""

    def __init__(self, url: str, clients: int, prefill_s: float):
        self.url, self.prefill_s = url, prefill_s
        self.outcomes: Counter = Counter()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(clients)]

    def _run(self, seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                body = {"model": MODEL_NAME, "prompt": [rng.randrange(5, 200) for _ in range(64)], "max_tokens": 2,
                        "vllm_xargs": {"fake_prefill_s": self.prefill_s}}
                try:
                    ok = client.post(f"{self.url}/v1/completions", json=body).status_code == 200
                except httpx.HTTPError:
                    ok = False
                self.outcomes[ok] += 1

    def __enter__(self) -> "Load":
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)


def test_queued_prompt_tokens_scale_prefill_up_and_idleness_back_down(graph):
    assert running_replicas() == 1
    step_wall = time.time()
    with Load(graph.url, clients=6, prefill_s=0.5) as up:  # ~6 x 64 tokens queued: 3x the target
        wait_for("a second prefill replica", lambda: running_replicas() == 2, 90)
        wait_for("the new replica to serve prefills",
                 lambda: all(len(s.seen) > 0 for s in replica_stats("prefill", 2).values()), 30)
    with Load(graph.url, clients=1, prefill_s=0.0) as down:  # light: requests in flight while it leaves
        wait_for("prefill back at 1 replica", lambda: running_replicas() == 1, 60)
        time.sleep(1.0)
    assert up.outcomes[False] == 0 and down.outcomes[False] == 0, (up.outcomes, down.outcomes)
    assert up.outcomes[True] > 0 and down.outcomes[True] > 0
    ticks = [json.loads(line) for line in AUTOSCALING_LOG.read_text().splitlines()]
    reasons = [t["decision"]["reason"] for t in ticks if t["deployment"] == POOL and t["observation"]["now"] >= step_wall]
    assert any(r.startswith("scale up: queued prompt tokens") for r in reasons), reasons[-20:]
    assert any(r.startswith("scale down:") for r in reasons), reasons[-20:]
