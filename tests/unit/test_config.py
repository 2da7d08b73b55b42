"""ClusterConfig: validated once at the edge, errors name the field."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from cluster.config import ClusterConfig

REPO = Path(__file__).resolve().parents[2]


def test_default_local_config_loads_and_resolves_model_path():
    cfg = ClusterConfig.load(REPO / "cluster" / "configs" / "local.yaml")
    assert cfg.model.path == (REPO / ".tandem" / "models" / "SmolLM2-135M-Instruct").resolve()
    assert cfg.default_tier == "interactive"
    assert cfg.tiers["interactive"].prefill.engine.kv_cache_memory_bytes == 256 << 20
    assert cfg.gateway.port == 8000


def test_unknown_key_is_rejected_with_its_name(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model: {path: m}\nkv_transfer: {buffer_devise: cpu}\n")
    with pytest.raises(ValidationError, match="buffer_devise"):
        ClusterConfig.load(path)


def test_batched_tokens_below_context_names_the_field():
    with pytest.raises(ValidationError, match=r"tiers\.interactive\.decode\.engine\.max_num_batched_tokens"):
        ClusterConfig.model_validate(
            {"model": {"path": "m", "max_model_len": 4096},
             "tiers": {"interactive": {"decode": {"engine": {"max_num_batched_tokens": 1024}}}}}
        )


def test_tier_names_and_presence_are_checked():
    with pytest.raises(ValidationError, match="at least one tier"):
        ClusterConfig.model_validate({"model": {"path": "m"}, "tiers": {}})
    with pytest.raises(ValidationError, match="tier names"):
        ClusterConfig.model_validate({"model": {"path": "m"}, "tiers": {"Bad Tier": {}}})


def test_first_tier_is_default_and_overrides_merge(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model: {path: m}\ntiers: {batch: {}, interactive: {}}\n")
    cfg = ClusterConfig.load(path, overrides={"gateway": {"port": 9000}})
    assert cfg.default_tier == "batch"
    assert cfg.gateway.port == 9000 and cfg.gateway.host == "127.0.0.1"
    assert cfg.model.path == (tmp_path / "m").resolve()


def test_kv_cache_size_has_a_floor():
    with pytest.raises(ValidationError, match="kv_cache_memory_bytes"):
        ClusterConfig.model_validate(
            {"model": {"path": "m"}, "tiers": {"interactive": {"prefill": {"engine": {"kv_cache_memory_bytes": 1024}}}}}
        )
