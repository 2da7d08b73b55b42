"""The gateway's spans (`observability.tracing`; the process's tracer: cluster/tracing.py).

Built only when tracing is on (router/gateway.py), each a thin layer around what exists:

- `TracingEdge`: ASGI middleware outermost in front of the edge (router/openai/edge.py). Per API
  request (paths under /v1/; probes are not traced) one server span: the caller's W3C
  `traceparent` is honoured (its sampled flag decides), else a new trace starts. The span is
  the current one while the request runs, and the response carries its trace id in
  `X-Trace-Id` (when sampled). Attributes: method, route, status code.
- `TracedBackend`: the outermost Backend (router/backend.py): the request's tier, prompt and
  output token counts, first token (an event), finish reason, on the request span.
- `admission` (router/admission.py): a child span for the wait for a place; a 429 ends it failed.
- `annotate_route` (router/routing/service.py): the route decision's path and reason.
- `annotate_migration` (router/pd/path.py): a stream that broke after tokens were sent, continued
  or refused (router/pd/migration.py), as an event on the request span.
- `TracedHops` (around router/pd/hops.py's Hops): a client span per prefill, decode and whole
  hop; the hop's `traceparent` goes to the replica in `EngineRequest.traceparent`, where the
  replica's own span joins the trace (prefill_workers/, decode_workers/).

Never in a span: prompt or completion text, token ids, API keys, tenants, cache salts.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, AsyncIterator, Optional

from cluster.protocol import EngineRequest, finish_reason, new_token_ids
from cluster.tracing import TRACE_ID_HEADER, Tracing, end_span

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from router.routing.types import Pick, RouteDecision

# Routes named as such in span names; any other /v1/ path is "other" (a span name is a label).
ROUTES = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/models", "/v1/embeddings"})


class TracingEdge:
    """One server span per API request (module docstring)."""

    def __init__(self, app: "ASGIApp", tracing: Tracing) -> None:
        self.app = app
        self.tracing = tracing

    async def __call__(self, scope: "Scope", receive: "Receive", send: "Send") -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if not path.startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        from opentelemetry import context, trace

        carrier = {}
        for key, value in scope.get("headers", ()):
            if key in (b"traceparent", b"tracestate"):
                carrier[key.decode("latin-1")] = value.decode("latin-1")
        parent = self.tracing.extract(carrier) if carrier else None
        method = scope.get("method", "")
        route = path if path in ROUTES else "other"
        span = self.tracing.start(f"{method} {route}", parent=parent, kind="server",
                                  attributes={"http.request.method": method, "http.route": route})
        trace_id = self.tracing.trace_id(span) if span.is_recording() else None
        status: list[int] = []

        async def traced_send(message: "Message") -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
                if trace_id is not None:
                    message = {**message, "headers": [*message.get("headers", ()),
                                                      (TRACE_ID_HEADER.lower().encode(), trace_id.encode())]}
            await send(message)

        token = context.attach(trace.set_span_in_context(span))
        error: Optional[BaseException] = None
        try:
            await self.app(scope, receive, traced_send)
        except BaseException as exc:
            error = exc
            raise
        finally:
            context.detach(token)
            code = status[0] if status else None
            if code is not None:
                span.set_attribute("http.response.status_code", code)
                if code >= 500:
                    from opentelemetry.trace import Status, StatusCode

                    span.set_status(Status(StatusCode.ERROR, f"HTTP {code}"))
            end_span(span, error)


class TracedBackend:
    """The outermost Backend when tracing is on: what the request span says about the answer."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend

    async def generate(self, request: EngineRequest) -> AsyncIterator[Any]:
        from opentelemetry import trace

        span = trace.get_current_span()
        if not span.is_recording():
            async for output in self.backend.generate(request):
                yield output
            return
        span.set_attributes({"tandem.tier": request.tier, "gen_ai.usage.input_tokens": len(request.prompt_token_ids),
                             "gen_ai.request.max_tokens": request.sampling.max_tokens or 0})
        tokens, finish = 0, None
        try:
            async for output in self.backend.generate(request):
                added = len(new_token_ids(output))
                if added and not tokens:
                    span.add_event("first_token")
                tokens += added
                finish = finish_reason(output) or finish
                yield output
        finally:
            span.set_attribute("gen_ai.usage.output_tokens", tokens)
            if finish is not None:
                span.set_attribute("gen_ai.response.finish_reasons", [finish])

    async def abort(self, request_id: str) -> None:
        await self.backend.abort(request_id)

    async def health(self) -> dict[str, Any]:
        return await self.backend.health()


