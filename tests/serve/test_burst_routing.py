"""A burst of streams spreads over the decode replicas (the router's decode booking,
router/routing/ledger.py): a remote request's decode hop starts only after its prefill, so
requests routed meanwhile must count the decode picks already made, or they all see idle
replicas and pile onto one (seen on real engines before the booking: 3 of 4 on one replica)."""

from __future__ import annotations

import random

from tests.support.closed_loop import running_replicas, wait_for
from tests.support.serve_graph import DECODE_REPLICAS, Stream, replica_stats

DECODE = "interactive-decode"
BURST = 2 * DECODE_REPLICAS


def test_a_burst_of_streams_spreads_evenly_over_the_decode_replicas(graph):
    wait_for("both decode replicas running", lambda: running_replicas(DECODE) == DECODE_REPLICAS, 120)
    rng = random.Random(5)
    for attempt in range(3):  # three bursts: an even split by chance is 3 in 8 each time
        streams = [Stream(graph, [rng.randrange(10, 400) for _ in range(24)], 120, 0.05) for _ in range(BURST)]
        for s in streams:
            s.start()
        wait_for("every stream's first tokens", lambda: all(len(s.texts) >= 3 or s.error for s in streams), 60, 0.05)
        # A handle call goes to a replica with room first: with the burst on one replica, that
        # one answers only once its streams ended, and reads 0.
        running = sorted(stats.requests_running for stats in replica_stats("decode", DECODE_REPLICAS).values())
        for s in streams:
            s.join(timeout=60)
        assert all(s.error is None and s.finish == "length" for s in streams), [s.error for s in streams]
        assert running == [BURST // DECODE_REPLICAS] * DECODE_REPLICAS, f"burst {attempt}: {running}"
