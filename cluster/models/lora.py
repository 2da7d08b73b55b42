"""Small LoRA adapters for a local Llama-shaped model: seeded random rank-r weights on the
attention projections (q, k, v, o), written in PEFT's own format (adapter_config.json +
adapter_model.safetensors), so vLLM loads them as any fine-tuned adapter. No download, and
byte-identical per seed: tests compare adapters' greedy answers between engines.

The weights are random and large enough that an adapter's greedy text differs from the base
model's and from another seed's: a request decoded with the wrong adapter shows.
"""

from __future__ import annotations

import json
from pathlib import Path

from ._common import make_temp_dir, normalize_modes, publish, read_marker, write_marker

VERSION = 1
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")


def _shapes(config: dict) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each attention projection."""
    hidden = config["hidden_size"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    q = config["num_attention_heads"] * head_dim
    kv = config.get("num_key_value_heads", config["num_attention_heads"]) * head_dim
    return {"q_proj": (hidden, q), "k_proj": (hidden, kv), "v_proj": (hidden, kv), "o_proj": (q, hidden)}


def make_lora_adapter(base: Path, dest: Path, *, seed: int, rank: int = 8) -> Path:
    """A LoRA adapter for the model in `base`, at `dest` (kept when already made alike)."""
    info = {"kind": "lora-adapter", "version": VERSION, "seed": seed, "rank": rank, "base": Path(base).name}
    if read_marker(dest) == info:
        return Path(dest)
    import torch
    from safetensors.torch import save_file

    config = json.loads((Path(base) / "config.json").read_text())
    generator = torch.Generator().manual_seed(seed)
    weights = {}
    for layer in range(config["num_hidden_layers"]):
        for name, (fan_in, fan_out) in _shapes(config).items():
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{name}"
            weights[f"{prefix}.lora_A.weight"] = torch.randn(rank, fan_in, generator=generator) / fan_in ** 0.5
            weights[f"{prefix}.lora_B.weight"] = torch.randn(fan_out, rank, generator=generator) / rank ** 0.5
    tmp = make_temp_dir(Path(dest))
    save_file(weights, str(tmp / "adapter_model.safetensors"))
    (tmp / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": str(base), "r": rank,
        "lora_alpha": 2 * rank, "lora_dropout": 0.0, "target_modules": list(PROJECTIONS), "bias": "none",
        "fan_in_fan_out": False, "modules_to_save": None, "use_rslora": False, "use_dora": False,
    }, indent=2, sort_keys=True))
    write_marker(tmp, info)
    normalize_modes(tmp)
    return publish(tmp, Path(dest))
