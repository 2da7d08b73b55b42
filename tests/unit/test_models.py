"""Model preparation: the tiny test Llama (built here) and the cheap paths of SmolLM2's.

The real SmolLM2 conversion (about 30 s, 2 GB) is not run here; `tandem prepare-model` and
the integration tests exercise it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cluster.models import (
    make_tiny_llama,
    prepare_smollm2,
)
from cluster.models import smollm2 as smollm2_module
from cluster.models._common import MARKER

ENGLISH = (
    "The capital of France is Paris. Once upon a time, a curious engineer asked why the "
    "decode step was slow; the answer, as usual, was memory bandwidth (and 2 cores)."
)


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("tiny")
    return make_tiny_llama(root / "a"), make_tiny_llama(root / "b")


@pytest.fixture(scope="module")
def tiny(tiny_dirs):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tiny_dirs[0]
    return path, AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)


def test_tiny_is_byte_identical(tiny_dirs):
    a, b = tiny_dirs
    tree_a, tree_b = _tree(a), _tree(b)
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json", MARKER} <= set(tree_a)
    assert sorted(tree_a) == sorted(tree_b)
    for name in tree_a:
        assert tree_a[name] == tree_b[name], f"{name} differs between two builds"


def test_tiny_is_idempotent_and_leaves_no_temp(tiny_dirs):
    a = tiny_dirs[0]
    before = {p.name: p.stat().st_mtime_ns for p in a.iterdir()}
    assert make_tiny_llama(a) == a
    assert {p.name: p.stat().st_mtime_ns for p in a.iterdir()} == before
    assert sorted(p.name for p in a.parent.iterdir()) == ["a", "b"]


def test_tiny_config(tiny):
    path, tokenizer, model = tiny
    import torch

    config = model.config
    assert (config.hidden_size, config.num_hidden_layers) == (256, 4)
    assert (config.num_attention_heads, config.num_key_value_heads) == (4, 2)
    assert config.intermediate_size == 512
    assert config.max_position_embeddings == 2048
    assert config.tie_word_embeddings is False
    assert config.vocab_size == len(tokenizer)
    assert 300 <= len(tokenizer) <= 1100
    assert model.dtype == torch.float32
    assert config.eos_token_id == tokenizer.eos_token_id == tokenizer.convert_tokens_to_ids(
        "<|endoftext|>"
    )
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    assert tokenizer.model_max_length == 2048
    saved = json.loads((path / "config.json").read_text())
    assert saved["dtype"] == "float32"


def test_tiny_chat_template(tiny):
    _, tokenizer, _ = tiny
    assert tokenizer.chat_template
    messages = [{"role": "user", "content": "Hello there"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    # The ChatML markers are single special tokens.
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in ids


@pytest.mark.parametrize("text", [ENGLISH, "  two  spaces\tand tabs\nnew lines  ",
                                  "café, naïve, Zürich — 東京 🚀 42%"])
def test_tiny_tokenizer_round_trips(tiny, text):
    _, tokenizer, _ = tiny
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert ids
    assert tokenizer.decode(ids) == text


def test_tiny_tokenizer_learned_merges(tiny):
    _, tokenizer, _ = tiny
    # Trained BPE, not raw bytes: ordinary English needs clearly fewer tokens than bytes.
    assert len(tokenizer.encode(ENGLISH, add_special_tokens=False)) < 0.6 * len(ENGLISH)


def test_tiny_greedy_generate(tiny):
    import torch

    _, tokenizer, model = tiny
    inputs = tokenizer("The capital of France is", return_tensors="pt")
    n = inputs["input_ids"].shape[1]
    with torch.no_grad():
        first = model.generate(**inputs, max_new_tokens=5, do_sample=False,
                               pad_token_id=tokenizer.eos_token_id)
        second = model.generate(**inputs, max_new_tokens=5, do_sample=False,
                                pad_token_id=tokenizer.eos_token_id)
    assert torch.equal(first, second)
    assert 0 < first.shape[1] - n <= 5
    assert isinstance(tokenizer.decode(first[0, n:]), str)
    logits = model(**inputs).logits
    assert torch.isfinite(logits).all() and logits.std() > 0


def test_tiny_refuses_foreign_folder(tmp_path):
    dest = tmp_path / "model"
    dest.mkdir()
    (dest / "mine.txt").write_text("not a model")
    with pytest.raises(FileExistsError):
        make_tiny_llama(dest)
    assert (dest / "mine.txt").read_text() == "not a model"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_smollm2_missing_package_says_how_to_fix(tmp_path, monkeypatch):
    monkeypatch.setattr(smollm2_module.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(smollm2_module.ModelSourceMissing, match="make run"):
        prepare_smollm2(tmp_path / "smol", progress=lambda line: None)
    assert not (tmp_path / "smol").exists()
    assert list(tmp_path.iterdir()) == []


def test_smollm2_prepared_folder_returns_at_once(tmp_path, monkeypatch):
    dest = tmp_path / "smol"
    dest.mkdir()
    (dest / MARKER).write_text(json.dumps({"kind": "smollm2"}))

    def boom(name):
        raise AssertionError("must not look for the GGUF when already prepared")

    monkeypatch.setattr(smollm2_module.importlib.util, "find_spec", boom)
    lines: list[str] = []
    assert prepare_smollm2(dest, progress=lines.append) == dest
    assert lines and "ready" in lines[0]


def test_killed_runs_leave_nothing_that_sticks(tmp_path):
    import subprocess
    import sys

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".model.tmp-{dead.pid}-deadbeef"  # a run killed mid-write
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half")
    live = tmp_path / ".model.tmp-1-00000000"  # pid 1 is alive: another run, kept
    live.mkdir()
    dest = make_tiny_llama(tmp_path / "model")
    assert not stale.exists()
    assert live.exists()
    assert (dest / MARKER).is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, "model"])
