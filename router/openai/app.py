"""The FastAPI application of the OpenAI edge: routes, body limits, validation order.

The order of checks is part of the contract: a malformed body is a 400 before anything
else, a wrong model a 404 before we spend time tokenizing, and an over-long request a
400 before any engine sees it. Only then does the request become an `EngineRequest`.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
import uuid
from typing import Any, Awaitable, Callable, Mapping, Optional, Sequence, Union

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.datastructures import Headers, MutableHeaders
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cluster.coalesce import coalesced
from cluster.protocol import EngineRequest, SamplingSettings, StructuredOutput
from router.openai.backend import OpenAIBackend
from router.openai.bounds import MAX_JSON_DEPTH, param_of, too_deep
from router.openai.errors import (
    REQUEST_ID_HEADER,
    OpenAIError,
    bad_request,
    context_length_exceeded,
    install_exception_handlers,
    malformed_json,
    not_found,
    payload_too_large,
    request_id_of,
    service_unavailable,
)
from router.openai.health import HealthCache
from router.openai.hosts import HostAllowList
from router.openai.openapi import body_of, generation_responses, health_responses, install_openapi, read_responses
from router.openai.protocol import ChatCompletionRequest, CompletionRequest, parse_request
from router.openai.sampling import sampling_extras
from router.openai.tools import ToolCalling, tool_result
from router.openai.responses import Accumulator, ResponseContext, check_finish_reason, full_response
from router.openai.streaming import (
    ClientGone,
    SSEResponse,
    StreamGuard,
    open_stream,
    race_disconnect,
    sse_events,
)

logger = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
DEFAULT_BODY_READ_TIMEOUT_S = 10.0
_CLIENT_CLOSED = 499  # nginx's "client closed request": nobody reads it, logs understand it


class RequestIdMiddleware:
    """Gives every request an id (the client's X-Request-Id, or a new one) and echoes it.

    A pure ASGI middleware, not BaseHTTPMiddleware, so streaming and disconnect detection
    pass through untouched.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = Headers(scope=scope).get(REQUEST_ID_HEADER)
        ok = given is not None and 0 < len(given) <= 200 and given.isprintable() and given.isascii()
        request_id = given if ok else f"req-{uuid.uuid4().hex}"
        scope.setdefault("state", {})["request_id"] = request_id

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                if REQUEST_ID_HEADER not in headers:
                    headers.append(REQUEST_ID_HEADER, request_id)
            await send(message)

        await self.app(scope, receive, send_with_id)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def request_timeout(timeout_s: float) -> OpenAIError:
    return OpenAIError(408, f"The request body was not received within {timeout_s:g} s.", "invalid_request_error",
                       None, "request_timeout", headers={"Connection": "close"})


async def read_json_body(request: Request, limit: int, timeout_s: float = DEFAULT_BODY_READ_TIMEOUT_S) -> Any:
    """Read at most `limit` bytes (413 beyond) within `timeout_s` (408 beyond: a slow sender
    must not hold a gateway slot) and decode strict UTF-8 JSON (400 otherwise)."""
    try:
        async with asyncio.timeout(timeout_s):
            body = await _read_body(request, limit)
    except TimeoutError:
        raise request_timeout(timeout_s) from None
    return _decode_json(body)


async def _read_body(request: Request, limit: int) -> bytearray:
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > limit:
                raise payload_too_large(limit)
        except ValueError:
            raise bad_request("Invalid Content-Length header.") from None
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > limit:
            raise payload_too_large(limit)
    return body


def _decode_json(body: bytearray) -> Any:
    if not body.strip():
        raise bad_request("The request body is empty; send a JSON object.")
    try:
        text = bytes(body).decode("utf-8")
    except UnicodeDecodeError:
        raise malformed_json("the body is not valid UTF-8") from None
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise bad_request(f"The request body is nested deeper than {MAX_JSON_DEPTH} levels.",
                          code="nesting_too_deep") from None
    except ValueError:
        raise malformed_json() from None
    # Bounded here, before pydantic and jsonschema, which recurse once per level.
    deep = too_deep(value)
    if deep is not None:
        param = param_of(deep)
        raise bad_request(f"The request body is nested deeper than {MAX_JSON_DEPTH} levels (in '{param}').",
                          param, "nesting_too_deep")
    return value


# The auth hook: request headers → the request's tier (None: the default tier). It raises an
# OpenAIError (401/403/400) to refuse; it runs first on /v1/* (router/auth.py is the real one).
Authenticate = Callable[[Mapping[str, str]], Optional[str]]
# The rate-limit hook: (request headers, the request's token cost: prompt + max_tokens) →
# awaitable None, or an OpenAIError 429 to refuse. It runs after validation, before any engine
# work (router/ratelimit.py and router/ratelimit_shared.py are the real ones).
RateLimit = Callable[[Mapping[str, str], int], Awaitable[None]]


def build_openai_app(
    backend: OpenAIBackend,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    body_read_timeout_s: float = DEFAULT_BODY_READ_TIMEOUT_S,
    health_interval_s: float = 1.0,
    authenticate: Optional[Authenticate] = None,
    rate_limit: Optional[RateLimit] = None,
    tool_calling: Optional[ToolCalling] = None,
    allowed_hosts: Optional[Sequence[str]] = None,
    cache_salt: Optional[Callable[[Mapping[str, str]], Optional[str]]] = None,
) -> FastAPI:
    """The OpenAI-compatible app for one backend. No globals: build as many as you like.
    `tool_calling` (the model's vLLM tool parser) serves `tools`; without it they get a 400.
    /health probes the backend at most once per `health_interval_s`. `allowed_hosts`: the
    Host header values answered (router/openai/hosts.py); None: no Host check. `cache_salt`:
    request headers → the request's prefix-cache salt (its tenant's; router/auth.py)."""
    tools = tool_calling or ToolCalling(None, None)
    app = FastAPI(title="tandem OpenAI edge", docs_url=None, redoc_url=None, openapi_url="/openapi.json")
    app.add_middleware(RequestIdMiddleware)
    if allowed_hosts is not None:
        app.add_middleware(HostAllowList, allowed=tuple(allowed_hosts))
    install_exception_handlers(app)
    install_openapi(app)
    created = int(time.time())
    health_cache = HealthCache(backend.health, health_interval_s)

    def model_card() -> dict[str, Any]:
        return {
            "id": backend.model_id,
            "object": "model",
            "created": created,
            "owned_by": "tandem",
            "max_model_len": backend.max_model_len,
        }

    def tier_of(request: Request) -> Optional[str]:
        return authenticate(request.headers) if authenticate is not None else None

    @app.get("/v1/models", responses=read_responses())
    async def list_models(request: Request) -> dict[str, Any]:
        tier_of(request)
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model:path}", responses=read_responses())
    async def get_model(model: str, request: Request) -> dict[str, Any]:
        tier_of(request)
        if model != backend.model_id:
            raise not_found(model)
        return model_card()

    @app.get("/livez")
    async def livez() -> dict[str, str]:
        """Liveness: this process answers HTTP. Touches no engine (readiness is /health)."""
        return {"status": "alive"}

    @app.get("/health", responses=health_responses())
    async def health() -> JSONResponse:
        info = await health_cache.get()
        if info.pop("ready", False) is True:
            return JSONResponse({"status": "ready", **info})
        raise service_unavailable("The model is not ready to serve requests.", details=info)

    @app.post("/v1/completions", openapi_extra=body_of(CompletionRequest), responses=generation_responses())
    async def completions(request: Request) -> Response:
        return await _serve(request, chat=False)

    @app.post("/v1/chat/completions", openapi_extra=body_of(ChatCompletionRequest),
              responses=generation_responses())
    async def chat_completions(request: Request) -> Response:
        return await _serve(request, chat=True)

    def tokenize(req: Union[CompletionRequest, ChatCompletionRequest]) -> list[int]:
        tokenizer = backend.tokenizer
        if isinstance(req, ChatCompletionRequest):
            offered = [t.model_dump(exclude_none=True) for t in req.tools or []] or None
            ids = tokenizer.chat([m.for_template() for m in req.messages], tools=offered)
        elif isinstance(req.prompt, str):
            ids = tokenizer.encode(req.prompt)
        else:
            ids = list(req.prompt)
            vocab: Optional[int] = getattr(tokenizer, "vocab_size", None)
            if isinstance(vocab, int) and any(i >= vocab for i in ids):
                raise bad_request(f"Token ids in 'prompt' must be below the vocabulary size {vocab}.", "prompt")
        if not ids:
            raise bad_request("The prompt is empty.", "messages" if isinstance(req, ChatCompletionRequest) else "prompt")
        return list(ids)

    def sampling_of(req: Union[CompletionRequest, ChatCompletionRequest], prompt_len: int,
                    structured: Optional[StructuredOutput]) -> SamplingSettings:
        chat = isinstance(req, ChatCompletionRequest)
        param = "messages" if chat else "prompt"
        limit = backend.max_model_len
        requested = req.requested_max_tokens()
        if requested is None:
            max_tokens = limit - prompt_len if chat else CompletionRequest.DEFAULT_MAX_TOKENS
            if max_tokens < 1:
                raise context_length_exceeded(limit, prompt_len, 1, param)
        else:
            max_tokens = requested
        if prompt_len + max_tokens > limit:
            raise context_length_exceeded(limit, prompt_len, max_tokens, param)
        min_tokens = req.min_tokens or 0
        if min_tokens > max_tokens:
            raise bad_request(f"'min_tokens' ({min_tokens}) must not exceed max_tokens ({max_tokens}).", "min_tokens")
        return SamplingSettings(
            max_tokens=max_tokens,
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            seed=req.seed,
            stop=req.stop_sequences,
            ignore_eos=bool(req.ignore_eos),
            min_tokens=min_tokens,
            **sampling_extras(req, structured, getattr(backend.tokenizer, "vocab_size", None)),
        )

    async def _serve(request: Request, chat: bool) -> Response:
        edge_id = request_id_of(request) or ""
        tier = tier_of(request)
        try:
            body = await read_json_body(request, max_body_bytes, body_read_timeout_s)
        except ClientDisconnect:
            return Response(status_code=_CLIENT_CLOSED)
        req = parse_request(ChatCompletionRequest if chat else CompletionRequest, body)
        if req.model != backend.model_id:
            raise not_found(req.model)
        tool_request = tools.prepare(req) if isinstance(req, ChatCompletionRequest) and req.calls_tools() else None
        prompt_ids = tokenize(req)
        sampling = sampling_of(req, len(prompt_ids), tool_request.structured if tool_request else req.structured_output())
        if rate_limit is not None:
            await rate_limit(request.headers, len(prompt_ids) + sampling.max_tokens)
        engine_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        salt = cache_salt(request.headers) if cache_salt is not None else None
        engine_request = EngineRequest(engine_id, tuple(prompt_ids), sampling, tier=tier, cache_salt=salt)
        logger.debug("request %s -> %s, %d prompt tokens", edge_id, engine_id, len(prompt_ids))
        ctx = ResponseContext(
            id=engine_id,
            created=int(time.time()),
            model=backend.model_id,
            chat=chat,
            prompt_token_ids=tuple(prompt_ids),
            return_token_ids=bool(req.return_token_ids),
            include_usage=req.include_usage,
            logprobs=req.num_logprobs() is not None,
        )
        parse_tools = None
        if tool_request is not None:
            parse_tools = functools.partial(tool_result, tools, tool_request)
        acc = Accumulator(prompt_tokens=len(prompt_ids))
        guard = StreamGuard(backend, engine_id)
        handed_off = False
        try:
            it = guard.it = await race_disconnect(request, lambda: open_stream(backend, engine_request))
            if req.stream:
                first = await race_disconnect(request, lambda: anext(it, None))
                if first is None:
                    raise RuntimeError(f"backend stream {engine_id} ended before its first chunk")
                guard.finished = first.finish_reason is not None
                check_finish_reason(first.finish_reason, edge_id)
                response = SSEResponse(
                    # Events that are ready go out in one write: one Ray item to Serve's proxy.
                    coalesced(sse_events(guard, first, ctx, acc, edge_id, parse_tools), b"".join),
                    guard,
                    media_type="text/event-stream",
                    headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
                )
                handed_off = True  # from here on the response owns the cleanup
                return response

            async def collect() -> None:
                async for chunk in it:
                    acc.add(chunk)
                    if chunk.finish_reason is not None:
                        break

            await race_disconnect(request, collect)
            guard.finished = acc.finish_reason is not None
            check_finish_reason(acc.finish_reason, edge_id)
            if not guard.finished:
                logger.error("stream %s ended without a finish reason", engine_id)
                raise RuntimeError("backend stream ended without a finish reason")
            return JSONResponse(full_response(ctx, acc, parse_tools(acc) if parse_tools else None))
        except ClientGone:
            return Response(status_code=_CLIENT_CLOSED)
        finally:
            if not handed_off:
                await guard.close()

    return app
