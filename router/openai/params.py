"""Request parameters beyond plain sampling: structured output and tools.

The pydantic models here are the wire shapes (OpenAI's `response_format`, `tools`,
`tool_choice`, and vLLM's `structured_outputs` extension); `structured_output_of` turns a
validated request into the one `StructuredOutput` constraint the decode engine applies.
Everything is checked here, at the edge, so a bad schema or regex is a 400 naming the
parameter, not an engine error in the middle of a stream.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from cluster.protocol import StructuredOutput
from router.openai import bounds


class _Wire(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


def check_json_schema(schema: Any, limit: int = bounds.MAX_SCHEMA_BYTES) -> dict[str, Any]:
    """A JSON schema must be an object, within the edge's bounds (checked first: the
    metaschema check recurses once per level), and valid under its own metaschema."""
    if not isinstance(schema, dict):
        raise ValueError("the JSON schema must be an object")
    bounds.check_depth(schema, "the JSON schema")
    bounds.check_size(schema, limit, "the JSON schema")
    if bounds.has_nul(schema):
        raise ValueError("the JSON schema must not contain a NUL character")
    import jsonschema

    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ValueError(f"invalid JSON schema: {exc.message}") from None
    return schema


class JSONSchemaSpec(_Wire):
    name: str = Field(min_length=1, max_length=64)
    description: Optional[str] = None
    # `schema` shadows a BaseModel attribute, hence the alias.
    json_schema: Optional[dict[str, Any]] = Field(default=None, alias="schema")
    strict: Optional[bool] = None

    @field_validator("json_schema")
    @classmethod
    def _check(cls, value: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
        return None if value is None else check_json_schema(value)


class ResponseFormat(_Wire):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[JSONSchemaSpec] = None

    @model_validator(mode="after")
    def _check_schema(self) -> "ResponseFormat":
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("type 'json_schema' needs a 'json_schema' object with a 'name' and a 'schema'")
        if self.type != "json_schema" and self.json_schema is not None:
            raise ValueError(f"'json_schema' is only allowed with type 'json_schema', not {self.type!r}")
        return self


class StructuredOutputs(_Wire):
    """vLLM's extension: exactly one of json (a schema), regex, choice, grammar, json_object."""

    json_: Optional[Union[dict[str, Any], str]] = Field(default=None, alias="json")
    regex: Optional[str] = Field(default=None, min_length=1)
    choice: Optional[list[str]] = Field(default=None, min_length=1)
    grammar: Optional[str] = Field(default=None, min_length=1)
    json_object: Optional[bool] = None

    @model_validator(mode="after")
    def _exactly_one(self) -> "StructuredOutputs":
        given = [k for k in ("json_", "regex", "choice", "grammar", "json_object") if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise ValueError("give exactly one of json, regex, choice, grammar, json_object")
        if isinstance(self.json_, str):
            bounds.check_size(self.json_, bounds.MAX_SCHEMA_BYTES, "json")
            try:
                self.json_ = json.loads(self.json_)
            except (ValueError, RecursionError):
                raise ValueError("json must be a JSON schema (an object, or a string holding one)") from None
        if self.json_ is not None:
            check_json_schema(self.json_)
        if self.grammar is not None:
            bounds.check_text(self.grammar, bounds.MAX_GRAMMAR_CHARS, "grammar")
        if self.choice is not None:
            if len(self.choice) > bounds.MAX_CHOICES:
                raise ValueError(f"choice has {len(self.choice)} entries; the limit is {bounds.MAX_CHOICES}")
            bounds.check_size(self.choice, bounds.MAX_CHOICE_BYTES, "choice")
            if bounds.has_nul(self.choice):
                raise ValueError("choice must not contain a NUL character")
        if self.regex is not None:
            bounds.check_text(self.regex, bounds.MAX_REGEX_CHARS, "regex")
            try:
                re.compile(self.regex)
            except re.error as exc:
                raise ValueError(f"regex does not compile: {exc}") from None
        return self

    def constraint(self) -> StructuredOutput:
        if self.json_ is not None:
            return StructuredOutput("json", json.dumps(self.json_))
        if self.regex is not None:
            return StructuredOutput("regex", self.regex)
        if self.choice is not None:
            return StructuredOutput("choice", json.dumps(self.choice))
        if self.grammar is not None:
            return StructuredOutput("grammar", self.grammar)
        return StructuredOutput("json_object")


class FunctionDef(_Wire):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None
    strict: Optional[bool] = None

    @field_validator("parameters")
    @classmethod
    def _check(cls, value: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
        return None if value is None else check_json_schema(value)


class Tool(_Wire):
    type: Literal["function"]
    function: FunctionDef

    @model_validator(mode="after")
    def _check_size(self) -> "Tool":
        # The whole definition goes into the prompt and the tool parser's constraint.
        bounds.check_size(self.model_dump(exclude_none=True), bounds.MAX_TOOL_BYTES, "the tool's definition")
        return self


class NamedFunction(_Wire):
    name: str


class NamedToolChoice(_Wire):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Union[Literal["none", "auto", "required"], NamedToolChoice]


def structured_output_of(response_format: Optional[ResponseFormat],
                         structured: Optional[StructuredOutputs]) -> Optional[StructuredOutput]:
    """The request's one decoding constraint; two at once is ambiguous, so it is a 400."""
    from_format = None
    if response_format is not None and response_format.type == "json_object":
        from_format = StructuredOutput("json_object")
    elif response_format is not None and response_format.type == "json_schema":
        spec = response_format.json_schema
        schema = spec.json_schema if spec is not None and spec.json_schema is not None else {"type": "object"}
        from_format = StructuredOutput("json", json.dumps(schema))
    if from_format is not None and structured is not None:
        raise ValueError("'response_format' and 'structured_outputs' are both set; set one")
    return from_format or (structured.constraint() if structured is not None else None)
