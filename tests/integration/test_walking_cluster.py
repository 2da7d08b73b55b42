"""The walking cluster, end to end: gateway → prefill engine → NIXL → decode engine.

Everything here is real: Ray Serve, two vLLM engines on CPU, NIXL over UCX/TCP, the tiny
float32 Llama. Greedy output must equal transformers' greedy generate token for token.
"""

from __future__ import annotations

import json

import httpx
import pytest

from loadtest.measure.sse import DONE, payload
from tests.support.integration_cluster import LORA_SEEDS, MODEL_NAME

SERVED = [MODEL_NAME, *LORA_SEEDS]  # the base model, then its LoRA adapters, as vLLM lists them
from tests.support.kv_checks import assert_prompt_kv_moved


PROMPTS = [
    "The quick brown fox jumps over the lazy dog because",
    "Once upon a time, in a small village by the sea, there lived",
    "A serving cluster splits prefill from decode so that",
]
CHATS = [
    [{"role": "user", "content": "Tell me about the sea."}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Why split prefill and decode?"}],
    [{"role": "user", "content": "Count to five."}],
]
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    """transformers' greedy continuation of given token ids, cut after the first EOS."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()

    def greedy(prompt_ids: list[int]) -> list[int]:
        with torch.no_grad():
            out = model.generate(
                torch.tensor([prompt_ids]), max_new_tokens=MAX_TOKENS, do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
            )
        new = out[0, len(prompt_ids):].tolist()
        eos = tokenizer.eos_token_id
        return new[: new.index(eos) + 1] if eos in new else new

    greedy.tokenizer = tokenizer
    return greedy


def _sse_events(response: httpx.Response) -> list[dict]:
    """Every event, parsed, with {"done": True} where the stream said [DONE]."""
    return [{"done": True} if data == DONE else json.loads(data)
            for data in map(payload, response.iter_lines()) if data]


def _decode_stats():
    from ray import serve

    return serve.get_deployment_handle("interactive-decode", app_name="tandem").stats.remote().result()


@pytest.mark.parametrize("prompt", PROMPTS)
def test_completion_greedy_equals_transformers(base_url, reference, prompt):
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
            "return_token_ids": True}
    resp = httpx.post(f"{base_url}/v1/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    out = resp.json()
    prompt_ids = out["choices"][0]["prompt_token_ids"]
    assert prompt_ids == reference.tokenizer(prompt)["input_ids"]
    assert out["choices"][0]["token_ids"] == reference(prompt_ids)
    assert out["usage"]["prompt_tokens"] == len(prompt_ids)
    assert out["usage"]["completion_tokens"] == len(out["choices"][0]["token_ids"])

    with httpx.stream("POST", f"{base_url}/v1/completions", json={**body, "stream": True}, timeout=120) as s:
        assert s.status_code == 200
        events = _sse_events(s)
    assert events[-1] == {"done": True}
    streamed = [t for e in events[:-1] for c in e["choices"] for t in c.get("token_ids", [])]
    assert streamed == out["choices"][0]["token_ids"]
    assert "".join(c["text"] for e in events[:-1] for c in e["choices"]) == out["choices"][0]["text"]


@pytest.mark.parametrize("messages", CHATS)
def test_chat_greedy_equals_transformers(base_url, reference, messages):
    body = {"model": MODEL_NAME, "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0,
            "return_token_ids": True}
    resp = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    out = resp.json()
    rendered = reference.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    expected_prompt = reference.tokenizer(rendered, add_special_tokens=False)["input_ids"]
    assert out["prompt_token_ids"] == expected_prompt
    assert out["choices"][0]["token_ids"] == reference(expected_prompt)
    assert out["choices"][0]["message"]["role"] == "assistant"

    with httpx.stream("POST", f"{base_url}/v1/chat/completions", json={**body, "stream": True}, timeout=120) as s:
        events = _sse_events(s)
    assert events[-1] == {"done": True}
    streamed = [t for e in events[:-1] for c in e["choices"] for t in c.get("token_ids", [])]
    assert streamed == out["choices"][0]["token_ids"]
    text = "".join(c["delta"].get("content") or "" for e in events[:-1] for c in e["choices"])
    assert text == out["choices"][0]["message"]["content"]


def test_kv_cache_really_moves_over_nixl(base_url):
    prompt = "Disaggregation moves the finished KV cache from the prefill engine to decode. " * 6
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    assert_prompt_kv_moved(base_url, body, _decode_stats)


def test_models_and_health(base_url):
    models = httpx.get(f"{base_url}/v1/models", timeout=30).json()
    assert [m["id"] for m in models["data"]] == SERVED
    health = httpx.get(f"{base_url}/health", timeout=30)
    assert health.status_code == 200
    pools = health.json()["pools"]
    assert {"interactive-prefill", "interactive-decode"} <= set(pools)
    assert set(pools.values()) <= {"ready", "busy"}, pools


def test_openai_sdk_works_unchanged(base_url):
    from openai import OpenAI

    client = OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=120)
    assert [m.id for m in client.models.list()] == SERVED

    chat = client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "Hello"}], max_tokens=8, temperature=0, seed=1
    )
    assert chat.choices[0].finish_reason in ("stop", "length")
    assert chat.usage.completion_tokens >= 1

    completion = client.completions.create(model=MODEL_NAME, prompt="Hello there", max_tokens=8, temperature=0)
    assert completion.choices[0].text == client.completions.create(
        model=MODEL_NAME, prompt="Hello there", max_tokens=8, temperature=0
    ).choices[0].text

    stream = client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "Hi"}], max_tokens=8, temperature=0,
        stream=True, stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 1
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    plain = client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "Hi"}], max_tokens=8, temperature=0
    )
    assert streamed == plain.choices[0].message.content

    text_stream = client.completions.create(model=MODEL_NAME, prompt="Hello there", max_tokens=8,
                                            temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in text_stream if c.choices) == completion.choices[0].text


def test_sampling_parameters_are_honoured(base_url):
    common = {"model": MODEL_NAME, "prompt": "Once upon a time", "max_tokens": 16}
    a = httpx.post(f"{base_url}/v1/completions", json={**common, "temperature": 1.0, "top_p": 0.9, "seed": 7},
                   timeout=120).json()
    b = httpx.post(f"{base_url}/v1/completions", json={**common, "temperature": 1.0, "top_p": 0.9, "seed": 7},
                   timeout=120).json()
    assert a["choices"][0]["text"] == b["choices"][0]["text"]  # same seed, same sample

    greedy = httpx.post(f"{base_url}/v1/completions", json={**common, "temperature": 0}, timeout=120).json()
    text = greedy["choices"][0]["text"]
    stop = text[len(text) // 2:][:3]
    if stop.strip():
        stopped = httpx.post(f"{base_url}/v1/completions", json={**common, "temperature": 0, "stop": [stop]},
                             timeout=120).json()
        assert stopped["choices"][0]["finish_reason"] == "stop"
        assert stop not in stopped["choices"][0]["text"]
        assert text.startswith(stopped["choices"][0]["text"])
    capped = httpx.post(f"{base_url}/v1/completions", json={**common, "temperature": 0, "max_tokens": 3,
                                                            "ignore_eos": True}, timeout=120).json()
    assert capped["usage"]["completion_tokens"] == 3
    assert capped["choices"][0]["finish_reason"] == "length"
