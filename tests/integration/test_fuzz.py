"""Schema-based fuzzing of the real gateway: schemathesis generates requests from the gateway's
own /openapi.json (vLLM's, as its serving code is the edge), valid ones (positive) and ones that
break the schema (negative: wrong types, missing fields, out-of-range numbers), for the two
generation routes, and sends them to the running cluster.

Every answer must be below 500, and every error must be OpenAI's shape
({"error": {"message", "type", "param", "code"}}). Unknown fields are accepted and ignored, as
vLLM's server does, so a negative case may be served.

Cost cap (said here because it changes what is generated): the cluster generates real tokens,
so every positive body gets `max_tokens` (and `max_completion_tokens`, `min_tokens`) of at most
2 after generation. Negative bodies break the schema, so the edge refuses them before any
engine work. The test's copy of the schema also pins `model` to the served model, or nearly
every valid body would stop at the 404 for an unknown model.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import httpx
import jsonschema
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from tests.support.integration_cluster import MODEL_NAME

ERROR_SCHEMA = {
    "type": "object", "required": ["error"],
    "properties": {"error": {"type": "object", "required": ["message", "type", "param", "code"],
                             "properties": {"message": {"type": "string", "minLength": 1},
                                            "type": {"type": "string", "minLength": 1}}}},
}
ROUTES = ("/v1/chat/completions", "/v1/completions")


CASES = 600
MAX_TOKENS = 2


def _served_model_only(doc: dict[str, Any]) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    doc["paths"] = {path: {"post": doc["paths"][path]["post"]} for path in ROUTES}
    for name in ("ChatCompletionRequest", "CompletionRequest"):
        doc["components"]["schemas"][name]["properties"]["model"] = {"type": "string", "enum": [MODEL_NAME]}
    return doc


def _capped(case: Any) -> Any:
    """A positive body generates at most MAX_TOKENS tokens (see the module docstring)."""
    body = case.body
    if case.meta.generation.mode is not GenerationMode.POSITIVE or not isinstance(body, dict):
        return case
    lengths = [body[f] for f in ("max_tokens", "max_completion_tokens") if isinstance(body.get(f), int)]
    cap = min([MAX_TOKENS, *lengths])
    for field in ("max_tokens", "max_completion_tokens"):
        if field in body and isinstance(body[field], int):
            body[field] = cap
    if not lengths:
        body["max_tokens"] = cap
    if isinstance(body.get("min_tokens"), int):
        body["min_tokens"] = min(body["min_tokens"], cap)
    return case


def _check_openai_error(response: Any) -> None:
    """`response`: schemathesis' Response (lowercase header names, a list of values each)."""
    assert "Traceback" not in response.text
    assert response.headers.get("content-type", [""])[0].startswith("application/json"), response.headers
    jsonschema.validate(response.json(), ERROR_SCHEMA)


def test_openapi_describes_the_public_routes(base_url):
    doc = httpx.get(f"{base_url}/openapi.json", timeout=30).json()
    assert {*ROUTES, "/v1/models", "/v1/responses", "/tokenize", "/detokenize", "/version"} <= set(doc["paths"])
    for name in ("ChatCompletionRequest", "CompletionRequest"):
        assert "model" in doc["components"]["schemas"][name]["properties"]
    # vLLM documents /metrics; the edge does not serve it on the API port (router/openai/edge.py).
    assert httpx.get(f"{base_url}/metrics", timeout=30).status_code == 404


def test_fuzz_the_gateway_from_its_openapi(base_url):
    doc = _served_model_only(httpx.get(f"{base_url}/openapi.json", timeout=30).json())
    schema = schemathesis.openapi.from_dict(doc)
    operations = [result.ok() for result in schema.get_all_operations()]
    strategies = [op.as_strategy(generation_mode=mode).map(_capped)
                  for op in operations for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)]
    session = requests.Session()
    seen: dict[tuple[str, str, int], int] = {}
    started = time.monotonic()

    @settings(max_examples=CASES, deadline=None, database=None, derandomize=True, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=st.one_of(*strategies))
    def run(case: Any) -> None:
        response = case.call(base_url=base_url, session=session, timeout=60)
        mode = case.meta.generation.mode.value if case.meta is not None else "?"
        key = (case.operation.label, mode, response.status_code)
        seen[key] = seen.get(key, 0) + 1
        case.validate_response(response, checks=[not_a_server_error])
        if response.status_code >= 400:
            _check_openai_error(response)

    run()
    elapsed = time.monotonic() - started
    total = sum(seen.values())
    print(f"\nfuzz: {total} cases in {elapsed:.0f} s")
    for key in sorted(seen):
        print("  ", *key, seen[key])
    assert total >= 500
    # Both kinds reached both generation routes and were refused where vLLM refuses them. (Most
    # schema-valid bodies are still refused by vLLM's own cross-field checks.)
    for label in ("POST /v1/chat/completions", "POST /v1/completions"):
        for mode in ("positive", "negative"):
            assert any(k[0] == label and k[1] == mode for k in seen), seen
        assert any(k[0] == label and k[2] == 400 for k in seen), seen
