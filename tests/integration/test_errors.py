"""Bad input against the real cluster: OpenAI-shaped errors, documented statuses, and the
cluster keeps serving afterwards."""

from __future__ import annotations

import httpx
import pytest

from tests.support.integration_cluster import MAX_MODEL_LEN, MODEL_NAME


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
    # vLLM's server serves a body without `model` with its one model; tandem too.
    resp = httpx.post(f"{base_url}/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=60)
    assert resp.status_code == 200, resp.text


def test_unknown_model_is_404(base_url):
    resp = httpx.post(f"{base_url}/v1/completions", json={"model": "gpt-9", "prompt": "hi"}, timeout=30)
    error = _assert_openai_error(resp, 404)
    assert "gpt-9" in error["message"]


def test_prompt_over_context_is_400_naming_the_limit(base_url):
    long_prompt = [5] * (MAX_MODEL_LEN + 50)  # token ids: exactly this many prompt tokens
    resp = httpx.post(f"{base_url}/v1/completions",
                      json={"model": MODEL_NAME, "prompt": long_prompt, "max_tokens": 8}, timeout=30)
    error = _assert_openai_error(resp, 400)
    assert str(MAX_MODEL_LEN) in error["message"]


@pytest.mark.parametrize("body, param", [
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": -5}, "max_tokens"),
    ({"max_tokens": 10**30}, "max_tokens"),  # huge: the context says no
    ({"seed": 2**64}, "seed"),  # beyond the engine's 64-bit generator
    ({"temperature": "hot"}, "temperature"),
])
def test_bad_parameters_are_clear_400s_naming_the_field(base_url, body, param):
    """As vLLM's own server answers them (its serving code is the edge); the differential
    test (test_compat_differential.py) holds every answer to a plain vLLM server's."""
    resp = httpx.post(f"{base_url}/v1/completions", json={"model": MODEL_NAME, "prompt": "hi", **body}, timeout=30)
    error = _assert_openai_error(resp, 400)
    assert param in f"{error['param']} {error['message']}", error


def test_unknown_fields_are_ignored_as_vllm_does(base_url):
    resp = httpx.post(f"{base_url}/v1/completions", timeout=60,
                      json={"model": MODEL_NAME, "prompt": "hi", "max_tokens": 2, "frobnicate": True})
    assert resp.status_code == 200, resp.text


def test_invalid_utf8_is_400(base_url):
    raw = b'{"model": "' + MODEL_NAME.encode() + b'", "prompt": "caf\xe9"}'  # Latin-1, not UTF-8
    resp = httpx.post(f"{base_url}/v1/completions", content=raw, headers={"Content-Type": "application/json"},
                      timeout=30)
    assert "UTF-8" in _assert_openai_error(resp, 400)["message"]  # tandem's edge: vLLM's would 500


def test_body_over_the_configured_size_is_413(cluster, base_url):
    limit = cluster.cfg.gateway.max_body_bytes
    body = {"model": MODEL_NAME, "prompt": "x" * (limit + 1)}
    resp = httpx.post(f"{base_url}/v1/completions", json=body, timeout=60)
    error = _assert_openai_error(resp, 413)
    assert str(limit) in error["message"] and error["code"] == "payload_too_large"


def test_cluster_still_serves_after_bad_input(base_url):
    resp = httpx.post(f"{base_url}/v1/completions",
                      json={"model": MODEL_NAME, "prompt": "Still alive?", "max_tokens": 4}, timeout=120)
    assert resp.status_code == 200, resp.text
    assert resp.json()["usage"]["completion_tokens"] >= 1
