"""Bounds at the edge on everything a client controls (router/openai/bounds.py): each past-
the-bound input is a 400 naming the field, never a 500 or an engine error."""

from __future__ import annotations

import json
from typing import Any

import pytest

from router.openai import bounds
from tests.support.openai_helpers import MODEL, assert_openai_error, make_client

CHAT = [{"role": "user", "content": "hi"}]


def deep_schema(levels: int) -> dict[str, Any]:
    """A schema nested 2 * levels JSON levels deep (object → properties → object ...)."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


@pytest.fixture(scope="module")
def client():
    return make_client()[0]


def tool(parameters: dict[str, Any], name: str = "f") -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


# (route, body extras, the field the 400 names): the four places a client's schema goes.
DEEP_FIELDS = [
    ("/v1/completions", {"prompt": "hi", "structured_outputs": {"json": deep_schema(120)}}, "structured_outputs.json"),
    ("/v1/chat/completions", {"messages": CHAT, "structured_outputs": {"json": deep_schema(120)}},
     "structured_outputs.json"),
    ("/v1/chat/completions", {"messages": CHAT, "response_format": {
        "type": "json_schema", "json_schema": {"name": "a", "schema": deep_schema(120)}}}, "response_format.json_schema"),
    ("/v1/chat/completions", {"messages": CHAT, "tools": [tool(deep_schema(120))]}, "tools[0]"),
]


@pytest.mark.parametrize("route,extra,param", DEEP_FIELDS)
def test_deep_nesting_is_a_400_naming_the_field(client, route, extra, param) -> None:
    r = client.post(route, json={"model": MODEL, **extra})
    assert_openai_error(r, 400, param=param, code="nesting_too_deep", contains="64 levels")


def test_deep_nesting_inside_a_schema_given_as_a_string(client) -> None:
    body = {"model": MODEL, "prompt": "hi", "structured_outputs": {"json": json.dumps(deep_schema(200))}}
    assert_openai_error(client.post("/v1/completions", json=body), 400, param="structured_outputs.json",
                        contains="nested deeper than 64")


def test_nesting_beyond_the_json_decoders_stack_is_a_400(client) -> None:
    text = b'{"a":' * 100_000 + b"1" + b"}" * 100_000
    r = client.post("/v1/completions", content=text, headers={"content-type": "application/json"})
    assert_openai_error(r, 400, code="nesting_too_deep")


def test_a_schema_within_the_depth_bound_is_served(client) -> None:
    body = {"model": MODEL, "prompt": "hi", "structured_outputs": {"json": json.dumps(deep_schema(31))}}
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text


def test_too_deep_finds_the_path_iteratively() -> None:
    value: Any = 1
    for _ in range(10_000):  # far past Python's recursion limit
        value = [value]
    path = bounds.too_deep({"x": {"y": value}})
    assert path is not None and path[:2] == ("x", "y") and len(path) == bounds.MAX_JSON_DEPTH
    assert bounds.too_deep({"x": [[1]]}) is None
    assert bounds.param_of(("tools", 3, "function", "parameters")) == "tools[3]"


@pytest.mark.parametrize("structured", [
    {"regex": "a\x00b"},
    {"grammar": "root ::= \"a\x00\""},
    {"choice": ["yes", "n\x00o"]},
    {"json": {"type": "string", "pattern": "a\x00"}},
])
def test_a_nul_in_a_constraint_is_a_400(client, structured) -> None:
    body = {"model": MODEL, "prompt": "hi", "structured_outputs": structured}
    assert_openai_error(client.post("/v1/completions", json=body), 400, param="structured_outputs", contains="NUL")


@pytest.mark.parametrize("structured,param,contains", [
    ({"regex": "a" * (bounds.MAX_REGEX_CHARS + 1)}, "regex", "at most 16384 characters"),
    ({"grammar": "x" * (bounds.MAX_GRAMMAR_CHARS + 1)}, "grammar", "at most 65536 characters"),
    ({"choice": [str(i) for i in range(bounds.MAX_CHOICES + 1)]}, "choice", "At most 1024 choices"),
    ({"choice": ["x" * bounds.MAX_CHOICE_BYTES]}, "choice", "the limit is 65536"),
    ({"json": {"type": "string", "description": "x" * bounds.MAX_SCHEMA_BYTES}}, "json", "the limit is 65536"),
    ({"json": json.dumps({"type": "string", "description": "x" * bounds.MAX_SCHEMA_BYTES})}, "json",
     "the limit is 65536"),
])
def test_oversized_constraints_are_a_400(client, structured, param, contains) -> None:
    body = {"model": MODEL, "prompt": "hi", "structured_outputs": structured}
    assert_openai_error(client.post("/v1/completions", json=body), 400, param=f"structured_outputs.{param}",
                        contains=contains)


def test_stop_strings_are_bounded_in_count_and_length(client) -> None:
    base = {"model": MODEL, "prompt": "hi"}
    too_long = "x" * (bounds.MAX_STOP_CHARS + 1)
    assert_openai_error(client.post("/v1/completions", json={**base, "stop": too_long}), 400, param="stop",
                        contains=f"at most {bounds.MAX_STOP_CHARS} characters")
    assert_openai_error(client.post("/v1/completions", json={**base, "stop": ["a", too_long]}), 400, param="stop")
    # More than 4 stop sequences: vLLM's own 400 (its request model allows 4, as OpenAI).
    assert client.post("/v1/completions", json={**base, "stop": ["a", "b", "c", "d", "e"]}).status_code == 400
    ok = client.post("/v1/completions", json={**base, "stop": ["x" * bounds.MAX_STOP_CHARS]})
    assert ok.status_code == 200, ok.text
    ids = list(range(bounds.MAX_STOP_TOKEN_IDS + 1))
    assert_openai_error(client.post("/v1/completions", json={**base, "stop_token_ids": ids}), 400,
                        param="stop_token_ids")


def test_tools_are_bounded_in_number_and_size(client) -> None:
    many = [tool({"type": "object"}, name=f"f{i}") for i in range(bounds.MAX_TOOLS + 1)]
    assert_openai_error(client.post("/v1/chat/completions", json={"model": MODEL, "messages": CHAT, "tools": many}),
                        400, param="tools")
    big = {"type": "function", "function": {"name": "f", "description": "d" * bounds.MAX_TOOL_BYTES}}
    assert_openai_error(client.post("/v1/chat/completions", json={"model": MODEL, "messages": CHAT, "tools": [big]}),
                        400, param="tools[0]", contains="the limit is 65536")


def test_logprobs_are_bounded_by_vllms_max_logprobs(client) -> None:
    assert_openai_error(client.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "logprobs": 21}),
                        400, param="logprobs")
    chat = {"model": MODEL, "messages": CHAT, "logprobs": True, "top_logprobs": 21}
    assert_openai_error(client.post("/v1/chat/completions", json=chat), 400, contains="max allowed: 20")


# Fields vLLM reads before its type check: a wrong JSON type raised inside vLLM (a 500) until
# the edge checked it (found by tests/integration/test_fuzz.py: `"structured_outputs": false`).
WRONG_TYPES = [
    ("/v1/completions", {"prompt": "hi", "structured_outputs": False}, "structured_outputs"),
    ("/v1/completions", {"prompt": "hi", "structured_outputs": "regex"}, "structured_outputs"),
    ("/v1/chat/completions", {"messages": CHAT, "structured_outputs": [1]}, "structured_outputs"),
    ("/v1/chat/completions", {"messages": 1}, "messages"),
    ("/v1/chat/completions", {"messages": True}, "messages"),
    ("/v1/responses", {"input": "hi", "tools": 1}, "tools"),
]


@pytest.mark.parametrize("route,extra,param", WRONG_TYPES)
def test_a_field_of_the_wrong_json_type_is_a_400_naming_it(client, route, extra, param) -> None:
    r = client.post(route, json={"model": MODEL, **extra})
    assert_openai_error(r, 400, param=param, contains="must be")
