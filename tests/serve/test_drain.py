"""A decode replica that Serve removes finishes its streams before it stops (issue 29, item 2).

Serve's graceful shutdown is the drain: a replica it removes gets no new requests and is
stopped when its ongoing requests end, or at the pool's drain_timeout_s (cluster/app.py; here
the decode default, 512 tokens at 0.1 s = 51 s). A decode stream is ongoing until its answer
ends (its run call; decode_workers/deployment.py). Here the decode pool goes from 2 replicas to
1 through Serve's external scaling API while streams run on both: every stream ends whole,
none was cut and continued elsewhere (no migration counted), and the removed replica is gone
after its streams ended. Then the pool goes back to 2 for the tests after this one."""

from __future__ import annotations

import time

import pytest

from cluster.engine.fake import fake_tokens
from tests.support.closed_loop import running_replicas, wait_for
from tests.support.serve_graph import DECODE_REPLICAS, Stream, migrations_continued, replica_stats

DECODE = "interactive-decode"
TOKEN_S = 0.05
MAX_TOKENS = 160  # 8 s per stream: the scale-down lands in the middle of every one
MAX_STREAMS = 6


def _set_decode_replicas(n: int) -> None:
    """Serve's external scaling API (the app is deployed with external_scaler_enabled): the
    controller's own entry point, as its REST route calls it."""
    import ray
    from ray.serve import context
    from ray.serve._private.common import DeploymentID

    from cluster.types import APP_NAME

    controller = context._global_client._controller
    ray.get(controller.update_deployment_replicas.remote(DeploymentID(name=DECODE, app_name=APP_NAME), n))


def _running_on_each_replica() -> dict[str, float]:
    return {worker: stats.requests_running for worker, stats in replica_stats("decode", DECODE_REPLICAS).items()}


@pytest.mark.usefixtures("drains_decode")
def test_a_removed_decode_replica_finishes_its_streams_before_it_stops(graph):
    wait_for("both decode replicas running", lambda: running_replicas(DECODE) == DECODE_REPLICAS, 120)
    migrated_before = migrations_continued(graph)
    streams: list[Stream] = []
    # Streams until both replicas have one: the one Serve removes must be draining something.
    while len(streams) < MAX_STREAMS:
        prompt = [11 + len(streams), 42, 99, 7, 250, 31, 64, 12, 88, 140, 23, 5, 77, 190, 46, 61]
        streams.append(Stream(graph, prompt, MAX_TOKENS, TOKEN_S))
        streams[-1].start()
        wait_for("the stream's first tokens", lambda: len(streams[-1].texts) >= 3 or streams[-1].error, 30, 0.05)
        if len(streams) >= 2 and all(n >= 1 for n in _running_on_each_replica().values()):
            break
    running = _running_on_each_replica()
    assert all(n >= 1 for n in running.values()), f"streams on one replica only: {running}"

    scaled_at = time.monotonic()
    _set_decode_replicas(DECODE_REPLICAS - 1)
    wait_for("Serve stopping one decode replica", lambda: running_replicas(DECODE, state="STOPPING") >= 1, 10, 0.1)
    for s in streams:
        s.join(timeout=60)
    ended_at = max(s.times[-1] for s in streams if s.times)
    wait_for("the removed replica gone", lambda: running_replicas(DECODE, state="STOPPING") == 0, 60, 0.2)
    gone_at = time.monotonic()

    for s in streams:
        expected = "".join(f"{t} " for t in fake_tokens(s.prompt, MAX_TOKENS, graph.vocab_size))
        assert not s.is_alive() and s.error is None, s.error
        # One text: a chunk may carry several tokens (the decode channel's merge, cluster/engine/outbox.py).
        assert "".join(s.texts) == expected and s.finish == "length"
    gaps = [b - a for s in streams for a, b in zip(s.times, s.times[1:])]
    assert migrations_continued(graph) == migrated_before, \
        "a stream was cut and continued elsewhere: the removed replica did not drain"
    assert gone_at >= ended_at - 0.5  # it stopped after its streams, not before
    print(f"\n[drain] {len(streams)} streams on {running}; scaled down 2 → 1: every stream whole, "
          f"longest gap {max(gaps) * 1000:.0f} ms (token every {TOKEN_S * 1000:.0f} ms); the removed "
          f"replica gone {gone_at - scaled_at:.1f} s after the scale-down, {gone_at - ended_at:.1f} s after "
          f"the last stream ended")

    _set_decode_replicas(DECODE_REPLICAS)
    wait_for("both decode replicas running again", lambda: running_replicas(DECODE) == DECODE_REPLICAS, 120)
