"""Every way a request can be wrong gets a 400/404/405/413 in OpenAI's shape, naming the cause."""

from __future__ import annotations

from typing import Any

import pytest

from tests.fakes import FakeBackend, FakeTokenizer
from tests.unit.openai_helpers import MODEL, assert_openai_error, make_client

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MSGS = [{"role": "user", "content": "hi"}]


@pytest.fixture()
def client():
    return make_client()[0]


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": MSGS, **extra}


def completion(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "hi", **extra}


@pytest.mark.parametrize(
    "raw, contains",
    [
        (b'{"model": "tandem-test", "prompt": ', "could not parse the JSON"),
        (b'{"model": "tandem-test", "prompt": "\xff\xfe"}', "UTF-8"),
        (b'{"model": "tandem-test", "prompt": "x", "temperature": NaN}', "could not parse the JSON"),
        (b"", "empty"),
        (b'["not", "an", "object"]', "JSON object"),
    ],
)
def test_bodies_that_are_not_json_objects(client, raw: bytes, contains: str) -> None:
    r = client.post(COMPLETIONS, content=raw, headers={"content-type": "application/json"})
    assert_openai_error(r, 400, type_="invalid_request_error", contains=contains)


@pytest.mark.parametrize(
    "path, body, param",
    [
        (COMPLETIONS, {"prompt": "hi"}, "model"),
        (COMPLETIONS, {"model": MODEL}, "prompt"),
        (CHAT, {"model": MODEL}, "messages"),
        (CHAT, chat(messages=[]), "messages"),
        (CHAT, chat(messages=[{"role": "user"}]), "messages[0].content"),
    ],
)
def test_missing_fields_are_named(client, path: str, body: dict[str, Any], param: str) -> None:
    assert_openai_error(client.post(path, json=body), 400, param=param)


@pytest.mark.parametrize(
    "path, body, param",
    [
        (COMPLETIONS, completion(max_tokens="10"), "max_tokens"),
        (COMPLETIONS, completion(max_tokens=1.5), "max_tokens"),
        (COMPLETIONS, completion(max_tokens=0), "max_tokens"),
        (COMPLETIONS, completion(max_tokens=-3), "max_tokens"),
        (COMPLETIONS, completion(temperature="hot"), "temperature"),
        (COMPLETIONS, completion(temperature=2.5), "temperature"),
        (COMPLETIONS, completion(top_p=0), "top_p"),
        (COMPLETIONS, completion(stream="yes"), "stream"),
        (COMPLETIONS, completion(seed="1"), "seed"),
        (COMPLETIONS, completion(seed=2**64), "seed"),  # the engine's generator is 64-bit
        (COMPLETIONS, completion(top_k=2**31), "top_k"),
        (COMPLETIONS, completion(model=3), "model"),
        (COMPLETIONS, completion(stop=["a", "b", "c", "d", "e"]), "stop"),
        (COMPLETIONS, completion(stop=[""]), "stop"),
        (COMPLETIONS, completion(min_tokens=-1), "min_tokens"),
        (COMPLETIONS, completion(min_tokens=20, max_tokens=5), "min_tokens"),
        (COMPLETIONS, completion(prompt=["one", "two"]), "prompt"),
        (COMPLETIONS, completion(prompt=[[1, 2], [3]]), "prompt"),
        (COMPLETIONS, completion(prompt=[]), "prompt"),
        (COMPLETIONS, completion(prompt=[1, -2]), "prompt"),
        (COMPLETIONS, completion(prompt=[1, 999]), "prompt"),
        (COMPLETIONS, completion(prompt=""), "prompt"),
        (COMPLETIONS, completion(prompt={"text": "hi"}), "prompt"),
        (COMPLETIONS, completion(stream_options={"include_usage": True}), "stream_options"),
        (COMPLETIONS, completion(stream=True, stream_options={"include_usage": "yes"}), "stream_options.include_usage"),
        (CHAT, chat(messages=[{"role": "wizard", "content": "x"}]), "messages[0].role"),
        (CHAT, chat(messages=[{"role": "user", "content": 5}]), "messages[0].content"),
        (CHAT, chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
         "messages[0].content"),
        (CHAT, chat(messages="hi"), "messages"),
        (CHAT, chat(max_tokens=3, max_completion_tokens=4), "max_completion_tokens"),
        (CHAT, chat(max_completion_tokens=0), "max_completion_tokens"),
    ],
)
def test_bad_values_are_400_naming_the_field(client, path: str, body: dict[str, Any], param: str) -> None:
    error = assert_openai_error(client.post(path, json=body), 400, param=param, type_="invalid_request_error")
    assert param.split("[")[0].split(".")[0] in error["message"] or param in error["message"]


