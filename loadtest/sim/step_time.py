"""Step-time models behind one interface: seconds of one engine step of a given shape.

- `CpuFitted`: this project's CPU engines, from the two numbers every goodput run calibrates
  (loadtest/bench/goodput_judge.py: one engine's unloaded TTFT of the prefill-heavy prompt, and
  the mean token gap of a decode-heavy request alone) plus the engine's token budget. Each
  running sequence adds a share of the one-stream step: measured per host class by
  loadtest/bench/decode_slope.py where committed (setups.py `decode_stream_share`), else
  router/routing/cost_model.py's prior (an unloaded step ~35 ms, +1 ms per sequence).
- `Roofline`: a lower bound for an accelerator: a step costs at least its FLOPs at peak compute
  and at least its bytes (weights once, the KV it reads and writes) at peak memory bandwidth,
  times efficiencies you state. A bound, never a measurement: label it so.
- `TableStepTime` (step_table.py): H100/H200 x vLLM x Llama-3.1-8B/70B, interpolated from tables
  NVIDIA AIConfigurator (Apache-2.0) composed offline from its measured vLLM kernel data
  (gpu_tables/: the data file, its generator, NOTICE); validated by validate_gpu.py against
  AIConfigurator's measured serving samples. The tool stays out of tandem's dependencies.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Protocol

PRIOR_STREAM_SHARE = 1.0 / 35.0  # cost_model.py's prior: +1 ms per running sequence on a 35 ms step


@dataclass(frozen=True)
class StepShape:
    decode_seqs: int  # requests computing one token (decoding)
    prefill_tokens: int  # prompt tokens computed this step (all prefill chunks)
    context_tokens: int  # KV positions read: each scheduled request's context after the step
    attention_pairs: int = 0  # (query token, key position) pairs: a chunk of n after c computed adds n·(c + (n+1)/2)
    decode_context_tokens: int = 0  # the decoding requests' share of context_tokens (their attention pairs too)


class StepTimeModel(Protocol):
    def step_s(self, shape: StepShape) -> float: ...

    def provenance(self) -> dict: ...


@dataclass(frozen=True)
class CpuFitted:
    """step = base + per_seq * decode_seqs + per_prompt_token * prefill_tokens."""

    base_s: float
    per_seq_s: float
    per_prompt_token_s: float
    source: str

    @classmethod
    def from_calibration(cls, unloaded_ttft_s: float, unloaded_step_s: float, prompt_tokens: int,
                         budget_tokens: int, source: str, stream_share: float = PRIOR_STREAM_SHARE) -> "CpuFitted":
        """Solve the unloaded prompt alone: ceil(prompt / budget) steps, each the base step,
        plus its tokens at the prompt slope, take the unloaded TTFT. `stream_share`: each
        running sequence's extra, as a share of the one-stream step."""
        per_seq = unloaded_step_s * stream_share
        base = unloaded_step_s - per_seq  # one stream alone: base + per_seq
        steps = math.ceil(prompt_tokens / budget_tokens)
        slope = max(unloaded_ttft_s - steps * base, 0.0) / prompt_tokens
        return cls(base, per_seq, slope, source)

    def step_s(self, shape: StepShape) -> float:
        return self.base_s + self.per_seq_s * shape.decode_seqs + self.per_prompt_token_s * shape.prefill_tokens

    def provenance(self) -> dict:
        return {"kind": "cpu_fitted", **asdict(self)}


@dataclass(frozen=True)
class Accelerator:
    name: str
    peak_flops: float  # dense bf16 FLOP/s
    mem_bw: float  # bytes/s


@dataclass(frozen=True)
class ModelShape:
    name: str
    params: float
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int = 2

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes


# Vendor datasheet peaks (dense, no sparsity) and the models' published configs.
ACCELERATORS = {
    "H100": Accelerator("H100-SXM", 989e12, 3.35e12),
    "H200": Accelerator("H200-SXM", 989e12, 4.8e12),
}
MODELS = {
    "llama-3.1-8b": ModelShape("Llama-3.1-8B", 8.03e9, 32, 32, 8, 128),
    "llama-3.1-70b": ModelShape("Llama-3.1-70B", 70.6e9, 80, 64, 8, 128),
    "smollm2-135m": ModelShape("SmolLM2-135M", 134.5e6, 30, 9, 3, 64),
}


@dataclass(frozen=True)
class Roofline:
    """max(FLOPs / (peak · mfu), bytes / (bandwidth · mbu)) per step, split over `tp` devices
    (their communication ignored: another reason this is a bound)."""

    accelerator: Accelerator
    model: ModelShape
    tp: int = 1
    mfu: float = 1.0
    mbu: float = 1.0

    def step_s(self, shape: StepShape) -> float:
        m = self.model
        tokens = shape.decode_seqs + shape.prefill_tokens
        # 2 FLOPs per parameter per token; attention: QK^T and AV over the context, per layer.
        flops = 2 * m.params * tokens + 4 * m.layers * m.heads * m.head_dim * shape.attention_pairs
        bytes_ = m.params * m.dtype_bytes + m.kv_bytes_per_token * (shape.context_tokens + tokens)
        compute = flops / (self.accelerator.peak_flops * self.mfu * self.tp)
        memory = bytes_ / (self.accelerator.mem_bw * self.mbu * self.tp)
        return max(compute, memory)

    def provenance(self) -> dict:
        return {"kind": "roofline_bound", "accelerator": asdict(self.accelerator), "model": asdict(self.model),
                "tp": self.tp, "mfu": self.mfu, "mbu": self.mbu,
                "note": "a lower bound from datasheet peaks, not a measurement"}
