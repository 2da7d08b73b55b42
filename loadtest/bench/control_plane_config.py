"""What the control-plane benchmark runs: tandem's config for it, the command line's
overrides (`--set dotted.path=value`, `--ray-env KEY=VALUE`) and named variants, so a change
to the request path is A/B'd without editing the benchmark.

Overrides apply to the ClusterConfig *dict* before validation, so any field can be set and a
typo is ClusterConfig's own clear error. A value is parsed as YAML: `--set gateway.replicas=2`
sets the integer 2, `--set routing.disaggregation=adaptive` a string, `--set x=null` None.
Ray environment variables reach every Ray process of that system (the raylet and its workers
inherit them from the process that starts Ray), never this benchmark's own process.

A variants file (YAML or JSON) names systems beside the plain "tandem" one:

    throughput:
      ray_env: {RAY_SERVE_THROUGHPUT_OPTIMIZED: "1"}
    two-gateways:
      set: {gateway.replicas: 2}
"""

from __future__ import annotations

import copy
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

MODEL_NAME = "tiny-llama"
TIER = "interactive"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,40}")


@dataclass(frozen=True)
class Variant:
    """A tandem system to run: its name, config overrides (dotted path → value) and Ray env."""

    name: str
    sets: tuple[tuple[str, Any], ...] = ()
    ray_env: tuple[tuple[str, str], ...] = ()

    def with_base(self, sets: tuple[tuple[str, Any], ...], ray_env: tuple[tuple[str, str], ...]) -> "Variant":
        """The command line's own overrides first, the variant's on top (its win)."""
        return Variant(self.name, sets + self.sets, ray_env + self.ray_env)


def parse_set(text: str) -> tuple[str, Any]:
    """"tiers.interactive.decode.replicas=2" → ("tiers.interactive.decode.replicas", 2)."""
    path, sep, value = text.partition("=")
    path = path.strip()
    if not sep or not path or any(not part for part in path.split(".")):
        raise ValueError(f"--set {text!r}: expected dotted.path=value")
    try:
        return path, yaml.safe_load(value)
    except yaml.YAMLError as exc:
        raise ValueError(f"--set {text!r}: the value is not YAML: {exc}") from None


def parse_env(text: str) -> tuple[str, str]:
    """"RAY_SERVE_THROUGHPUT_OPTIMIZED=1" → ("RAY_SERVE_THROUGHPUT_OPTIMIZED", "1")."""
    key, sep, value = text.partition("=")
    if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        raise ValueError(f"--ray-env {text!r}: expected KEY=VALUE")
    return key, value


def apply_sets(raw: Mapping[str, Any], sets: tuple[tuple[str, Any], ...]) -> dict:
    """A deep copy of `raw` with each dotted path set, in order (mappings made on the way)."""
    out = copy.deepcopy(dict(raw))
    for path, value in sets:
        node = out
        parts = path.split(".")
        for i, part in enumerate(parts[:-1]):
            nxt = node.get(part)
            if nxt is None:
                nxt = node[part] = {}
            elif not isinstance(nxt, dict):
                raise ValueError(f"--set {path}: {'.'.join(parts[:i + 1])} is {type(nxt).__name__}, not a mapping")
            node = nxt
        node[parts[-1]] = copy.deepcopy(value)
    return out


def load_variants(path: Path) -> list[Variant]:
    """The variants of a YAML/JSON file {name: {set: {path: value}, ray_env: {KEY: VALUE}}}."""
    raw = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a mapping of variant names")
    out = []
    for name, spec in raw.items():
        spec = spec or {}
        if not isinstance(spec, dict) or set(spec) - {"set", "ray_env"}:
            raise ValueError(f"{path}: variant {name!r} takes only `set` and `ray_env` mappings")
        sets, env = spec.get("set") or {}, spec.get("ray_env") or {}
        if not isinstance(sets, dict) or not isinstance(env, dict):
            raise ValueError(f"{path}: variant {name!r}: `set` and `ray_env` are mappings")
        check_name(str(name))
        out.append(Variant(str(name), tuple((str(k), v) for k, v in sets.items()),
                           tuple((parse_env(f"{k}={v}")) for k, v in env.items())))
    return out


def check_name(name: str) -> str:
    if not _NAME.fullmatch(name) or name == "vllm":
        raise ValueError(f"system name {name!r}: letters, digits and ._@- (and not 'vllm')")
    return name


def base_config(model_dir: Path, gateway_port: int, metrics_port: int, max_streams: int, max_model_len: int) -> dict:
    """tandem as the benchmark runs it, before overrides: 1 prefill + 1 decode replica holding
    no Ray CPU (FakeEngine computes nothing), every request disaggregated, and room for every
    stream everywhere, so what bounds the rate is the relay, not admission or Serve's queues:
    a pool's max_ongoing_requests is 2 x max_num_seqs (cluster/app.py)."""
    room = max(1024, 2 * max_streams)
    engine = {"kv_cache_memory_bytes": 16 << 20, "max_num_seqs": room // 2, "block_size": 16}
    pool = {"replicas": 1, "num_cpus": 0, "engine": engine}
    return {
        "model": {"path": str(model_dir), "name": MODEL_NAME, "dtype": "float32", "max_model_len": max_model_len},
        "gateway": {"host": "127.0.0.1", "port": gateway_port},
        "tiers": {TIER: {"prefill": dict(pool), "decode": dict(pool),
                         "admission": {"max_running": room, "max_queued": room}}},
        "routing": {"disaggregation": "always"},
        "ray": {"num_cpus": max(2, os.cpu_count() or 2), "metrics_export_port": metrics_port},
    }


@dataclass(frozen=True)
class SweepPlan:
    """The systems and cells of one run, as the command line asked."""

    systems: tuple[str, ...]  # "vllm" and tandem variants' names, in run order
    variants: dict[str, Variant] = field(default_factory=dict)
    streams: tuple[int, ...] = (32, 128, 512)
    paces_s: tuple[float, ...] = (0.02,)


def parse_ints(text: str) -> tuple[int, ...]:
    """"32,128,512" → (32, 128, 512)."""
    values = tuple(int(v) for v in text.split(",") if v.strip())
    if not values or min(values) < 1:
        raise ValueError(f"{text!r}: expected positive integers separated by commas")
    return values


def parse_floats(text: str) -> tuple[float, ...]:
    values = tuple(float(v) for v in text.split(",") if v.strip())
    if not values or min(values) <= 0:
        raise ValueError(f"{text!r}: expected positive numbers separated by commas")
    return values
