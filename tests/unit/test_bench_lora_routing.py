"""loadtest/bench/lora_routing.py's pure parts: the trace and the config of each mode."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import yaml

from cluster.config import ClusterConfig
from loadtest.bench.lora_routing import ADAPTERS, delta, make_trace, write_config
from tests.conftest import REPO


def test_the_trace_mixes_both_adapters_each_with_its_own_shared_prefix() -> None:
    trace = make_trace(40, 0.5, 300, seed=0)
    assert trace == make_trace(40, 0.5, 300, seed=0)  # seeded
    assert set(Counter(r.adapter for r in trace)) == set(ADAPTERS)
    prefixes = {a: {r.prompt[:300] for r in trace if r.adapter == a} for a in ADAPTERS}
    assert all(len(p) == 1 for p in prefixes.values()) and len(set.union(*prefixes.values())) == 2
    assert len({r.prompt for r in trace}) == len(trace) and all(a.at_s < b.at_s for a, b in zip(trace, trace[1:]))


def test_the_modes_differ_only_in_the_picker(tmp_path: Path) -> None:
    config = REPO / "cluster" / "configs" / "local.yaml"
    adapters = {a: f"/adapters/{a}" for a in ADAPTERS}
    (tmp_path / "x").mkdir(), (tmp_path / "y").mkdir()
    aware, raw_aware = write_config(config, tmp_path / "x", adapters, "max_score", 18125)
    rr, raw_rr = write_config(config, tmp_path / "y", adapters, "round_robin", 18125)
    raw_aware["routing"].pop("picker"), raw_rr["routing"].pop("picker")
    assert raw_aware == raw_rr
    cfg = ClusterConfig.model_validate(yaml.safe_load(rr.read_text()))
    assert cfg.routing.picker == "round_robin" and cfg.tiers["interactive"].decode.replicas == 2
    assert cfg.model.max_loras == 1 and set(cfg.model.lora_adapters) == set(ADAPTERS)


def test_deltas_go_down_nested_counters_and_count_a_new_series_from_zero() -> None:
    before = {"routes": {"decode": {"held": 2.0}}, "evictions": {"decode": 1.0}}
    after = {"routes": {"decode": {"held": 5.0, "evicts": 1.0}}, "evictions": {"decode": 4.0}}
    assert delta(after, before) == {"routes": {"decode": {"held": 3.0, "evicts": 1.0}}, "evictions": {"decode": 3.0}}
