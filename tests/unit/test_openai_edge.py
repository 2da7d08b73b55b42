"""tandem's edge around vLLM's own app (router/openai/edge.py, engine_client.py), over a fake
backend: what is tandem's own — probes, readiness, refusals with their status, the request's
tier and salt, FINAL_ONLY aggregation — while vLLM's serving code builds every answer."""

from __future__ import annotations

import json

import pytest

from router.openai.context import Caller
from router.openai.errors import OpenAIError, too_many_requests
from tests.support.fakes import FakeBackend
from tests.support.openai_helpers import MODEL, TIER, assert_openai_error, make_client, sse_events

CHAT = [{"role": "user", "content": "hello there"}]


def test_non_streamed_answers_aggregate_every_delta_and_count_usage() -> None:
    client, backend = make_client()
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "one two three four", "max_tokens": 3,
                                             "return_token_ids": True})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    (request,) = backend.requests
    expected = list(request.prompt_token_ids[:3])
    assert choice["token_ids"] == expected and choice["finish_reason"] == "length"
    assert choice["text"] == "".join(f"{t} " for t in expected)
    usage = r.json()["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (len(request.prompt_token_ids), 3)
    assert request.tier == TIER and request.sampling.max_tokens == 3 and request.sampling.n == 1


def test_a_stream_is_vllms_sse_with_usage_last() -> None:
    client, _ = make_client()
    r = client.post("/v1/chat/completions", json={"model": MODEL, "messages": CHAT, "max_tokens": 2, "stream": True,
                                                  "stream_options": {"include_usage": True}})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r)
    assert events[-1] == "[DONE]"
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert events[-2]["usage"]["completion_tokens"] == 2 and events[-2]["choices"] == []


@pytest.mark.parametrize("stream", [False, True])
def test_a_refusal_before_the_first_token_is_the_response_with_retry_after(stream: bool) -> None:
    backend = FakeBackend()
    backend.fail_after, backend.fail_with = 0, too_many_requests("The interactive tier is full.", retry_after_s=3)
    client, _ = make_client(backend)
    r = client.post("/v1/chat/completions", json={"model": MODEL, "messages": CHAT, "stream": stream})
    assert_openai_error(r, 429, contains="tier is full")
    assert r.headers["Retry-After"] == "3"


def test_an_engine_error_mid_stream_is_vllms_error_event_then_done() -> None:
    backend = FakeBackend()
    backend.fail_after = 2
    client, _ = make_client(backend)
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "one two three four five", "max_tokens": 5,
                                             "stream": True})
    assert r.status_code == 200
    events = sse_events(r)
    assert events[-1] == "[DONE]" and "error" in events[-2]
    assert "Traceback" not in r.text


def test_a_rate_limit_refusal_is_a_429_before_any_engine_work() -> None:
    async def refuse(tenant, tokens):
        assert tokens == 8 + 2 * 4  # prompt + max_tokens × n
        raise OpenAIError(429, "Rate limit reached.", "rate_limit_error", None, "rate_limit_exceeded",
                          headers={"Retry-After": "7"})

    client, backend = make_client(rate_limit=refuse)
    prompt = list(range(10, 18))
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 4, "n": 2})
    assert_openai_error(r, 429, code="rate_limit_exceeded")
    assert r.headers["Retry-After"] == "7" and backend.requests == []


def test_not_ready_until_every_pool_answers() -> None:
    backend = FakeBackend()
    backend.ready = False
    client, _ = make_client(backend)
    r = client.get("/v1/models")
    assert_openai_error(r, 503, code="model_loading")
    assert r.headers["Retry-After"] == "5"
    assert client.get("/health").status_code == 503
    assert client.get("/livez").status_code == 200
    backend.ready = True
    assert client.get("/v1/models").json()["data"][0]["id"] == MODEL
    assert client.get("/health").json() == {"status": "ready", "replicas": 1}


def test_the_tenants_salt_and_tier_reach_the_engine_request() -> None:
    client, backend = make_client(authenticate=lambda headers: Caller(headers.get("x-tier", TIER), "t", "tenant-salt"))
    body = {"model": MODEL, "messages": CHAT, "max_tokens": 1}
    assert client.post("/v1/chat/completions", json=body, headers={"x-tier": "batch"}).status_code == 200
    assert client.post("/v1/chat/completions", json={**body, "cache_salt": "mine"}).status_code == 200
    first, second = backend.requests
    assert (first.tier, first.cache_salt) == ("batch", "tenant-salt")
    assert (second.tier, second.cache_salt) == (TIER, "tenant-salt:mine")


def test_request_id_is_echoed_or_generated() -> None:
    client, _ = make_client()
    assert client.get("/v1/models", headers={"X-Request-Id": "abc-123"}).headers["X-Request-Id"] == "abc-123"
    assert client.get("/v1/models").headers["X-Request-Id"].startswith("req-")


