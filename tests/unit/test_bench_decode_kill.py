"""loadtest/bench/decode_kill.py's config: two interactive decode replicas that fit Ray's CPUs."""

from __future__ import annotations

from pathlib import Path

import yaml

from cluster.config import ClusterConfig
from loadtest.bench.decode_kill import write_config
from tests.conftest import REPO


def test_the_config_has_two_decode_replicas_one_tier_and_a_known_metrics_port(tmp_path: Path) -> None:
    path, _ = write_config(REPO / "cluster" / "configs" / "local.yaml", tmp_path, 18123, "float32")
    cfg = ClusterConfig.model_validate(yaml.safe_load(path.read_text()))
    assert list(cfg.tiers) == ["interactive"]
    tier = cfg.tiers["interactive"]
    assert tier.decode.replicas == 2 and tier.decode.autoscaling is None
    assert tier.prefill.num_cpus + 2 * tier.decode.num_cpus <= cfg.ray.num_cpus
    assert cfg.ray.metrics_export_port == 18123 and cfg.model.dtype == "float32"
    assert Path(cfg.model.path).is_absolute()
