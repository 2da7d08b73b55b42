"""cluster/types.py: a pool's names formatted in one place, and RoutingStats across Serve's
dict boundary (the replica sends to_dict(), the gateway's Serve router parses from_dict())."""

from __future__ import annotations

from cluster.types import APP_NAME, PoolId, RoutingStats, TierPools
from router.routing.directory import ReplicaInfo, directory_of, pool_directory
from router.routing.service import worker_from


def test_a_pool_is_named_in_one_place():
    pool = PoolId("interactive", "prefill")
    assert pool.deployment_name == "interactive-prefill"
    assert pool.worker_id("abc123") == "interactive-prefill-abc123"
    # The gateway's KVRouter and Serve's router (which knows only Serve's names) meet in one directory.
    assert pool_directory(pool) is directory_of(APP_NAME, "interactive-prefill")
    pools = TierPools(prefill="p", decode="d")
    assert (pools.of("prefill"), pools.of("decode")) == ("p", "d")


def test_routing_stats_round_trip_and_leave_unset_fields_out():
    stats = RoutingStats(worker_id="interactive-decode-x", block_size=16, hash_seed="0", kv_usage=0.3,
                         running_seqs=2, step_s=0.05, step_n=40, kv_events="tcp://10.0.0.1:5557")
    sent = stats.to_dict()
    assert "kv_replay" not in sent and sent["step_s"] == 0.05
    assert RoutingStats.from_dict(sent) == stats
    idle = RoutingStats(worker_id="w").to_dict()
    assert "step_s" not in idle and "step_n" not in idle  # an idle report stays the same


def test_from_dict_ignores_unknown_keys_and_coerces_numbers():
    stats = RoutingStats.from_dict({"worker_id": "w", "kv_usage": "0.5", "running_seqs": 3.0, "newer_field": 1,
                                    "step_s": None})
    assert stats == RoutingStats(worker_id="w", kv_usage=0.5, running_seqs=3)
    assert RoutingStats.from_dict(None) == RoutingStats.from_dict({}) == RoutingStats()


def test_a_replica_without_stats_is_a_load_only_worker_named_like_the_replica_names_itself():
    worker = worker_from(ReplicaInfo("r1", 8), PoolId("batch", "decode"), in_flight=2)
    assert (worker.worker_id, worker.tier, worker.pool, worker.in_flight) == ("batch-decode-r1", "batch", "decode", 2)
    assert worker.block_size is None  # no cache layout known: no prefix scoring
    other_hash = worker_from(ReplicaInfo("r1", 8, RoutingStats(block_size=16, hash_algo="xxhash")),
                             PoolId("batch", "decode"), in_flight=0)
    assert other_hash.block_size is None  # a hash the router cannot reproduce: load-only