def test_a_body_over_the_limit_is_413_and_unknown_routes_are_404() -> None:
    client, backend = make_client(max_body_bytes=2048)
    r = client.post("/v1/completions", content=json.dumps({"model": MODEL, "prompt": "x" * 4096}),
                    headers={"content-type": "application/json"})
    assert_openai_error(r, 413)
    assert client.get("/v1/nothing-here").status_code == 404
    assert backend.requests == []


def test_vllms_own_routes_are_served_through_the_edge() -> None:
    client, _ = make_client()
    tokens = client.post("/tokenize", json={"model": MODEL, "prompt": "hello world"}).json()["tokens"]
    assert client.post("/detokenize", json={"model": MODEL, "tokens": tokens}).json()["prompt"].strip() == "hello world"
    assert client.get("/version").json()["version"]
    assert client.get("/docs").status_code == 200
    r = client.post("/v1/responses", json={"model": MODEL, "input": "hi", "max_output_tokens": 2})
    assert r.status_code == 200 and r.json()["object"] == "response"


def test_the_openai_sdk_talks_to_the_edge() -> None:
    import openai

    client, _ = make_client()
    sdk = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=client)
    chat = sdk.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2)
    assert chat.choices[0].finish_reason == "length" and chat.usage.completion_tokens == 2
    stream = sdk.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2, stream=True)
    assert sum(1 for chunk in stream for c in chunk.choices if c.delta.content) == 2
    # The assistant message as the SDK dumps it, appended to the history: the next turn works.
    history = [*CHAT, chat.choices[0].message.model_dump(), {"role": "user", "content": "and?"}]
    assert sdk.chat.completions.create(model=MODEL, messages=history, max_tokens=1).choices


@pytest.mark.parametrize("path", ["/metrics", "/kv_event_sources", "/scale_elastic_ep"])
def test_vllms_engine_routes_are_not_on_the_api_port(path: str) -> None:
    client, _ = make_client()
    assert_openai_error(client.post(path, json={}), 404, code="unknown_url")


def test_the_models_generation_config_fills_omitted_sampling_settings(tmp_path) -> None:
    """As `vllm serve`: generation_config.json's temperature/top_p/top_k apply when a request
    omits them, and a request's own value wins."""
    import asyncio
    import shutil

    from fastapi.testclient import TestClient

    from router.openai.app import build_openai_app, vllm_config_of, vllm_server_args
    from router.openai.engine_client import PDEngineClient
    from tests.support.openai_helpers import vllm_setup

    model = tmp_path / "tiny-with-defaults"
    shutil.copytree(vllm_setup()[0].model, model)
    config = json.loads((model / "generation_config.json").read_text())
    (model / "generation_config.json").write_text(json.dumps({**config, "temperature": 0.3, "top_p": 0.5,
                                                              "top_k": 7}))
    args = vllm_server_args(model_path=model, served_name=MODEL, dtype="float32", max_model_len=256)
    backend = FakeBackend()
    engine_client = PDEngineClient(vllm_config_of(args), backend, TIER)
    app = asyncio.run(build_openai_app(engine_client, args, authenticate=lambda h: Caller(TIER),
                                       health_probe=backend.health, health_interval_s=0))
    client = TestClient(app)
    body = {"model": MODEL, "messages": CHAT, "max_tokens": 1}
    assert client.post("/v1/chat/completions", json=body).status_code == 200
    assert client.post("/v1/chat/completions", json={**body, "temperature": 0.9}).status_code == 200
    defaults, own = (r.sampling for r in backend.requests)
    assert (defaults.temperature, defaults.top_p, defaults.top_k) == (0.3, 0.5, 7)
    assert own.temperature == 0.9 and own.top_p == 0.5


@pytest.mark.parametrize("stream", [False, True])
def test_an_engine_replicas_vllm_error_carried_by_ray_fails_only_its_request(stream: bool) -> None:
    """Ray hands the gateway an engine replica's exception as a class derived from its cause's:
    an EngineDeadError there must not reach vLLM's handler for a local dead engine here (it
    read the uvicorn server tandem does not run: a 500 saying "'State' object has no attribute
    'server'", seen by the fuzz test). The request fails in OpenAI's shape; the gateway serves on."""
    from ray.exceptions import RayTaskError
    from vllm.v1.engine.exceptions import EngineDeadError

    backend = FakeBackend()
    backend.fail_after = 0
    backend.fail_with = RayTaskError("run", "Traceback (in the decode replica)", EngineDeadError()).as_instanceof_cause()
    assert isinstance(backend.fail_with, EngineDeadError)
    client, _ = make_client(backend)
    body = {"model": MODEL, "messages": CHAT, "max_tokens": 2, "stream": stream}
    r = client.post("/v1/chat/completions", json=body)
    if stream:
        assert r.status_code == 200
        error = sse_events(r)[0]["error"]
        assert error["code"] == 500 and "engine failed the request" in error["message"]
    else:
        assert_openai_error(r, 500, contains="engine failed the request")
        assert "state" not in r.text.lower()
    backend.fail_after = None
    assert client.post("/v1/chat/completions", json={**body, "stream": False}).status_code == 200
