"""loadtest/bench/decode_drain.py's pure parts: its config and how it reads the removal."""

from __future__ import annotations

from pathlib import Path

import yaml

from cluster.config import ClusterConfig
from loadtest.bench.decode_drain import removal, write_config
from tests.conftest import REPO


def test_the_config_autoscales_two_decode_replicas_down_to_one_and_logs_the_decisions(tmp_path: Path) -> None:
    path, _ = write_config(REPO / "cluster" / "configs" / "local.yaml", tmp_path, 18124, 30.0)
    cfg = ClusterConfig.model_validate(yaml.safe_load(path.read_text()))
    decode = cfg.tiers["interactive"].decode
    assert list(cfg.tiers) == ["interactive"] and decode.replicas == 2
    assert (decode.autoscaling.min_replicas, decode.autoscaling.max_replicas) == (1, 2)
    assert decode.autoscaling.downscale_delay_s == 30.0 and decode.autoscaling.decision_log == tmp_path / "decisions.jsonl"
    assert cfg.tiers["interactive"].prefill.num_cpus + 2 * decode.num_cpus <= cfg.ray.num_cpus
    assert cfg.ray.metrics_export_port == 18124


def sample(t: float, running: dict, stopping: int = 0) -> dict:
    states = {"RUNNING": 2 - stopping if stopping else 2} if t < 50 else {"RUNNING": 1}
    if stopping:
        states["STOPPING"] = stopping
    return {"t_s": t, "states": states, "running": running}


def test_the_removed_replica_is_the_one_whose_series_left_and_it_drained_what_it_ran_at_the_stop() -> None:
    timeline = [sample(0, {"a": 2, "b": 1}), sample(10, {"a": 2, "b": 1}, stopping=1),
                sample(30, {"a": 1, "b": 0}, stopping=1), sample(40, {"a": 0, "b": 0}, stopping=1),
                sample(50, {"a": 0, "b": 0}), sample(60, {"b": 0})]
    gone = removal(timeline, streams_ended_s=39.0)
    assert gone == {"scaled_down": True, "stopping_at_s": 10, "gone_at_s": 50, "removed_replica": ["a"],
                    "identified": True, "running_at_stop": {"a": 2, "b": 1}, "drained_streams": 2,
                    "removed_last_busy_s": 30}
    # A gauge still reading busy after every stream ended (the engine stopped stepping): the end bounds it.
    assert removal(timeline, streams_ended_s=25.0)["removed_last_busy_s"] == 25.0


def test_before_a_series_leaves_the_removed_replica_is_unknown_and_the_drain_a_lower_bound() -> None:
    timeline = [sample(0, {"a": 2, "b": 1}), sample(10, {"a": 2, "b": 1}, stopping=1), sample(50, {"a": 0, "b": 0})]
    gone = removal(timeline, streams_ended_s=45.0)
    assert (gone["identified"], gone["drained_streams"], gone["removed_last_busy_s"], gone["gone_at_s"]) == (False, 1, 45.0, 50)


def test_no_stopping_replica_means_no_scale_down() -> None:
    assert removal([sample(0, {"a": 1, "b": 1})], 5.0) == {"scaled_down": False}
