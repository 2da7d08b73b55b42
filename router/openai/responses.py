"""Build OpenAI response bodies and SSE chunks from the cluster's internal `TokenChunk`s.

Pure functions of data, no I/O: the app decides when to send, this module decides what
the bytes look like, so the wire format is tested without a server.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from cluster.protocol import TokenChunk, TokenLogprob
from router.openai.errors import OpenAIError, internal_error, service_unavailable
from router.openai.logprobs import logprobs_body

DONE = b"data: [DONE]\n\n"


def sse(payload: dict[str, Any]) -> bytes:
    """One server-sent event; compact JSON keeps the per-token overhead small."""
    return b"data: " + json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def check_finish_reason(reason: Optional[str], request_id: str) -> None:
    """Engine outcomes that are not a normal end become errors, never a silent "success".

    A failed KV load (policy `fail`) ends with reason "error" and no tokens; an engine
    shutting down aborts with "abort". Either way the client did not get its answer.
    """
    if reason == "error":
        raise internal_error(request_id)
    if reason == "abort":
        raise service_unavailable("The request was aborted by the server; please retry.")


@dataclass
class Accumulator:
    """Collects a stream's deltas for the non-streaming answer and for usage numbers."""

    prompt_tokens: int
    text_parts: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    reported_output_tokens: int = 0
    finish_reason: Optional[str] = None
    logprobs: list[TokenLogprob] = field(default_factory=list)
    text_length: int = 0  # characters so far: the text_offset of the next completion logprob

    def add(self, chunk: TokenChunk) -> None:
        self.text_parts.append(chunk.text)
        self.text_length += len(chunk.text)
        self.token_ids.extend(chunk.token_ids)
        self.logprobs.extend(chunk.logprobs)
        self.reported_output_tokens = max(self.reported_output_tokens, chunk.num_output_tokens)
        if chunk.finish_reason is not None:
            self.finish_reason = chunk.finish_reason

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    @property
    def completion_tokens(self) -> int:
        """The engine's running total, or the ids we saw if a backend left it at 0."""
        return max(self.reported_output_tokens, len(self.token_ids))

    def usage(self) -> dict[str, int]:
        return usage(self.prompt_tokens, self.completion_tokens)


@dataclass(frozen=True)
class ResponseContext:
    """What every body of one request shares."""

    id: str
    created: int
    model: str
    chat: bool
    prompt_token_ids: Sequence[int]
    return_token_ids: bool = False
    include_usage: bool = False
    logprobs: bool = False  # the request asked for logprobs

    @property
    def object_name(self) -> str:
        return "chat.completion" if self.chat else "text_completion"

    @property
    def chunk_object_name(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}


@dataclass(frozen=True)
class ToolResult:
    """A chat answer parsed for tool calls (router/openai/tools.py)."""

    content: Optional[str]
    tool_calls: list[dict[str, Any]]
    finish_reason: Optional[str]


def full_response(ctx: ResponseContext, acc: Accumulator, tools: Optional[ToolResult] = None) -> dict[str, Any]:
    """The non-streaming body (`text_completion` or `chat.completion`)."""
    choice: dict[str, Any] = {"index": 0}
    if ctx.chat:
        choice["message"] = {"role": "assistant", "content": acc.text}
        if tools is not None:
            choice["message"] = {"role": "assistant", "content": tools.content, "tool_calls": tools.tool_calls}
    else:
        choice["text"] = acc.text
    choice["logprobs"] = logprobs_body(ctx.chat, acc.logprobs) if ctx.logprobs else None
    choice["finish_reason"] = tools.finish_reason if tools is not None else acc.finish_reason
    body = ctx._head(ctx.object_name)
    if ctx.return_token_ids:
        choice["token_ids"] = list(acc.token_ids)
        if not ctx.chat:  # vLLM also puts the prompt on a completion choice
            choice["prompt_token_ids"] = list(ctx.prompt_token_ids)
        body["prompt_token_ids"] = list(ctx.prompt_token_ids)
    body["choices"] = [choice]
    body["usage"] = acc.usage()
    return body


def stream_chunk(
    ctx: ResponseContext,
    text: str,
    token_ids: Sequence[int] = (),
    finish_reason: Optional[str] = None,
    first: bool = False,
    logprobs: Sequence[TokenLogprob] = (),
    text_offset: int = 0,
    tools: Optional[ToolResult] = None,
) -> dict[str, Any]:
    """One streamed delta. The first chat chunk announces the assistant role (as OpenAI).
    With `tools`, the delta is the whole parsed answer (tool streams are sent at the end)."""
    choice: dict[str, Any] = {"index": 0}
    if ctx.chat:
        delta: dict[str, Any] = {}
        if first:
            delta["role"] = "assistant"
        if text or first:
            delta["content"] = text
        if tools is not None:
            if tools.content:
                delta["content"] = tools.content
            if tools.tool_calls:
                delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(tools.tool_calls)]
        choice["delta"] = delta
    else:
        choice["text"] = text
    choice["logprobs"] = logprobs_body(ctx.chat, logprobs, text_offset) if ctx.logprobs and logprobs else None
    choice["finish_reason"] = finish_reason
    body = ctx._head(ctx.chunk_object_name)
    if ctx.return_token_ids:
        choice["token_ids"] = list(token_ids)
        if first:
            body["prompt_token_ids"] = list(ctx.prompt_token_ids)
            if not ctx.chat:
                choice["prompt_token_ids"] = list(ctx.prompt_token_ids)
    body["choices"] = [choice]
    if ctx.include_usage:
        body["usage"] = None  # OpenAI: null on every chunk but the last
    return body


def usage_chunk(ctx: ResponseContext, acc: Accumulator) -> dict[str, Any]:
    """The final `include_usage` chunk: no choices, just the totals."""
    body = ctx._head(ctx.chunk_object_name)
    body["choices"] = []
    body["usage"] = acc.usage()
    return body


def error_event(error: OpenAIError) -> bytes:
    """An error after the 200 headers went out can only be reported in-band."""
    return sse(error.body())