def annotate_route(decision: "RouteDecision") -> None:
    """The KVRouter's decision on the request span (when it is sampled)."""
    from opentelemetry import trace

    span = trace.get_current_span()
    if span.is_recording():
        span.set_attributes({"tandem.route.path": decision.path, "tandem.route.reason": decision.reason,
                             "tandem.route.predicted_hit_tokens": decision.predicted_hit_tokens})


def annotate_migration(result: str, reason: str, tokens_sent: int, attempt: int) -> None:
    """A broken stream's outcome (continued, with what broke it; or refused, with the rule) on
    the request span (when it is sampled)."""
    from opentelemetry import trace

    span = trace.get_current_span()
    if span.is_recording():
        span.add_event("tandem.migration", {"tandem.migration.result": result, "tandem.migration.reason": reason,
                                            "tandem.migration.tokens_sent": tokens_sent,
                                            "tandem.migration.attempt": attempt})


def _worker(pick: "Optional[Pick]") -> Optional[str]:
    return None if pick is None else pick.worker.worker_id


def with_traceparent(request: EngineRequest, span: Any) -> EngineRequest:
    traceparent = Tracing.traceparent(span)
    return request if traceparent is None else dataclasses.replace(request, traceparent=traceparent)


class TracedHops:
    """Hops (router/pd/hops.py) with a client span around each prefill, decode and whole hop;
    every other attribute is the Hops' own."""

    def __init__(self, hops: Any, tracing: Tracing) -> None:
        self._hops = hops
        self._tracing = tracing

    def __getattr__(self, name: str) -> Any:
        return getattr(self._hops, name)

    async def prefill(self, request: EngineRequest, pick: "Optional[Pick]", first_token: bool) -> Any:
        span = self._tracing.child("tandem.prefill_hop", **_hop_attributes(request, pick))
        if span is None:
            return await self._hops.prefill(request, pick, first_token)
        span.set_attribute("tandem.first_token_asked", first_token)
        try:
            answer = await self._hops.prefill(with_traceparent(request, span), pick, first_token)
        except BaseException as exc:
            end_span(span, exc)
            raise
        end_span(span, **{"tandem.prefill.failed": answer.failed, "tandem.handoff": answer.handoff is not None,
                          "tandem.first_token_reused": answer.first is not None})
        return answer

    async def decode(self, request: EngineRequest, handoff: Any, pick: "Optional[Pick]", *,
                     route: str) -> AsyncIterator[Any]:
        span = self._tracing.child("tandem.decode_hop", **_hop_attributes(request, pick), **{
            "tandem.route": route, "tandem.handoff": handoff is not None})
        stream = self._hops.decode(request if span is None else with_traceparent(request, span), handoff, pick,
                                   route=route)
        async for output in _counted(stream, span):
            yield output

    async def whole(self, request: EngineRequest, pick: "Optional[Pick]") -> AsyncIterator[Any]:
        span = self._tracing.child("tandem.whole_hop", **_hop_attributes(request, pick))
        stream = self._hops.whole(request if span is None else with_traceparent(request, span), pick)
        async for output in _counted(stream, span):
            yield output


def _hop_attributes(request: EngineRequest, pick: "Optional[Pick]") -> dict[str, Any]:
    attributes: dict[str, Any] = {"tandem.tier": request.tier}
    worker = _worker(pick)
    if worker is not None:
        attributes["tandem.worker"] = worker
    return attributes


async def _counted(stream: Any, span: Any) -> AsyncIterator[Any]:
    """`stream`'s outputs; on `span` (None: untraced) the first token (an event), the tokens
    streamed and the finish reason. The stream is closed when this generator is."""
    tokens, finish, error = 0, None, None
    try:
        async for output in stream:
            if span is not None:
                added = len(new_token_ids(output))
                if added and not tokens:
                    span.add_event("first_token")
                tokens += added
                finish = finish_reason(output) or finish
            yield output
    except BaseException as exc:
        error = exc
        raise
    finally:
        await stream.aclose()
        if span is not None:
            # A generator closed by its consumer (GeneratorExit) is a client that left, not a failure.
            end_span(span, None if isinstance(error, GeneratorExit) else error,
                     **{"tandem.tokens_streamed": tokens, "tandem.finish_reason": finish})


def instrument_gateway(tracing: Optional[Tracing], *, backend: Any, router: Any, admission: Any, outer: Any) -> Any:
    """Trace a gateway's request path (router/gateway.py): the P/D path's hops, the route
    decision, the admission wait; returns the Backend the engine client drives (`outer`, or it
    wrapped). Tracing off (None): nothing is touched."""
    if tracing is None:
        return outer
    backend.hops = TracedHops(backend.hops, tracing)
    if router is not None:
        router.traced = True
    admission.tracing = tracing
    return TracedBackend(outer)
