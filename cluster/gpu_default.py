"""Which config `tandem run` serves, and the GPU default laid out on the host's GPUs.

Without --config, a host with NVIDIA GPUs gets configs/gpu.yaml, spread one engine per GPU
(`lay_out_on_gpus`), and a host without gets configs/local.yaml; --config wins and runs as
written. A config that does not fit the host's GPUs (a CPU config on a GPU host, engines asking
for GPUs on a host without) gets a warning naming what to run instead. Pure functions of the
host's GPUs (cluster/hardware.py gpus_here), so the tests give them any host.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from pydantic import ValidationError

from cluster.config import ClusterConfig, ConfigError, MiB, explain
from cluster.hardware import GPUs

CONFIGS = Path(__file__).parent / "configs"
CPU_CONFIG = CONFIGS / "local.yaml"
GPU_CONFIG = CONFIGS / "gpu.yaml"

# One GPU shared by the prefill and the decode engine: each engine's KV cache, as a share of the
# GPU's memory. Explicit, not by gpu_memory_utilization: vLLM sizes that from the memory the whole
# GPU used while it profiled, so two engines starting together would count each other's weights
# and KV cache as their own (vllm/v1/worker/gpu_worker.py determine_available_memory). 2 x 0.2
# leaves room for two copies of the weights of a model of up to ~20% of the GPU.
SHARED_GPU_KV_SHARE = 0.2


@dataclass(frozen=True)
class ConfigChoice:
    path: Path
    lay_out: bool          # spread over the host's GPUs (lay_out_on_gpus): only the GPU default tandem picked
    note: Optional[str]    # a line for the console: why this config


def choose_config(explicit: Optional[Path], gpus: GPUs) -> ConfigChoice:
    """The config `tandem run` serves: --config as written, else the GPU or the CPU default."""
    if explicit is not None:
        return ConfigChoice(explicit, lay_out=False, note=None)
    if gpus.count == 0:
        return ConfigChoice(CPU_CONFIG, lay_out=False, note=None)
    prefill, decode = _engines(gpus.count)
    shared = " sharing it" if gpus.count == 1 else ", one per GPU"
    return ConfigChoice(GPU_CONFIG, lay_out=True, note=(
        f"[tandem] {_plural(gpus.count, 'GPU')} found: the GPU default ({_shown(GPU_CONFIG)}), "
        f"{_plural(prefill, 'prefill engine')} + {_plural(decode, 'decode engine')}{shared}; "
        f"--config {_shown(CPU_CONFIG)} for the CPU one"))


def _engines(gpus: int) -> tuple[int, int]:
    """(prefill, decode) engines on `gpus` GPUs: half prefill, decode the odd one (it holds every
    running stream's KV cache); both on the one GPU of a single-GPU host."""
    if gpus == 1:
        return 1, 1
    return gpus // 2, gpus - gpus // 2


def lay_out_on_gpus(cfg: ClusterConfig, gpus: GPUs) -> ClusterConfig:
    """`cfg` (the GPU default: one tier of one-GPU engines) with one engine per GPU of this host,
    and the tier's admission bounds scaled with its decode engines."""
    if gpus.count == 0:
        raise ValueError("lay_out_on_gpus needs a GPU")
    name, tier = next(iter(cfg.tiers.items()))
    if len(cfg.tiers) != 1 or any(p.num_gpus != 1 or p.autoscaling is not None for p in tier.pools().values()):
        raise ConfigError(f"{_shown(GPU_CONFIG)}: the GPU layout spreads one tier of one-GPU engines with fixed "
                          "replicas; for another shape pass your config with --config (it runs as written)")
    prefill, decode = _engines(gpus.count)
    pools = {"prefill": {"replicas": prefill}, "decode": {"replicas": decode}}
    if gpus.count == 1:
        for role, pool in tier.pools().items():
            utilization = (pool.engine.model_extra or {}).get("gpu_memory_utilization", 0.9)  # 0.9: vLLM's default
            pools[role].update(num_gpus=0.5, engine={
                # vLLM refuses to start when less than this share of the GPU is free, so each
                # engine asks for half of what one engine would.
                "gpu_memory_utilization": round(utilization / 2, 3),
                "kv_cache_memory_bytes": int(gpus.memory_bytes * SHARED_GPU_KV_SHARE) // MiB * MiB,
            })
    scale = decode / tier.decode.replicas
    admission = {"max_running": max(1, round(tier.admission.max_running * scale)),
                 "max_queued": round(tier.admission.max_queued * scale)}
    raw = cfg.model_dump(exclude_unset=True)  # what the YAML set: "explicit" stays explicit
    raw["tiers"][name] = _merge(raw["tiers"][name], {**pools, "admission": admission})
    try:
        return ClusterConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(explain(exc, f"{_shown(GPU_CONFIG)} laid out on {_plural(gpus.count, 'GPU')}")) from None


def load_run_config(explicit: Optional[Path], gpus: GPUs, overrides: dict) -> tuple[ClusterConfig, Path, list[str]]:
    """The config `tandem run` serves on a host with `gpus`, its file, and the lines to print
    about the choice (why this config, a mismatch with the host). Raises ConfigError."""
    choice = choose_config(explicit, gpus)
    cfg = ClusterConfig.load_checked(choice.path, overrides)
    if choice.lay_out:
        cfg = lay_out_on_gpus(cfg, gpus)
    lines = [line for line in (choice.note, gpu_mismatch_warning(cfg, gpus, choice.path)) if line]
    return cfg, choice.path, lines


def gpu_mismatch_warning(cfg: ClusterConfig, gpus: GPUs, source: Path) -> Optional[str]:
    """A warning when `cfg` does not fit this host's GPUs; None when it does, or when the engines
    run on a Ray cluster elsewhere (ray.address), whose GPUs this host cannot see."""
    from cluster.local import is_loopback_address

    if not is_loopback_address(cfg.ray.address):
        return None
    asked = sum(p.num_gpus > 0 for t in cfg.tiers.values() for p in t.pools().values())
    if gpus.count and not asked:
        return (f"[tandem] warning: this host has {_plural(gpus.count, 'GPU')} but {_shown(source)} gives its engines "
                "none (every pool's num_gpus is 0): vLLM runs them on the CPU, slowly, or not at all (its CUDA "
                f"build). For the GPU default run `tandem run` without --config, or --config {_shown(GPU_CONFIG)}")
    if asked and not gpus.count:
        return (f"[tandem] warning: {_shown(source)} gives its engines GPUs (num_gpus) but this host has none: "
                "they will wait for one and never start. Without a GPU run `tandem run` without --config, or "
                f"--config {_shown(CPU_CONFIG)}")
    return None


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merge(out.get(key) or {}, value) if isinstance(value, dict) else value
    return out


def _plural(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def _shown(path: Path) -> str:
    """A path as a person would type it here: relative to the current folder when inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)
