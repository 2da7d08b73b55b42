"""Bad input against the real cluster: OpenAI-shaped errors, documented statuses, and the
cluster keeps serving afterwards."""

from __future__ import annotations

import httpx
import pytest

from tests.integration.conftest import MAX_MODEL_LEN, MODEL_NAME

pytestmark = pytest.mark.integration


def _assert_openai_error(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert error["type"] and error["message"]
    assert "Traceback" not in resp.text
    return error


def test_malformed_json_is_400(base_url):
    resp = httpx.post(f"{base_url}/v1/chat/completions", content=b'{"model": "x", "messages": [',
                      headers={"Content-Type": "application/json"}, timeout=30)
    _assert_openai_error(resp, 400)


def test_wrong_types_are_400_naming_the_field(base_url):
    resp = httpx.post(f"{base_url}/v1/completions",
                      json={"model": MODEL_NAME, "prompt": "hi", "max_tokens": "many"}, timeout=30)
    assert "max_tokens" in _assert_openai_error(resp, 400)["message"]
    resp = httpx.post(f"{base_url}/v1/chat/completions",
                      json={"model": MODEL_NAME, "messages": "not a list"}, timeout=30)
    assert "messages" in _assert_openai_error(resp, 400)["message"]


def test_missing_key_is_400(base_url):
    resp = httpx.post(f"{base_url}/v1/chat/completions", json={"model": MODEL_NAME}, timeout=30)
    assert "messages" in _assert_openai_error(resp, 400)["message"]
    resp = httpx.post(f"{base_url}/v1/completions", json={"prompt": "hi"}, timeout=30)
    assert "model" in _assert_openai_error(resp, 400)["message"]


def test_unknown_model_is_404(base_url):
    resp = httpx.post(f"{base_url}/v1/completions", json={"model": "gpt-9", "prompt": "hi"}, timeout=30)
    error = _assert_openai_error(resp, 404)
    assert "gpt-9" in error["message"]


def test_prompt_over_context_is_400_naming_the_limit(base_url):
    long_prompt = "word " * (MAX_MODEL_LEN + 50)
    resp = httpx.post(f"{base_url}/v1/completions",
                      json={"model": MODEL_NAME, "prompt": long_prompt, "max_tokens": 8}, timeout=30)
    error = _assert_openai_error(resp, 400)
    assert str(MAX_MODEL_LEN) in error["message"]
    # Prompt fits, prompt + max_tokens does not.
    resp = httpx.post(f"{base_url}/v1/completions",
                      json={"model": MODEL_NAME, "prompt": "hello", "max_tokens": MAX_MODEL_LEN}, timeout=30)
    assert str(MAX_MODEL_LEN) in _assert_openai_error(resp, 400)["message"]


def test_cluster_still_serves_after_bad_input(base_url):
    resp = httpx.post(f"{base_url}/v1/completions",
                      json={"model": MODEL_NAME, "prompt": "Still alive?", "max_tokens": 4}, timeout=120)
    assert resp.status_code == 200, resp.text
    assert resp.json()["usage"]["completion_tokens"] >= 1
