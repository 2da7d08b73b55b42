"""The GPU default (cluster/gpu_default.py, cluster/configs/gpu.yaml): which config `tandem run`
serves on a host with or without GPUs, --config winning; gpu.yaml laid out one engine per GPU;
the warning when a config does not fit the host's GPUs; gpu.yaml as ClusterConfig and vLLM's own
engine-argument parser (`tandem check-config`) read it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from cluster import cli
from cluster.config import ClusterConfig, ConfigError
from cluster.gpu_default import (CPU_CONFIG, GPU_CONFIG, ConfigChoice, choose_config, gpu_mismatch_warning, lay_out_on_gpus,
                                 load_run_config)
from cluster.hardware import GPUs
from tests.conftest import REPO

NO_GPU = GPUs()
H100 = 80 << 30


@pytest.fixture(autouse=True)
def _in_the_repository(monkeypatch):
    """Paths in the lines are shown relative to the current folder, as a person types them."""
    monkeypatch.chdir(REPO)


def gpus(n: int) -> GPUs:
    return GPUs(n, H100)


def _interactive(cfg: ClusterConfig):
    return cfg.tiers["interactive"]


# -- which config ------------------------------------------------------------------------

def test_without_gpus_the_cpu_default_as_before():
    choice = choose_config(None, NO_GPU)
    assert choice.path == CPU_CONFIG == cli.DEFAULT_CONFIG and not choice.lay_out and choice.note is None


@pytest.mark.parametrize("n, engines", [(1, "1 prefill engine + 1 decode engine sharing it"),
                                        (2, "1 prefill engine + 1 decode engine, one per GPU"),
                                        (8, "4 prefill engines + 4 decode engines, one per GPU")])
def test_with_gpus_the_gpu_default_laid_out_and_said(n, engines):
    choice = choose_config(None, gpus(n))
    assert choice.path == GPU_CONFIG and choice.lay_out
    assert engines in choice.note and "cluster/configs/gpu.yaml" in choice.note
    assert "--config cluster/configs/local.yaml for the CPU one" in choice.note


@pytest.mark.parametrize("host", [NO_GPU, gpus(1), gpus(4)])
@pytest.mark.parametrize("explicit", [CPU_CONFIG, GPU_CONFIG, Path("mine.yaml")])
def test_an_explicit_config_wins_and_runs_as_written(host, explicit):
    assert choose_config(explicit, host) == ConfigChoice(explicit, lay_out=False, note=None)


# -- the warning -------------------------------------------------------------------------

def test_a_cpu_config_on_a_gpu_host_warns_naming_the_gpu_default():
    cfg = ClusterConfig.load_checked(CPU_CONFIG)
    warning = gpu_mismatch_warning(cfg, gpus(2), CPU_CONFIG)
    assert warning == (
        "[tandem] warning: this host has 2 GPUs but cluster/configs/local.yaml gives its engines none (every "
        "pool's num_gpus is 0): vLLM runs them on the CPU, slowly, or not at all (its CUDA build). For the GPU "
        "default run `tandem run` without --config, or --config cluster/configs/gpu.yaml")


def test_a_gpu_config_on_a_host_without_gpus_warns_that_engines_would_wait():
    warning = gpu_mismatch_warning(ClusterConfig.load_checked(GPU_CONFIG), NO_GPU, GPU_CONFIG)
    assert "gives its engines GPUs (num_gpus) but this host has none" in warning
    assert "--config cluster/configs/local.yaml" in warning


def test_no_warning_when_the_config_fits_or_ray_runs_elsewhere():
    cpu, gpu = ClusterConfig.load_checked(CPU_CONFIG), ClusterConfig.load_checked(GPU_CONFIG)
    assert gpu_mismatch_warning(cpu, NO_GPU, CPU_CONFIG) is None
    assert gpu_mismatch_warning(gpu, gpus(2), GPU_CONFIG) is None
    remote = ClusterConfig.load_checked(CPU_CONFIG, {"ray": {"address": "10.0.0.5:6379"}})
    assert gpu_mismatch_warning(remote, gpus(2), CPU_CONFIG) is None  # that cluster's GPUs are not this host's


def test_load_run_config_gives_the_lines_to_print():
    cfg, path, lines = load_run_config(CPU_CONFIG, gpus(1), {})
    assert path == CPU_CONFIG and len(lines) == 1 and lines[0].startswith("[tandem] warning: this host has 1 GPU ")
    cfg, path, lines = load_run_config(None, gpus(4), {"gateway": {"port": 9000}})
    assert path == GPU_CONFIG and lines == [choose_config(None, gpus(4)).note]
    assert cfg.gateway.port == 9000 and _interactive(cfg).decode.replicas == 2
    cfg, path, lines = load_run_config(None, NO_GPU, {})
    assert path == CPU_CONFIG and lines == [] and cfg == ClusterConfig.load_checked(CPU_CONFIG)


# -- gpu.yaml and its layout -------------------------------------------------------------------

def test_gpu_yaml_is_vllms_gpu_defaults_with_nixl_over_every_ucx_transport():
    cfg = ClusterConfig.load_checked(GPU_CONFIG)
    assert list(cfg.tiers) == ["interactive"]
    for pool in _interactive(cfg).pools().values():
        assert pool.num_gpus == 1 and pool.cpu_binding == ()
        assert pool.engine.enforce_eager is False  # CUDA graphs
        assert pool.engine.kv_cache_memory_bytes is None  # the KV cache sized by gpu_memory_utilization
        assert pool.engine.model_extra["gpu_memory_utilization"] == 0.9
    kv = cfg.kv_transfer
    assert (kv.buffer_device, kv.ucx_tls, kv.ucx_net_devices) == ("cuda", "all", "all")
    assert cfg.model.served_name == ClusterConfig.load_checked(CPU_CONFIG).model.served_name


def test_check_config_accepts_gpu_yaml_through_vllms_parser(capsys):
    assert cli.main(["check-config", str(GPU_CONFIG)]) == 0
    resolved = json.loads(capsys.readouterr().out)
    assert resolved["tiers"]["interactive"]["decode"]["engine"]["gpu_memory_utilization"] == 0.9


@pytest.mark.parametrize("n, prefill, decode", [(2, 1, 1), (3, 1, 2), (4, 2, 2), (8, 4, 4)])
def test_one_engine_per_gpu_and_admission_scaled_with_decode(n, prefill, decode):
    default = _interactive(ClusterConfig.load_checked(GPU_CONFIG))
    tier = _interactive(lay_out_on_gpus(ClusterConfig.load_checked(GPU_CONFIG), gpus(n)))
    assert (tier.prefill.replicas, tier.decode.replicas) == (prefill, decode)
    assert tier.prefill.replicas * tier.prefill.num_gpus + tier.decode.replicas * tier.decode.num_gpus == n
    assert tier.decode.engine == default.decode.engine  # KV by gpu_memory_utilization, as written
    assert tier.admission.max_running == decode * default.admission.max_running
    assert tier.admission.max_queued == decode * default.admission.max_queued


def test_one_gpu_is_shared_with_explicit_kv_caches():
    default = _interactive(ClusterConfig.load_checked(GPU_CONFIG))
    tier = _interactive(lay_out_on_gpus(ClusterConfig.load_checked(GPU_CONFIG), gpus(1)))
    for pool in tier.pools().values():
        assert pool.replicas == 1 and pool.num_gpus == 0.5
        assert pool.engine.model_extra["gpu_memory_utilization"] == 0.45  # the free memory vLLM wants at start
        assert pool.engine.kv_cache_memory_bytes == 16 << 30  # a fifth of the 80 GiB
        assert pool.engine.enforce_eager is False
    assert tier.admission == default.admission


def test_the_layout_keeps_the_rest_of_the_config():
    cfg = ClusterConfig.load_checked(GPU_CONFIG, {"model": {"path": "org/model", "name": None}})
    laid = lay_out_on_gpus(cfg, gpus(2))
    assert laid.model == cfg.model and laid.model.served_name == "org/model"
    assert laid.kv_transfer == cfg.kv_transfer and laid.gateway == cfg.gateway


def test_the_layout_refuses_a_shape_it_does_not_know(tmp_path):
    raw = yaml.safe_load(GPU_CONFIG.read_text())
    raw["model"]["path"] = "/m"
    raw["tiers"]["batch"] = raw["tiers"]["interactive"]
    with pytest.raises(ConfigError, match="one tier of one-GPU engines"):
        lay_out_on_gpus(ClusterConfig.model_validate(raw), gpus(2))


def test_an_explicit_kv_size_may_come_with_gpu_memory_utilization():
    """Beside tandem's default KV size, gpu_memory_utilization would be ignored (refused:
    test_engine_args.py); beside an explicit one it bounds the memory vLLM wants free at start,
    what two engines sharing a GPU need."""
    engine = {"kv_cache_memory_bytes": "8G", "gpu_memory_utilization": 0.45}
    cfg = ClusterConfig.model_validate({"model": {"path": "/m"}, "tiers": {"interactive": {"decode": {"engine": engine}}}})
    assert _interactive(cfg).decode.engine.kv_cache_memory_bytes == 8 << 30
    with pytest.raises(ValidationError, match="set kv_cache_memory_bytes: null"):
        ClusterConfig.model_validate({"model": {"path": "/m"}, "tiers": {"interactive": {
            "decode": {"engine": {"gpu_memory_utilization": 0.45}}}}})


# -- `tandem run` ------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, says", [
    ([], "[tandem] 2 GPUs found: the GPU default (cluster/configs/gpu.yaml)"),
    (["--config", str(CPU_CONFIG)], "[tandem] warning: this host has 2 GPUs but cluster/configs/local.yaml"),
])
def test_tandem_run_says_which_config_before_anything_starts(monkeypatch, capsys, argv, says):
    import cluster.hardware

    monkeypatch.setattr(cluster.hardware, "gpus_here", lambda: gpus(2))
    assert cli.main(["run", *argv, "--model", "no-such-folder"]) == 2  # stops at the model, before Ray
    out, err = capsys.readouterr()
    assert out.startswith(says) and "no-such-folder" in err
