"""/openapi.json describes what the edge really accepts: the request models of both generation
routes (strict: unknown fields are not allowed), and OpenAI's error shape for every error."""

from __future__ import annotations

import jsonschema

from router.openai.openapi import ERROR_SCHEMA
from router.openai.protocol import ChatCompletionRequest, CompletionRequest
from tests.unit.openai_helpers import MODEL, assert_openai_error, make_client


def test_openapi_has_the_request_bodies_and_error_shape():
    client, _ = make_client()
    doc = client.get("/openapi.json").json()
    schemas = doc["components"]["schemas"]
    for path, model in (("/v1/chat/completions", ChatCompletionRequest), ("/v1/completions", CompletionRequest)):
        op = doc["paths"][path]["post"]
        assert op["requestBody"]["required"] is True
        assert op["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(model.__name__)
        schema = schemas[model.__name__]
        assert schema["additionalProperties"] is False
        assert set(schema["properties"]) == {f.alias or name for name, f in model.model_fields.items()}
        for status in ("400", "401", "404", "413", "429"):
            assert op["responses"][status]["content"]["application/json"]["schema"]["$ref"].endswith("ErrorResponse")
    for operations in doc["paths"].values():
        for op in operations.values():
            assert "422" not in op["responses"]  # validation errors are 400s
    assert "HTTPValidationError" not in schemas
    prompt = schemas["CompletionRequest"]["properties"]["prompt"]
    assert {"type": "string", "minLength": 1} in prompt["anyOf"]


def test_error_bodies_match_the_documented_error_schema():
    client, _ = make_client(max_body_bytes=1024)
    for response in (client.post("/v1/completions", json={"model": MODEL}),
                     client.post("/v1/completions", json={"model": MODEL, "prompt": "x" * 2000}),
                     client.get("/v1/models/nope"), client.get("/nowhere")):
        assert_openai_error(response, response.status_code)
        jsonschema.validate(response.json(), ERROR_SCHEMA)


def test_a_valid_body_per_the_schema_is_served():
    client, _ = make_client()
    doc = client.get("/openapi.json").json()
    body = {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 2, "stream": False, "n": 1}
    schema = {**doc["components"]["schemas"]["CompletionRequest"], "components": doc["components"]}
    jsonschema.validate(body, schema)
    assert client.post("/v1/completions", json=body).status_code == 200
