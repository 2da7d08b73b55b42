"""cluster/lora_cpu_patch.py (UPSTREAM.md row 26): vLLM's CPU LoRA ops give a token without an
adapter (index -1) the last adapter slot's delta; patched, they give it none and leave every
other token's result as vLLM computes it."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def _slots():
    gen = torch.Generator().manual_seed(0)
    inputs = torch.randn(3, 8, generator=gen)
    lora_a = torch.randn(2, 1, 4, 8, generator=gen)  # 2 adapter slots, rank 4
    lora_b = torch.randn(2, 1, 8, 4, generator=gen)
    return inputs, lora_a, lora_b, torch.tensor([0, -1, 1])  # the middle token runs no adapter


def test_vllms_cpu_ops_still_give_a_base_token_the_last_adapters_delta():
    """When this fails, vLLM fixed its ops (PR #48421): retire cluster/lora_cpu_patch.py and its
    UPSTREAM.md row."""
    from vllm.lora.ops.torch_ops import lora_ops

    inputs, lora_a, _, indices = _slots()
    shrunk = torch.zeros(3, 4)
    vllms_own = getattr(lora_ops.bgmv_shrink, "__wrapped__", lora_ops.bgmv_shrink)  # unpatched
    vllms_own(inputs, lora_a, shrunk, indices, 1.0)
    assert shrunk[1].abs().sum() > 0, "vLLM's bgmv_shrink now skips index -1: retire cluster/lora_cpu_patch.py"


def test_the_patched_ops_skip_base_tokens_and_keep_the_rest():
    from vllm.lora.ops.torch_ops import lora_ops

    from cluster.lora_cpu_patch import skipping_no_lora_tokens

    inputs, lora_a, lora_b, indices = _slots()
    original = getattr(lora_ops.bgmv_shrink, "__wrapped__", lora_ops.bgmv_shrink)
    reference = torch.zeros(3, 4)
    original(inputs, lora_a, reference, indices.clamp(min=0), 1.0)
    shrunk = torch.zeros(3, 4)
    skipping_no_lora_tokens(original)(inputs, lora_a, shrunk, indices, 1.0)
    assert torch.equal(shrunk[1], torch.zeros(4))
    assert torch.equal(shrunk[[0, 2]], reference[[0, 2]])
    # Expanded into the base layer's output: the base token's row is left as the base model made it.
    base_out = torch.randn(3, 8)
    out = base_out.clone()
    expand = getattr(lora_ops.bgmv_expand, "__wrapped__", lora_ops.bgmv_expand)
    skipping_no_lora_tokens(expand)(shrunk, lora_b, out, indices, True)
    assert torch.equal(out[1], base_out[1]) and not torch.equal(out[0], base_out[0])


def test_apply_patches_every_name_vllm_calls_once():
    import importlib

    from cluster import lora_cpu_patch

    lora_cpu_patch.apply()
    lora_cpu_patch.apply()  # idempotent: no wrapper around a wrapper
    for home in lora_cpu_patch.HOMES:
        module = importlib.import_module(home)
        for name in lora_cpu_patch.PATCHED_OPS:
            op = getattr(module, name)
            assert op._tandem_skips_no_lora and not getattr(op.__wrapped__, "_tandem_skips_no_lora", False)
