"""The OpenAI edge over HTTP, against the fake backend: happy paths, streams, models, health."""

from __future__ import annotations

import pytest

from router.openai.errors import too_many_requests
from tests.fakes import FakeBackend, FakeTokenizer
from tests.unit.openai_helpers import MODEL, assert_openai_error, make_client, sse_events


@pytest.fixture()
def client_and_backend():
    return make_client()


def test_completion_non_stream_counts_usage_and_finishes_by_length(client_and_backend) -> None:
    client, backend = client_and_backend
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "hello world", "max_tokens": 5})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion"
    assert body["id"].startswith("cmpl-")
    assert body["model"] == MODEL
    assert isinstance(body["created"], int)
    assert body["choices"] == [{"index": 0, "text": "hello", "logprobs": None, "finish_reason": "length"}]
    assert body["usage"] == {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16}
    assert "prompt_token_ids" not in body
    (sent,) = backend.requests
    assert sent.request_id == body["id"]
    assert sent.prompt_token_ids == tuple(b"hello world")
    assert backend.aborted == []


def test_completion_sampling_settings_reach_the_engine(client_and_backend) -> None:
    client, backend = client_and_backend
    r = client.post(
        "/v1/completions",
        json={
            "model": MODEL, "prompt": "hi", "max_tokens": 10, "temperature": 0, "top_p": 0.5,
            "seed": 7, "stop": ["\n", "END"], "ignore_eos": False, "min_tokens": 2, "user": "u1",
        },
    )
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] == "stop"
    assert r.json()["usage"] == {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}
    s = backend.requests[0].sampling
    assert (s.max_tokens, s.temperature, s.top_p, s.seed, s.stop, s.ignore_eos, s.min_tokens) == (
        10, 0.0, 0.5, 7, ("\n", "END"), False, 2,
    )


def test_completion_defaults(client_and_backend) -> None:
    client, backend = client_and_backend
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "x" * 40, "stop": "q"})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 16  # OpenAI's default max_tokens
    s = backend.requests[0].sampling
    assert (s.max_tokens, s.temperature, s.top_p, s.seed, s.stop, s.min_tokens) == (16, 1.0, 1.0, None, ("q",), 0)


@pytest.mark.parametrize("prompt", [[104, 105], ["hi"]])
def test_completion_accepts_token_ids_and_a_one_string_list(client_and_backend, prompt) -> None:
    client, backend = client_and_backend
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": prompt})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == "hi"
    assert backend.requests[0].prompt_token_ids == (104, 105)


def test_chat_non_stream_fills_the_context_when_max_tokens_is_omitted(client_and_backend) -> None:
    client, backend = client_and_backend
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    r = client.post("/v1/chat/completions", json={"model": MODEL, "messages": messages})
    assert r.status_code == 200, r.text
    body = r.json()
    rendered = "system: be brief\nuser: hi\nassistant: "
    assert body["object"] == "chat.completion"
    assert body["id"].startswith("chatcmpl-")
    assert body["choices"] == [
        {"index": 0, "message": {"role": "assistant", "content": rendered}, "logprobs": None, "finish_reason": "stop"}
    ]
    n = len(rendered)
    assert body["usage"] == {"prompt_tokens": n, "completion_tokens": n, "total_tokens": 2 * n}
    assert backend.requests[0].sampling.max_tokens == backend.max_model_len - n


def test_chat_text_parts_and_max_completion_tokens(client_and_backend) -> None:
    client, backend = client_and_backend
    content = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    r = client.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": content}], "max_completion_tokens": 3},
    )
    assert r.status_code == 200, r.text
    assert backend.requests[0].prompt_token_ids == tuple(b"user: a\nb\nassistant: ")
    assert backend.requests[0].sampling.max_tokens == 3
    assert r.json()["choices"][0] == {
        "index": 0, "message": {"role": "assistant", "content": "use"}, "logprobs": None, "finish_reason": "length",
    }


def test_completion_stream_ends_with_done_and_no_usage_by_default(client_and_backend) -> None:
    client, backend = client_and_backend
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "abc", "stream": True})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert [c["choices"][0]["text"] for c in chunks] == ["a", "b", "c"]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, "stop"]
    assert all(c["object"] == "text_completion" and c["model"] == MODEL for c in chunks)
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"] == backend.requests[0].request_id
    assert all("usage" not in c for c in chunks)
    assert backend.aborted == []


def test_chat_stream_role_first_and_usage_last(client_and_backend) -> None:
    client, backend = client_and_backend
    r = client.post(
        "/v1/chat/completions",
        json={
            "model": MODEL, "messages": [{"role": "user", "content": "yo"}], "max_tokens": 4,
            "stream": True, "stream_options": {"include_usage": True},
        },
    )
    assert r.status_code == 200, r.text
    events = sse_events(r)
    assert events[-1] == "[DONE]"
    role, *deltas, usage = events[:-1]
    assert role["object"] == "chat.completion.chunk"
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(d["choices"][0]["delta"]["content"] for d in deltas) == "user"
    assert deltas[-1]["choices"][0]["finish_reason"] == "length"
    assert all(c["usage"] is None for c in [role, *deltas])
    assert usage["choices"] == []
    prompt_len = len("user: yo\nassistant: ")
    assert usage["usage"] == {"prompt_tokens": prompt_len, "completion_tokens": 4, "total_tokens": prompt_len + 4}


