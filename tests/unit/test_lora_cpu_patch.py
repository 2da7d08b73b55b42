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


def test_prompt_logprobs_rows_get_an_index_instead_of_killing_the_engine():
    """vLLM's LoRA logits layer gives one index per sampled request while computing one request's
    prompt logprobs (a row per prompt token): vLLM's op fails on the shapes; patched it runs."""
    from vllm.lora.ops.torch_ops import lora_ops

    from cluster.lora_cpu_patch import rows_indices, skipping_no_lora_tokens

    inputs, lora_a, _, _ = _slots()
    prompt_rows = torch.cat([inputs, inputs])  # 6 prompt tokens, 2 requests sampled this step
    vllms_own = getattr(lora_ops.bgmv_shrink, "__wrapped__", lora_ops.bgmv_shrink)
    with pytest.raises(RuntimeError, match="einsum"):
        vllms_own(prompt_rows, lora_a, torch.zeros(6, 4), torch.tensor([1, 1]), 1.0)
    shrunk = torch.zeros(6, 4)
    skipping_no_lora_tokens(vllms_own)(prompt_rows, lora_a, shrunk, torch.tensor([1, 1]), 1.0)
    reference = torch.zeros(6, 4)
    vllms_own(prompt_rows, lora_a, reference, torch.tensor([1] * 6), 1.0)
    assert torch.equal(shrunk, reference)  # every request ran adapter 1: its index for every row
    assert rows_indices(torch.tensor([0, 1]), 3).tolist() == [-1, -1, -1]  # mixed: no delta, no crash
    assert rows_indices(torch.tensor([-1, -1]), 3).tolist() == [-1, -1, -1]


def test_prompt_logprobs_of_a_short_prompt_beside_more_sampled_requests_do_not_kill_the_engine():
    """The other way round (CI, the direct vLLM server: 4 rows of prompt logprobs in a step
    that sampled 5 requests, one of them n=3): more indices than rows."""
    from vllm.lora.ops.torch_ops import lora_ops

    from cluster.lora_cpu_patch import skipping_no_lora_tokens

    inputs, lora_a, _, _ = _slots()  # 3 prompt tokens
    vllms_own = getattr(lora_ops.bgmv_shrink, "__wrapped__", lora_ops.bgmv_shrink)
    five_sampled = torch.tensor([1] * 5)
    with pytest.raises(RuntimeError, match="einsum"):
        vllms_own(inputs, lora_a, torch.zeros(3, 4), five_sampled, 1.0)
    shrunk, reference = torch.zeros(3, 4), torch.zeros(3, 4)
    skipping_no_lora_tokens(vllms_own)(inputs, lora_a, shrunk, five_sampled, 1.0)
    vllms_own(inputs, lora_a, reference, torch.tensor([1] * 3), 1.0)
    assert torch.equal(shrunk, reference)
    mixed = torch.zeros(3, 4)
    skipping_no_lora_tokens(vllms_own)(inputs, lora_a, mixed, torch.tensor([0, 1, 1, 0, -1]), 1.0)
    assert torch.equal(mixed, torch.zeros(3, 4))  # adapters mixed in the step: no delta, no crash

