"""What the Helm chart relies on in the Python code: the Serve entry point RayService imports
(cluster/serve_entry.py) and pool placement on Ray nodes (PlacementConfig → actor options)."""

from __future__ import annotations

import pytest
import yaml

from cluster.config import ClusterConfig
from cluster.serve_entry import load_config

MODEL = {"path": "/models/m", "name": "m"}


def test_inline_config(tmp_path):
    cfg = load_config({"cluster": {"model": MODEL, "default_tier": "batch",
                                   "tiers": {"interactive": {}, "batch": {}}}})
    assert cfg.default_tier == "batch"


def test_config_file(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump({"model": MODEL}))
    assert load_config({"config_path": str(path)}).model.served_name == "m"


@pytest.mark.parametrize("args", [{}, {"cluster": {"model": MODEL}, "config_path": "x"}, {"clusterr": {}}])
def test_bad_args_say_what_to_set(args):
    with pytest.raises(ValueError, match="exactly one of `cluster`"):
        load_config(args)


def test_bad_cluster_config_is_rejected_with_the_field():
    with pytest.raises(ValueError, match="default_tier"):
        load_config({"cluster": {"model": MODEL, "default_tier": "gold"}})


def test_default_tier_defaults_to_the_first_tier():
    cfg = ClusterConfig.model_validate({"model": MODEL, "tiers": {"batch": {}, "interactive": {}}})
    assert cfg.default_tier == "batch"


def test_placement_becomes_ray_actor_options():
    from cluster.app import _actor_options

    cfg = ClusterConfig.model_validate({"model": MODEL, "tiers": {"interactive": {
        "prefill": {"num_gpus": 1, "placement": {"resources": {"node_prefill": 1}}},
        "decode": {"placement": {"node_labels": {"tandem.io/pool": "decode"}}},
    }}})
    tier = cfg.tiers["interactive"]
    assert _actor_options(tier.prefill) == {"num_cpus": 1.0, "num_gpus": 1.0, "resources": {"node_prefill": 1.0}}
    assert _actor_options(tier.decode) == {"num_cpus": 1.0, "num_gpus": 0.0,
                                           "label_selector": {"tandem.io/pool": "decode"}}
