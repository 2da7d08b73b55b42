"""The host's hardware as the engines see it: a GPU or not, the CPU's flags, and the dtype
vLLM should run in here. No Ray, no vLLM: the CLI, the benchmarks and the engines share it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPUs:
    """The NVIDIA GPUs this process sees (CUDA_VISIBLE_DEVICES applies, as it does for Ray)."""

    count: int = 0
    memory_bytes: int = 0  # the smallest one's memory; 0 without GPUs


def gpus_here() -> GPUs:
    """This host's GPUs, as torch sees them; none where torch or CUDA is missing or broken."""
    try:
        import torch

        if not torch.cuda.is_available():
            return GPUs()
        count = torch.cuda.device_count()
        return GPUs(count, min(torch.cuda.get_device_properties(i).total_memory for i in range(count)))
    except Exception:  # torch missing or broken CUDA: treat as CPU
        return GPUs()


def has_nvidia_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # torch missing or broken CUDA: treat as CPU
        return False


# CPU flags that make bfloat16 matmuls native (AVX-512 BF16, AMX). Without them torch
# emulates bf16: measured on an AVX2-only EPYC VM (2026-12-01), SmolLM2-135M TTFT was 1.6 s in
# bfloat16 vs 0.65 s in float32 (8 concurrent: 14 s vs 2.9 s); decode 1.3x faster in bf16.
_NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def cpu_flags() -> frozenset[str]:
    """This machine's CPU feature flags (Linux /proc/cpuinfo); empty where unreadable."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def engine_dtype(requested: str, on_gpu: bool, flags: frozenset[str]) -> str:
    """model.dtype for vLLM on this host. "auto": the checkpoint's dtype on a GPU (vLLM's own
    auto); on a CPU bfloat16 only where the CPU computes it natively, else float32."""
    if requested != "auto" or on_gpu:
        return requested
    return "bfloat16" if flags & _NATIVE_BF16_FLAGS else "float32"


def engine_dtype_here(requested: str) -> str:
    """`engine_dtype` for this host."""
    return engine_dtype(requested, has_nvidia_gpu(), cpu_flags())
