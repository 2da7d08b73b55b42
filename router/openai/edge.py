"""The tandem edge: one ASGI middleware in front of vLLM's own OpenAI app.

vLLM's serving code answers every OpenAI request as `vllm serve` does. What is tandem's own
happens here, in this order, before vLLM sees the request:

1. `/livez` (this process answers) and `/health` (every pool ready; one probe per
   `health_interval_s` whatever the call rate) are answered here; vLLM's engine-control and
   metrics routes are not served (NOT_SERVED).
2. Readiness: until every pool has answered once, a request waits for it, up to
   `ready_wait_s` and `max_ready_waiters` at a time (vLLM queues rather than refuses; a
   redeploy that replaces a tier's only replica stop-first leaves the new gateway without a
   ready pool for as long as an engine takes to load), then 503 `model_loading` with
   Retry-After. /health stays 503 meanwhile, so a load balancer sends nothing here.
3. Authentication, once: API key → tenant → tier and cache salt (router/auth.py) on every route
   but the open ones; the rate limits read the tenant found here.
4. The body: at most `max_body_bytes` (413), within `body_read_timeout_s` (408), valid UTF-8
   JSON nested at most 64 levels with bounded stop strings, tools and constraints (400 naming
   the field, router/openai/bounds.py); checked off the event loop when large. vLLM then reads
   the same bytes.
5. The request's context (tier, headers, cache salt) for the engine client, and the answer's
   status held back until its first body bytes: when tandem refuses the request before its
   first token (admission, rate limit, decode queue: a 429 with Retry-After), that refusal is
   the response, even for a stream.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from typing import Callable, Mapping, Optional

from starlette.datastructures import Headers, MutableHeaders
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cluster.metrics import Counter, Histogram
from router.openai.bounds import MAX_JSON_DEPTH, body_bound_error, param_of, too_deep
from router.openai.context import CURRENT, Caller, RequestContext
from router.openai.errors import REQUEST_ID_HEADER, OpenAIError, bad_request, malformed_json, payload_too_large
from router.openai.health import HealthCache

log = logging.getLogger(__name__)

# Routes anyone may call: probes, and the API's description.
OPEN_PATHS = frozenset({"/health", "/livez", "/ping", "/version", "/docs", "/docs/oauth2-redirect", "/redoc",
                        "/openapi.json"})
# vLLM's routes about its own engine, not the API: tandem's engines are the cluster's (metrics
# are Ray metrics on each node's metrics port; KV-event endpoints carry prompts' token ids).
NOT_SERVED = frozenset({"/metrics", "/scale_elastic_ep", "/is_scaling_elastic_ep", "/kv_event_sources",
                        "/v1/systemone"})
_OFF_LOOP_BYTES = 64 * 1024  # bodies beyond this are decoded and checked in a thread
_READY_POLL_S = 0.25  # a waiter's floor between readiness looks (the health cache bounds the probes)

READY_WAITS = Counter(
    "tandem_ready_waits", "Requests that arrived before every pool was ready, by how their wait ended: "
    "served (ready in time), timed_out or full (503 model_loading), off (ready_wait_s 0: 503 at once).", ["result"])
READY_WAIT_SECONDS = Histogram("tandem_ready_wait_seconds",
                               "How long a request waited for the pools to be ready (served or timed out).")


def request_timeout(timeout_s: float) -> OpenAIError:
    return OpenAIError(408, f"The request body was not received within {timeout_s:g} s.", "invalid_request_error",
                       None, "request_timeout", headers={"Connection": "close"})


def check_body(body: bytes) -> None:
    """400 for a body that is not bounded JSON (pure; may run in a thread)."""
    if not body.strip():
        return  # vLLM answers an empty body itself
    try:
        value = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError:
        raise malformed_json("the body is not valid UTF-8") from None
    except RecursionError:
        raise bad_request(f"The request body is nested deeper than {MAX_JSON_DEPTH} levels.",
                          code="nesting_too_deep") from None
    except ValueError:
        return  # vLLM answers malformed JSON itself, as its server does
    deep = too_deep(value)
    if deep is not None:
        param = param_of(deep)
        raise bad_request(f"The request body is nested deeper than {MAX_JSON_DEPTH} levels (in '{param}').",
                          param, "nesting_too_deep")
    broken = body_bound_error(value)
    if broken is not None:
        raise bad_request(broken[1], broken[0], "bound_exceeded")


class TandemEdge:
    def __init__(self, app: ASGIApp, *, authenticate: Callable[[Mapping[str, str]], Caller],
                 health: HealthCache, max_body_bytes: int, body_read_timeout_s: float,
                 ready_wait_s: float = 0.0, max_ready_waiters: int = 0) -> None:
        """`authenticate`: headers → the Caller (tier, tenant, cache salt), raising OpenAIError
        (401/403/400) to refuse; called once per request, and nothing checks the key again.
        `ready_wait_s`, `max_ready_waiters`: how long and how many requests wait for readiness
        (0: 503 at once)."""
        self.app = app
        self.authenticate = authenticate
        self.health = health
        self.max_body_bytes = max_body_bytes
        self.body_read_timeout_s = body_read_timeout_s
        self.ready_once = False
        self.ready_wait_s = ready_wait_s
        self.max_ready_waiters = max_ready_waiters
        self.ready_waiters = 0
        self._ready_poll_s = max(health.interval_s, _READY_POLL_S)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        given = headers.get(REQUEST_ID_HEADER)
        ok = given is not None and 0 < len(given) <= 200 and given.isprintable() and given.isascii()
        request_id = given if ok else f"req-{uuid.uuid4().hex}"
        send = _with_request_id(send, request_id)
        path = scope.get("path", "")
        try:
            if path == "/livez":
                await JSONResponse({"status": "alive"})(scope, receive, send)
                return
            if path == "/health":
                await self._health(scope, receive, send)
                return
            if path in NOT_SERVED or path.startswith("/metrics/"):
                raise OpenAIError(404, f"{path} is not served on the API port.", "invalid_request_error", None,
                                  "unknown_url")
            if path not in OPEN_PATHS:
                await self._check_ready()
            caller = self.authenticate(headers) if path not in OPEN_PATHS else None
            receive = await self._read_body(scope, receive, headers)
        except OpenAIError as exc:
            await exc.response(request_id)(scope, receive, send)
            return
        ctx = RequestContext(tier="", headers=headers) if caller is None else RequestContext(
            tier=caller.tier, headers=headers, tenant=caller.tenant, cache_salt=caller.cache_salt)
        token = CURRENT.set(ctx)
        guarded = _RefusalAware(send, ctx, scope, request_id)
        try:
            await self.app(scope, receive, guarded)
        except Exception as exc:
            refusal = ctx.refusal or (exc if isinstance(exc, OpenAIError) else None)
            if refusal is None or guarded.decided:
                raise
            await refusal.response(request_id)(scope, receive, send)
        finally:
            CURRENT.reset(token)

    async def _health(self, scope: Scope, receive: Receive, send: Send) -> None:
        info = await self.health.get()
        if info.pop("ready", False) is True:
            self.ready_once = True
            await JSONResponse({"status": "ready", **info})(scope, receive, send)
            return
        raise OpenAIError(503, "The model is not ready to serve requests.", "service_unavailable", None,
                          "not_ready", details=info)

    async def _check_ready(self) -> None:
        if self.ready_once or await self._ready_now():
            return
        if self.ready_wait_s <= 0 or self.ready_waiters >= self.max_ready_waiters:
            READY_WAITS.labels(result="off" if self.ready_wait_s <= 0 else "full").inc()
            raise _model_loading(0.0)
        # Bounded in time and in number: a waiter holds a connection, not yet its body.
        self.ready_waiters += 1
        started = time.monotonic()
        deadline = started + self.ready_wait_s
        try:
            while time.monotonic() < deadline:
                await asyncio.sleep(min(self._ready_poll_s, max(deadline - time.monotonic(), 0.0)))
                if await self._ready_now():
                    READY_WAITS.labels(result="served").inc()
                    return
        finally:
            self.ready_waiters -= 1
            READY_WAIT_SECONDS.observe(time.monotonic() - started)
        READY_WAITS.labels(result="timed_out").inc()
        raise _model_loading(self.ready_wait_s)

    async def _ready_now(self) -> bool:
        if not self.ready_once and (await self.health.get()).get("ready") is True:
            self.ready_once = True
        return self.ready_once

    async def _read_body(self, scope: Scope, receive: Receive, headers: Headers) -> Receive:
        """Read and check a POST body; a `receive` that replays it to vLLM."""
        if scope.get("method") != "POST":
            return receive
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            raise payload_too_large(self.max_body_bytes)
        try:
            async with asyncio.timeout(self.body_read_timeout_s):
                body, tail = await self._body(receive)
        except TimeoutError:
            raise request_timeout(self.body_read_timeout_s) from None
        if len(body) > _OFF_LOOP_BYTES:
            await asyncio.to_thread(check_body, bytes(body))
        else:
            check_body(bytes(body))
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return tail if tail is not None else await receive()

        return replay

    async def _body(self, receive: Receive) -> tuple[bytearray, Optional[Message]]:
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return body, message
            body += message.get("body", b"")
            if len(body) > self.max_body_bytes:
                raise payload_too_large(self.max_body_bytes)
            if not message.get("more_body", False):
                return body, None


def _model_loading(waited_s: float) -> OpenAIError:
    waited = f" (waited {waited_s:g} s)" if waited_s > 0 else ""
    return OpenAIError(503, f"The model is still loading{waited}; retry shortly (GET /health turns 200 when ready).",
                       "service_unavailable", None, "model_loading", headers={"Retry-After": "5"})


def _with_request_id(send: Send, request_id: str) -> Send:
    async def send_with_id(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = MutableHeaders(scope=message)
            if REQUEST_ID_HEADER not in headers:
                headers.append(REQUEST_ID_HEADER, request_id)
        await send(message)
    return send_with_id


class _RefusalAware:
    """Holds the response start until the first body bytes. If by then the engine client has
    recorded a refusal (router/openai/context.py), that is sent instead, and vLLM's own
    answer (its error chunk, or a 500) is dropped."""

    def __init__(self, send: Send, ctx: RequestContext, scope: Scope, request_id: str) -> None:
        self._send = send
        self._ctx = ctx
        self._scope = scope
        self._request_id = request_id
        self._start: Optional[Message] = None
        self.decided = False
        self._swallow = False

    async def __call__(self, message: Message) -> None:
        if self._swallow:
            return
        if message["type"] == "http.response.start" and not self.decided:
            self._start = message
            return
        if message["type"] == "http.response.body" and not self.decided:
            self.decided = True
            refusal = self._ctx.refusal
            if refusal is not None:
                self._swallow = True
                await refusal.response(self._request_id)(self._scope, _no_receive, self._send)
                return
            if self._start is not None:
                await self._send(self._start)
        await self._send(message)


async def _no_receive() -> Message:
    return {"type": "http.disconnect"}
