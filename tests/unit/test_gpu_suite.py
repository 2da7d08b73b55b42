"""tests/gpu: its tests are marked gpu (skipped without one), its cluster is the GPU default
(cluster/configs/gpu.yaml) laid out on the host, and the device script parses."""

from __future__ import annotations

import subprocess

from tests.conftest import REPO


def test_gpu_tests_are_marked_so_they_skip_without_a_gpu():
    from tests.gpu import test_pd_gpu

    assert [m.name for m in [test_pd_gpu.pytestmark]] == ["gpu"]  # tests/conftest.py skips these
    tests = [name for name in dir(test_pd_gpu) if name.startswith("test_")]
    assert len(tests) == 4


def test_device_script_is_valid_bash_and_uses_the_bootstrap_choice():
    script = REPO / "tests" / "gpu" / "device_nixl_bench.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True, timeout=30).returncode == 0
    text = script.read_text()
    assert "-m cluster.doctor nixl-package" in text and "tests/gpu/nixl_vram_bench.py" in text
    assert "--no-index --no-deps" in text  # the device machine reaches no registry


def test_gpu_suite_runs_the_gpu_default_laid_out_on_the_host(tmp_path):
    from cluster.config import ClusterConfig
    from cluster.gpu_default import GPU_CONFIG
    from cluster.hardware import GPUs
    from tests.gpu.test_pd_gpu import GATEWAY_PORT, gpu_config

    default = ClusterConfig.load_checked(GPU_CONFIG)
    one = gpu_config(tmp_path, GPUs(1, 80 << 30))
    prefill, decode = one.tiers["interactive"].prefill, one.tiers["interactive"].decode
    assert (prefill.num_gpus, decode.num_gpus) == (0.5, 0.5)
    assert decode.engine.kv_cache_memory_bytes == 16 << 30  # a fifth of the GPU each
    assert decode.engine.enforce_eager is False  # CUDA graphs, as the default serves
    assert one.kv_transfer == default.kv_transfer  # VRAM buffers, UCX all
    assert one.model.path == tmp_path and one.model.dtype == "float32" and one.gateway.port == GATEWAY_PORT
    two = gpu_config(tmp_path, GPUs(2, 80 << 30)).tiers["interactive"]
    assert (two.prefill.num_gpus, two.decode.num_gpus) == (1, 1)
    assert two.decode.engine == default.tiers["interactive"].decode.engine
