"""`TableStepTime`: GPU step times interpolated from tables NVIDIA AIConfigurator generated offline.

The tables (gpu_tables/vllm_llama31.json, written by gpu_tables/generate.py in a separate venv;
licence and provenance in gpu_tables/NOTICE) hold, per GPU x model x TP x GEMM precision, what
AIConfigurator composes from its measured vLLM kernel data:
- the non-attention ops of a forward pass (GEMMs, all-reduces, norms, ...) by tokens in the step,
  for mixed/prefill steps and for decode-only steps (AIC's generation op list);
- decode attention by (decode batch, KV positions each sequence reads);
- prefill attention of one fresh prompt by its length.

A step of shape (b decodes reading s positions on average, p prefill tokens with P attention
pairs) costs  non_attention(p + b) + decode_attention(b, s) + prefill_attention(N)  where N is
the fresh prompt with P pairs (N(N+1)/2 = P): one formula for a fresh chunk, a chunk after a
computed prefix and several chunks batched, since attention's work is its pairs. That is how
AIConfigurator composes a mixed step too (three passes, summed).

Not in the tables, so not in the model: the engine's CPU time per step (scheduling, sampling,
detokenisation) where the GPU waits for it, the HTTP/tokeniser path, AIC's own end-to-end
corrections (calibrated against the silicon rows that validate_gpu.py holds out). Pure Python
(the stdlib's bisect); linear interpolation between measured points, as AIC does itself.
"""

from __future__ import annotations

import json
import math
from bisect import bisect_right
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Sequence

from loadtest.sim.step_time import StepShape

TABLES = Path(__file__).resolve().parent / "gpu_tables" / "vllm_llama31.json"


def interp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise linear through (xs, ys); beyond either end, the end segment's line (clamped at 0)."""
    if len(xs) == 1:
        return ys[0]
    i = min(max(bisect_right(xs, x) - 1, 0), len(xs) - 2)
    x0, x1 = xs[i], xs[i + 1]
    return max(ys[i] + (ys[i + 1] - ys[i]) * (x - x0) / (x1 - x0), 0.0)


def _pairs(n: float) -> float:
    return n * (n + 1) / 2


@dataclass(frozen=True)
class StepTable:
    """One configuration's tables (ms), on AIConfigurator's measured grids."""

    gpu: str
    model: str
    tp: int
    gemm: str
    kv_cache: str
    perf_data_version: str
    tokens: tuple[int, ...]
    shared_ms: tuple[float, ...]
    decode_batch: tuple[int, ...]
    decode_shared_ms: tuple[float, ...]
    kv_len: tuple[int, ...]
    gen_attn_ms: tuple[tuple[float, ...], ...]  # [decode batch][kv length]
    prompt_len: tuple[int, ...]
    ctx_attn_ms: tuple[float, ...]

    @classmethod
    def from_json(cls, t: dict) -> "StepTable":
        return cls(t["gpu"], t["model"], t["tp"], t["gemm"], t["kv_cache"], t["perf_data_version"],
                   tuple(t["tokens"]), tuple(t["shared_ms"]), tuple(t["decode_batch"]), tuple(t["decode_shared_ms"]),
                   tuple(t["kv_len"]), tuple(tuple(r) for r in t["gen_attn_ms"]), tuple(t["prompt_len"]),
                   tuple(t["ctx_attn_ms"]))

    def non_attention_ms(self, prefill_tokens: int, decode_seqs: int) -> float:
        if prefill_tokens == 0:
            return interp(self.decode_batch, self.decode_shared_ms, decode_seqs)
        return interp(self.tokens, self.shared_ms, prefill_tokens + decode_seqs)

    def decode_attention_ms(self, batch: int, kv_len: float) -> float:
        """Bilinear in (batch, KV length): attention's work is their product, so within a cell
        bilinear is what the work does."""
        col = [interp(self.kv_len, row, kv_len) for row in self.gen_attn_ms]
        return interp(self.decode_batch, col, batch)

    def prefill_attention_ms(self, pairs: float) -> float:
        """The fresh prompt with these pairs; past the measured prompts, scaled by pairs (the
        quadratic part dominates there)."""
        n = (math.sqrt(8 * pairs + 1) - 1) / 2
        top = self.prompt_len[-1]
        if n > top:
            return self.ctx_attn_ms[-1] * pairs / _pairs(top)
        return interp(self.prompt_len, self.ctx_attn_ms, n)


@lru_cache(maxsize=2)
def load(path: str = str(TABLES)) -> tuple[dict, dict[tuple[str, str, int, str], StepTable], tuple[dict, ...]]:
    """(provenance, {(gpu, model, tp, gemm): table}, silicon rows) of a tables file."""
    data = json.loads(Path(path).read_text())
    tables = {(t["gpu"], t["model"], t["tp"], t["gemm"]): StepTable.from_json(t) for t in data["tables"]}
    return data["provenance"], tables, tuple(data["silicon"])


@dataclass(frozen=True)
class TableStepTime:
    """StepTimeModel over one StepTable. AIConfigurator-derived: a model, not a measurement."""

    table: StepTable
    source: str

    @classmethod
    def for_config(cls, gpu: str, model: str, tp: int, gemm: str = "fp8", path: Path = TABLES) -> "TableStepTime":
        _, tables, _ = load(str(path))
        key = (gpu, model, tp, gemm)
        if key not in tables:
            raise KeyError(f"no AIConfigurator table for {key}; have {sorted(tables)}")
        return cls(tables[key], str(path))

    def step_s(self, shape: StepShape) -> float:
        b, p = shape.decode_seqs, shape.prefill_tokens
        ms = self.table.non_attention_ms(p, b) if b or p else 0.0
        if b:
            # decode_context_tokens is what engine.py fills in; a shape built without it (a
            # decode-only step) still has its context in context_tokens.
            ctx = shape.decode_context_tokens or (shape.context_tokens if p == 0 else 0)
            ms += self.table.decode_attention_ms(b, max(ctx / b, 1.0))
        if p:
            pairs = shape.attention_pairs - shape.decode_context_tokens
            ms += self.table.prefill_attention_ms(pairs if pairs > 0 else _pairs(p))
        return ms / 1000.0

    def provenance(self) -> dict:
        prov, _, _ = load(self.source)
        t = self.table
        return {"kind": "aiconfigurator_table", "gpu": t.gpu, "model": t.model, "tp": t.tp, "gemm": t.gemm,
                "kv_cache": t.kv_cache, "vllm_perf_data": t.perf_data_version, "tool": prov["tool"],
                "tool_version": prov["version"], "generated": prov["generated"],
                "file": "loadtest/sim/gpu_tables/vllm_llama31.json", "license": prov["license"],
                "note": "composed from measured kernel data by AIConfigurator; no engine CPU overhead"}
