"""model.dtype auto (cluster/hardware.py): decided on each engine's host, from its CPU flags."""

from __future__ import annotations

from cluster.config import ModelConfig
from cluster.hardware import cpu_flags, engine_dtype

AVX2_ONLY = frozenset({"sse4_2", "avx", "avx2", "fma"})


def test_auto_is_bf16_only_where_the_cpu_computes_it_natively():
    assert engine_dtype("auto", on_gpu=False, flags=AVX2_ONLY) == "float32"
    assert engine_dtype("auto", on_gpu=False, flags=AVX2_ONLY | {"avx512f", "avx512_bf16"}) == "bfloat16"
    assert engine_dtype("auto", on_gpu=False, flags=AVX2_ONLY | {"amx_bf16", "amx_tile"}) == "bfloat16"
    assert engine_dtype("auto", on_gpu=False, flags=frozenset()) == "float32"  # flags unreadable


def test_gpus_and_explicit_choices_are_left_alone():
    assert engine_dtype("auto", on_gpu=True, flags=AVX2_ONLY) == "auto"  # vLLM: the checkpoint's dtype
    for dtype in ("float32", "bfloat16", "float16"):
        assert engine_dtype(dtype, on_gpu=False, flags=AVX2_ONLY) == dtype
    assert ModelConfig(path="/m").dtype == "auto"


def test_this_machines_flags_are_read():
    flags = cpu_flags()
    assert isinstance(flags, frozenset)
    with open("/proc/cpuinfo") as f:  # the tests run on Linux
        assert any(line.startswith("flags") for line in f) == bool(flags)
