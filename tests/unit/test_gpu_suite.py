"""tests/gpu: its tests are marked gpu (skipped without one), its P/D config is one
ClusterConfig accepts, and the device script parses."""

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


def test_gpu_pd_config_is_valid(tmp_path):
    from tests.gpu.test_pd_gpu import gpu_config

    one = gpu_config(tmp_path, gpus=1)
    assert one.tiers["interactive"].prefill.num_gpus == 0.5
    assert one.tiers["interactive"].decode.engine.kv_cache_memory_bytes == 1 << 30
    assert one.kv_transfer.buffer_device == "cuda" and one.kv_transfer.ucx_net_devices is None
    assert gpu_config(tmp_path, gpus=2).tiers["interactive"].decode.num_gpus == 1