def test_return_token_ids_non_stream(client_and_backend) -> None:
    client, _ = client_and_backend
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "hey", "return_token_ids": True})
    body = r.json()
    assert body["prompt_token_ids"] == list(b"hey")
    assert body["choices"][0]["token_ids"] == list(b"hey")
    r = client.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "q"}], "max_tokens": 2, "return_token_ids": True},
    )
    body = r.json()
    assert body["prompt_token_ids"] == list(b"user: q\nassistant: ")
    assert body["choices"][0]["token_ids"] == list(b"us")


def test_return_token_ids_stream(client_and_backend) -> None:
    client, _ = client_and_backend
    r = client.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "q"}], "max_tokens": 2,
              "return_token_ids": True, "stream": True},
    )
    role, *deltas, done = sse_events(r)
    assert done == "[DONE]"
    assert role["prompt_token_ids"] == list(b"user: q\nassistant: ")
    assert [d["choices"][0]["token_ids"] for d in deltas] == [[ord("u")], [ord("s")]]


def test_models_list_and_retrieve(client_and_backend) -> None:
    client, backend = client_and_backend
    body = client.get("/v1/models").json()
    assert body["object"] == "list"
    (card,) = body["data"]
    assert card["id"] == MODEL and card["object"] == "model" and card["owned_by"] == "tandem"
    assert card["max_model_len"] == backend.max_model_len
    assert client.get(f"/v1/models/{MODEL}").json() == card
    assert_openai_error(client.get("/v1/models/other"), 404, param="model", code="model_not_found")


def test_health_ready_and_not_ready() -> None:
    client, backend = make_client(health_interval_s=0)  # no cache: each call sees the change
    r = client.get("/health")
    assert r.status_code == 200
    assert r.json() == {"status": "ready", "replicas": 1}
    backend.ready = False
    backend.health_details = {"replicas": 0, "waiting_for": "decode"}
    error = assert_openai_error(client.get("/health"), 503, type_="service_unavailable")
    assert error["details"] == {"replicas": 0, "waiting_for": "decode"}
    backend.health_raises = True
    assert_openai_error(client.get("/health"), 503)


def test_request_id_is_echoed_or_generated(client_and_backend) -> None:
    client, _ = client_and_backend
    r = client.get("/v1/models", headers={"X-Request-Id": "abc-123"})
    assert r.headers["x-request-id"] == "abc-123"
    r = client.post("/v1/completions", json={"model": "nope", "prompt": "x"}, headers={"X-Request-Id": "e-1"})
    assert r.status_code == 404 and r.headers["x-request-id"] == "e-1"
    assert client.get("/v1/models").headers["x-request-id"].startswith("req-")


def test_backend_rejection_before_first_token_keeps_its_status() -> None:
    client, backend = make_client()
    backend.fail_after = 0
    backend.fail_with = too_many_requests("interactive tier is full", retry_after_s=3)
    for stream in (False, True):
        r = client.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "stream": stream})
        assert_openai_error(r, 429, code="rate_limit_exceeded")
        assert r.headers["retry-after"] == "3"
    assert len(backend.aborted) == 2  # abort is idempotent; the edge always cleans up


def test_error_mid_stream_becomes_one_error_event_then_done() -> None:
    client, backend = make_client()
    backend.fail_after = 3
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "abcdef", "stream": True},
                    headers={"X-Request-Id": "mid-1"})
    assert r.status_code == 200
    assert "Traceback" not in r.text and "exploded" not in r.text
    events = sse_events(r)
    assert [e["choices"][0]["text"] for e in events[:3]] == ["a", "b", "c"]
    error = events[3]["error"]
    assert error["type"] == "internal_error" and "mid-1" in error["message"]
    assert events[4:] == ["[DONE]"]
    assert backend.aborted == [backend.requests[0].request_id]


def test_engine_error_finish_is_not_reported_as_success() -> None:
    client, backend = make_client()
    backend.finish_reason = "error"
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "hi"})
    assert_openai_error(r, 500, type_="internal_error")
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "stream": True})
    events = sse_events(r)
    assert events[-2]["error"]["type"] == "internal_error" and events[-1] == "[DONE]"


def test_unexpected_exception_is_a_generic_500_with_the_request_id(caplog: pytest.LogCaptureFixture) -> None:
    tokenizer = FakeTokenizer()
    tokenizer.encode = lambda text: 1 / 0  # type: ignore[method-assign]
    client, _ = make_client(FakeBackend(model_id=MODEL, tokenizer=tokenizer))
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "hi"}, headers={"X-Request-Id": "boom-7"})
    error = assert_openai_error(r, 500, type_="internal_error")
    assert "boom-7" in error["message"] and "ZeroDivision" not in r.text
    assert r.headers["x-request-id"] == "boom-7"
    logged = [rec for rec in caplog.records if rec.exc_info and "boom-7" in rec.getMessage()]
    assert logged and logged[0].exc_info[0] is ZeroDivisionError  # the detail stays server side


def test_openai_sdk_talks_to_the_edge(client_and_backend) -> None:
    openai = pytest.importorskip("openai")
    client, _ = client_and_backend
    sdk = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=client, max_retries=0)
    out = sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert out.choices[0].message.content == "use" and out.usage.completion_tokens == 3
    stream = sdk.completions.create(model=MODEL, prompt="xyz", stream=True, stream_options={"include_usage": True})
    parts = list(stream)
    assert "".join(p.choices[0].text for p in parts if p.choices) == "xyz"
    assert parts[-1].usage.total_tokens == 6
    with pytest.raises(openai.NotFoundError):
        sdk.completions.create(model="gpt-4", prompt="x")
    with pytest.raises(openai.BadRequestError) as info:
        sdk.completions.create(model=MODEL, prompt="x", max_tokens=10_000)
    assert info.value.code == "context_length_exceeded"