@pytest.mark.parametrize("n", [2, 0, 5])
def test_only_n_equal_one_is_served(client, n: int) -> None:
    assert_openai_error(client.post(COMPLETIONS, json=completion(n=n)), 400, param="n", contains="n=1")
    assert client.post(COMPLETIONS, json=completion(n=1)).status_code == 200


@pytest.mark.parametrize(
    "path, param, value",
    [
        (COMPLETIONS, "echo", True),
        (COMPLETIONS, "best_of", 3),
        (COMPLETIONS, "suffix", "tail"),
        (COMPLETIONS, "logit_bias", {"50256": -100}),
        (CHAT, "logit_bias", {"5": 1}),
        (CHAT, "functions", [{"name": "f"}]),
        (CHAT, "function_call", {"name": "f"}),
    ],
)
def test_unsupported_parameters_are_named(client, path: str, param: str, value: Any) -> None:
    body = (chat if path == CHAT else completion)(**{param: value})
    assert_openai_error(client.post(path, json=body), 400, param=param, code="unsupported_parameter", contains=param)


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


@pytest.mark.parametrize(
    "path, body, param, contains",
    [
        (COMPLETIONS, completion(logprobs=21), "logprobs", "20"),
        (COMPLETIONS, completion(presence_penalty=2.5), "presence_penalty", "2"),
        (COMPLETIONS, completion(frequency_penalty=True), "frequency_penalty", "frequency_penalty"),
        (COMPLETIONS, completion(stop_token_ids=[1, 999]), "stop_token_ids", "vocabulary"),
        (COMPLETIONS, completion(structured_outputs={"regex": "a", "choice": ["b"]}), "structured_outputs", "exactly one"),
        (COMPLETIONS, completion(structured_outputs={"regex": "(unclosed"}), "structured_outputs", "regex"),
        (COMPLETIONS, completion(structured_outputs={"json": {"type": 5}}), "structured_outputs", "schema"),
        (CHAT, chat(top_logprobs=2), "top_logprobs", "logprobs"),
        (CHAT, chat(logprobs=True, top_logprobs=21), "top_logprobs", "20"),
        (CHAT, chat(response_format={"type": "json_schema"}), "response_format", "json_schema"),
        (CHAT, chat(response_format={"type": "xml"}), "response_format.type", "type"),
        (CHAT, chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}),
         "response_format.json_schema.schema", "schema"),
        (CHAT, chat(response_format={"type": "json_object"}, structured_outputs={"regex": "a"}), "response_format",
         "both"),
        (CHAT, chat(tool_choice="required"), "tool_choice", "tools"),
        (CHAT, chat(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "g"}}), "tool_choice", "'g'"),
        (CHAT, chat(tools=[{"type": "function", "function": {"name": "bad name"}}]), "tools[0].function.name", "name"),
        (CHAT, chat(tools=[TOOL], tool_choice="required", response_format={"type": "json_object"}), "tool_choice",
         "response_format"),
        (CHAT, chat(messages=[{"role": "tool", "content": "42"}]), "messages[0]", "tool_call_id"),
    ],
)
def test_bad_values_of_supported_parameters_are_named(client, path: str, body: dict[str, Any], param: str,
                                                       contains: str) -> None:
    assert_openai_error(client.post(path, json=body), 400, param=param, contains=contains)


def test_tools_without_a_configured_parser_are_400(client) -> None:
    for choice in ("auto", "required", {"type": "function", "function": {"name": "f"}}):
        body = chat(tools=[TOOL], tool_choice=choice)
        assert_openai_error(client.post(CHAT, json=body), 400, param="tools", code="tool_parser_missing",
                            contains="model.tool_parser")
    assert client.post(CHAT, json=chat(tools=[TOOL], tool_choice="none")).status_code == 200


