"""PromptTokenizer against a real Hugging Face tokenizer (the tiny test model's BPE)."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.openai.errors import OpenAIError
from router.openai.tokenizer import PromptTokenizer

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def hf_tokenizer(tiny_model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


def test_encode_matches_the_model_tokenizer(tiny_model_dir: Path, hf_tokenizer) -> None:
    tok = PromptTokenizer(tiny_model_dir)
    text = "The capital of France is Paris."
    assert tok.encode(text) == list(hf_tokenizer.encode(text))
    assert tok.decode(tok.encode(text)).strip() == text
    assert tok.vocab_size == len(hf_tokenizer)


def test_chat_renders_the_template_with_a_generation_prompt(tiny_model_dir: Path, hf_tokenizer) -> None:
    tok = PromptTokenizer(tiny_model_dir)
    ids = tok.chat(MESSAGES)
    assert all(isinstance(i, int) for i in ids)
    rendered = hf_tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert rendered.endswith("<|im_start|>assistant\n")
    assert hf_tokenizer.decode(ids) == rendered


def test_a_model_without_chat_template_refuses_chat_with_400(tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    raw = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    raw.chat_template = None
    tok = PromptTokenizer(tiny_model_dir, tokenizer=raw)
    with pytest.raises(OpenAIError) as info:
        tok.chat(MESSAGES)
    assert info.value.status == 400 and info.value.param == "messages"
    assert "/v1/completions" in info.value.message
    assert tok.encode("hello")  # completions still work


def test_a_template_that_rejects_the_conversation_is_400(tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    raw = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    raw.chat_template = "{{ raise_exception('Conversation roles must alternate user/assistant') }}"
    with pytest.raises(OpenAIError) as info:
        PromptTokenizer(tiny_model_dir, tokenizer=raw).chat(MESSAGES)
    assert info.value.status == 400 and "must alternate" in info.value.message


def test_the_app_sends_the_template_token_ids_to_the_engine(tiny_model_dir: Path) -> None:
    from tests.fakes import FakeBackend
    from tests.unit.openai_helpers import MODEL, make_client

    tok = PromptTokenizer(tiny_model_dir)
    backend = FakeBackend(model_id=MODEL, max_model_len=512)
    backend.tokenizer = tok  # type: ignore[assignment]
    client, _ = make_client(backend)
    r = client.post("/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES, "max_tokens": 4})
    assert r.status_code == 200, r.text
    assert list(backend.requests[0].prompt_token_ids) == tok.chat(MESSAGES)
    assert r.json()["usage"]["prompt_tokens"] == len(tok.chat(MESSAGES))
