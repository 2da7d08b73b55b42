"""An opt-in patch of vLLM 0.32's CPU LoRA ops: a base-model request batched beside LoRA
requests must get no adapter's delta.

vLLM marks a token that runs no adapter with the LoRA index -1. Its GPU kernels skip such
tokens; its CPU fallback (vllm/lora/ops/torch_ops/lora_ops.py, `bgmv_shrink`, `bgmv_expand`,
`bgmv_expand_slice`, and the `sgmv_*` ops that call them) gathers `weights[indices]`, and -1
selects the *last* adapter slot. So on a CPU engine with LoRA on, a base-model request that
shares a step with adapter requests is computed with an adapter's delta: wrong text, no error,
depending on what else the engine is running (measured: the tiny Llama's greedy "The sky is"
alone and in a batch with two adapters' requests differ; vllm-project/vllm PR #48421, open).

A second fault of the same ops: computing a request's prompt logprobs, vLLM's LoRA logits layer
passes one index per sampled request for a row per prompt token, and the op fails on the
shapes whenever the two counts differ, either way (the engine dies). Seen in CI with
prompt_logprobs batched beside other requests: first fewer sampled requests than prompt rows,
then more (4 prompt rows in a step that sampled 5 requests, an n=3 one among them).
`rows_indices` gives every row an index.

The fix keeps vLLM's own ops and uses that they are linear in their input: the rows of
tokens without an adapter are zeroed before the op runs (their delta is then exactly 0, added
or assigned) and their index clamped to a valid slot. Loaded through tandem's vLLM plugin
(cluster/vllm_plugin.py) in every vLLM process; acts only where the engine wrapper set
TANDEM_LORA_CPU_PATCH=1 (a CPU engine serving adapters, cluster/engine/vllm.py).
UPSTREAM.md row 26; tests/unit/test_lora_cpu_patch.py says when vLLM's own ops are fixed.
"""

from __future__ import annotations

import functools
import logging
import sys
from typing import Any, Callable

log = logging.getLogger("vllm.tandem_lora_cpu_patch")  # through vLLM's handler in its children
ENV_FLAG = "TANDEM_LORA_CPU_PATCH"
PATCHED_OPS = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice")
# Where vLLM binds those names: the ops module, the package that re-exports them, and the CPU
# Punica wrapper that imports them from the package.
HOMES = ("vllm.lora.ops.torch_ops.lora_ops", "vllm.lora.ops.torch_ops", "vllm.lora.punica_wrapper.punica_cpu")


def skipping_no_lora_tokens(op: Callable[..., Any]) -> Callable[..., Any]:
    """`op(inputs, weights, output, indices, ...)` with the tokens of index -1 given no delta."""
    if getattr(op, "_tandem_skips_no_lora", False):
        return op

    @functools.wraps(op)
    def patched(inputs: Any, weights: Any, output: Any, indices: Any, *args: Any, **kwargs: Any) -> Any:
        if indices.shape[0] != inputs.shape[0]:  # prompt logprobs: see rows_indices
            indices = rows_indices(indices, inputs.shape[0])
        no_lora = indices[: inputs.shape[0]] < 0
        if bool(no_lora.any()):
            inputs = inputs.clone()
            inputs[: no_lora.shape[0]][no_lora] = 0
            indices = indices.clamp(min=0)
        return op(inputs, weights, output, indices, *args, **kwargs)

    patched._tandem_skips_no_lora = True  # type: ignore[attr-defined]
    return patched


def rows_indices(indices: Any, rows: int) -> Any:
    """One index per input row where vLLM gave another count: its LoRA logits layer passes one index per
    sampled request (`sampler_indices`) while computing a request's prompt logprobs, a row per
    prompt token, and its CPU op then fails (einsum shapes), killing the engine. When every
    request of the step runs the same adapter (or none) that index is right for every row;
    otherwise the rows get none: the logits delta of an adapter that trains `lm_head` is left out
    of such prompt logprobs (an adapter of attention and MLP layers has no logits delta at all)."""
    import torch

    same = indices.numel() > 0 and bool((indices == indices[0]).all())
    fill = int(indices[0]) if same else -1
    return torch.full((rows,), fill, dtype=indices.dtype, device=indices.device)


def apply() -> None:
    import importlib

    for home in HOMES:
        module = sys.modules.get(home) or importlib.import_module(home)
        for name in PATCHED_OPS:
            setattr(module, name, skipping_no_lora_tokens(getattr(module, name)))
    log.info("tandem: vLLM's CPU LoRA ops skip tokens without an adapter (vLLM PR #48421)")