@pytest.mark.parametrize(
    "path, extra",
    [
        (COMPLETIONS, {"logprobs": None, "echo": False, "best_of": 1, "presence_penalty": 0, "frequency_penalty": 0.0,
                       "logit_bias": {}, "suffix": None, "n": 1, "user": "someone", "stream_options": None}),
        (CHAT, {"logprobs": False, "top_logprobs": None, "tools": [], "tool_choice": "none", "presence_penalty": 0.0,
                "response_format": {"type": "text"}, "parallel_tool_calls": True, "max_tokens": 2,
                "max_completion_tokens": 2, "temperature": None, "seed": None, "stop": None}),
    ],
)
def test_default_values_of_unsupported_parameters_are_fine(client, path: str, extra: dict[str, Any]) -> None:
    body = (chat if path == CHAT else completion)(**extra)
    r = client.post(path, json=body)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("path, body", [(COMPLETIONS, completion(foo=1)), (CHAT, chat(max_completion_tokenz=3)),
                                        (COMPLETIONS, completion(max_completion_tokens=3))])
def test_unknown_fields_are_unrecognized_arguments(client, path: str, body: dict[str, Any]) -> None:
    unknown = next(k for k in body if k not in ("model", "prompt", "messages"))
    assert_openai_error(client.post(path, json=body), 400, param=unknown,
                        contains=f"Unrecognized request argument supplied: {unknown}")


def test_unknown_field_inside_a_message_is_named(client) -> None:
    body = chat(messages=[{"role": "user", "content": "x", "mood": "happy"}])
    assert_openai_error(client.post(CHAT, json=body), 400, param="messages[0].mood", contains="Unrecognized")


def test_unknown_model_is_404_before_tokenizing() -> None:
    tokenizer = FakeTokenizer()
    tokenizer.encode = lambda text: pytest.fail("tokenized a request for an unknown model")  # type: ignore[method-assign]
    client, backend = make_client(FakeBackend(model_id=MODEL, tokenizer=tokenizer))
    error = assert_openai_error(client.post(COMPLETIONS, json=completion(model="gpt-4")), 404,
                                param="model", code="model_not_found")
    assert "gpt-4" in error["message"]
    assert backend.requests == []


def test_over_the_context_is_400_with_the_numbers() -> None:
    client, backend = make_client(FakeBackend(model_id=MODEL, max_model_len=64))
    r = client.post(COMPLETIONS, json=completion(prompt="x" * 50, max_tokens=20))
    error = assert_openai_error(r, 400, code="context_length_exceeded", param="prompt")
    for number in ("64", "70", "50", "20"):
        assert number in error["message"], error["message"]
    assert client.post(COMPLETIONS, json=completion(prompt="x" * 50, max_tokens=14)).status_code == 200
    assert client.post(COMPLETIONS, json=completion(prompt="x" * 60)).status_code == 400  # default 16 does not fit
    long_chat = chat(messages=[{"role": "user", "content": "y" * 60}])  # 60 + template > 64
    error = assert_openai_error(client.post(CHAT, json=long_chat), 400, code="context_length_exceeded", param="messages")
    assert "64" in error["message"]
    assert len(backend.requests) == 1


def test_chat_without_a_template_is_400(client) -> None:
    client, _ = make_client(FakeBackend(model_id=MODEL, tokenizer=FakeTokenizer(chat_template=False)))
    assert_openai_error(client.post(CHAT, json=chat()), 400, param="messages", code="chat_template_missing")
    assert client.post(COMPLETIONS, json=completion()).status_code == 200


def test_body_over_the_limit_is_413() -> None:
    client, backend = make_client(max_body_bytes=1024)
    big = completion(prompt="x" * 2000)
    assert_openai_error(client.post(COMPLETIONS, json=big), 413, contains="1024")

    def chunked():  # no Content-Length: the limit must hold while streaming the body in
        yield b'{"model": "tandem-test", "prompt": "'
        for _ in range(10):
            yield b"x" * 200
        yield b'"}'

    assert_openai_error(client.post(COMPLETIONS, content=chunked()), 413)
    assert backend.requests == []
    assert client.post(COMPLETIONS, json=completion(prompt="x" * 200)).status_code == 200


def test_unknown_routes_and_methods_use_the_error_shape(client) -> None:
    assert_openai_error(client.get("/v1/nothing"), 404, contains="/v1/nothing")
    assert_openai_error(client.post("/v1/embeddings", json={}), 404)
    r = client.get(COMPLETIONS)
    assert_openai_error(r, 405)
    assert "POST" in r.headers.get("allow", "")
