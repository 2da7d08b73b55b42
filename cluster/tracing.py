"""OpenTelemetry tracing for one tandem process (`observability.tracing`, docs/operations.md
"Tracing").

`Tracing.from_config(cfg, role)` builds the process's own TracerProvider (its service name, a
ParentBased ratio sampler, a batching exporter) and returns None when tracing is off: callers
keep `Optional[Tracing]` and test it for None, so with tracing off the request path makes no
OpenTelemetry call at all. The provider is not installed as OpenTelemetry's global one: each
part that traces is handed this object, and vLLM's engine tracing (its own provider) is left alone.

Across processes the context travels as a W3C `traceparent` string: in the HTTP header from a
client, and in `EngineRequest.traceparent` from the gateway to an engine replica. It is set only
for a sampled hop, so a replica makes spans only for requests the gateway traces.

What goes into a span is counts, ids, names of paths and reasons, status codes and times; never
prompt or completion text, token ids, API keys, tenant names or cache salts
(tests/unit/test_tracing_edge.py exports every span and greps it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Iterator, Mapping, Optional

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span

    from cluster.config import TracingConfig

ROLES = ("gateway", "prefill", "decode")
TRACE_ID_HEADER = "X-Trace-Id"


def otlp_exporter(cfg: "TracingConfig") -> "SpanExporter":
    if cfg.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        return GrpcExporter(endpoint=cfg.endpoint, insecure=cfg.insecure)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    return HttpExporter(endpoint=cfg.endpoint)


class JsonLinesExporter:
    """Spans as JSON lines in one file per process (`exporter: file`): a trace without a collector,
    and what the serve tests read back. OpenTelemetry's own span JSON, one span per line."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.Lock()

    def export(self, spans: Any) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        lines = "".join(span.to_json(indent=None) + "\n" for span in spans)
        with self._lock, self.path.open("a", encoding="utf-8") as out:
            out.write(lines)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class Tracing:
    """One process's tracer, and the few operations tandem's code needs."""

    def __init__(self, provider: Any, service: str) -> None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        self.service = service
        self.tracer = provider.get_tracer("tandem")
        self._propagator = TraceContextTextMapPropagator()

    @classmethod
    def from_config(cls, cfg: "TracingConfig", role: str, *, exporter: Optional["SpanExporter"] = None,
                    batch: bool = True) -> Optional["Tracing"]:
        """The process's tracing, or None when `cfg.enabled` is false. `exporter`: instead of the
        configured one (tests: the SDK's InMemorySpanExporter, with `batch=False`)."""
        if not cfg.enabled:
            return None
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        service = f"{cfg.service_name_prefix}-{role}"
        if exporter is None:
            if cfg.exporter == "file":
                exporter = JsonLinesExporter(Path(cfg.file_dir or ".") / f"{service}-{os.getpid()}.jsonl")
                batch = False  # each span written as it ends (a debugging aid, read back by tests)
            else:
                exporter = otlp_exporter(cfg)
        provider = TracerProvider(resource=Resource.create({"service.name": service}),
                                  sampler=ParentBased(TraceIdRatioBased(cfg.sampling_ratio)))
        provider.add_span_processor(BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter))
        return cls(provider, service)

    # -- contexts ------------------------------------------------------------------------------

    def extract(self, headers: Mapping[str, str]) -> "Context":
        """The caller's context from W3C `traceparent` (and `tracestate`) headers; an empty context
        (a new trace) when there is none or it is malformed."""
        return self._propagator.extract(headers)

    def parent_of(self, traceparent: Optional[str]) -> Optional["Context"]:
        """The context a replica's span joins; None when the gateway sent none (not sampled)."""
        if not traceparent:
            return None
        return self._propagator.extract({"traceparent": traceparent})

    @staticmethod
    def traceparent(span: "Span") -> Optional[str]:
        """`span`'s W3C traceparent when it is sampled (what a replica needs to join), else None."""
        ctx = span.get_span_context()
        if not ctx.is_valid or not ctx.trace_flags.sampled:
            return None
        return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"

    @staticmethod
    def trace_id(span: "Span") -> Optional[str]:
        ctx = span.get_span_context()
        return f"{ctx.trace_id:032x}" if ctx.is_valid else None

    # -- spans ---------------------------------------------------------------------------------

    def start(self, name: str, *, parent: Optional["Context"] = None, kind: str = "internal",
              attributes: Optional[Mapping[str, Any]] = None) -> "Span":
        """A started span (end it yourself): never made the current span, so it may live across
        an async generator's yields. `parent`: None for the current context's span."""
        from opentelemetry.trace import SpanKind

        return self.tracer.start_span(name, context=parent, kind=getattr(SpanKind, kind.upper()),
                                      attributes=dict(attributes) if attributes else None)

    def child(self, name: str, **attributes: Any) -> Optional["Span"]:
        """A span under the current one (the request's), or None when the request is not sampled."""
        from opentelemetry import trace

        if not trace.get_current_span().is_recording():
            return None
        return self.tracer.start_span(name, attributes=attributes or None)

    def replica_span(self, name: str, traceparent: Optional[str], **attributes: Any) -> Optional["Span"]:
        """An engine replica's span for a hop, under the gateway's hop span; None when the hop
        carries no traceparent (its request is not traced)."""
        parent = self.parent_of(traceparent)
        if parent is None:
            return None
        return self.start(name, parent=parent, kind="server", attributes=attributes)

    def shutdown(self) -> None:
        """Flush and stop the exporter (a replica's teardown)."""
        self.provider.shutdown()


def end_span(span: Optional["Span"], error: Optional[BaseException] = None, **attributes: Any) -> None:
    """Set `attributes` and end `span` (None: nothing to do); `error` marks it failed by type
    only (an exception's message may quote the request)."""
    if span is None:
        return
    if attributes:
        span.set_attributes({k: v for k, v in attributes.items() if v is not None})
    if error is not None:
        from opentelemetry.trace import Status, StatusCode

        span.set_status(Status(StatusCode.ERROR, type(error).__name__))
        span.set_attribute("error.type", type(error).__name__)
        status = getattr(error, "status", None)  # an OpenAIError's HTTP status (429, 400): not its message
        if isinstance(status, int):
            span.set_attribute("http.response.status_code", status)
    span.end()


def replica_tracing(cfg: Any, role: str) -> Optional[Tracing]:
    """An engine replica's tracing from its ClusterConfig (None when off)."""
    return Tracing.from_config(cfg.observability.tracing, role)


@contextlib.contextmanager
def replica_span(tracing: Optional[Tracing], name: str, request: Any,
                 attributes: Optional[Callable[[], Mapping[str, Any]]] = None) -> Iterator[Optional["Span"]]:
    """An engine replica's span for `request`'s hop, under the gateway's (its `traceparent`);
    None inside when tracing is off here or the request is not traced (then `attributes`, a
    callable, is never called). Ends failed on an exception (by type only); a generator closed
    by its consumer is not a failure. Never made the current span, so it may enclose an async
    generator's yields."""
    traceparent = None if tracing is None else getattr(request, "traceparent", None)
    span = None if traceparent is None else tracing.replica_span(
        name, traceparent, **(attributes() if attributes is not None else {}))
    if span is None:
        yield None
        return
    try:
        yield span
    except GeneratorExit:
        end_span(span)
        raise
    except BaseException as exc:
        end_span(span, exc)
        raise
    else:
        end_span(span)


def joined(request: Any, span: Optional["Span"]) -> Any:
    """`request` with `span`'s traceparent (what vLLM's own engine spans join), or as it was."""
    traceparent = None if span is None else Tracing.traceparent(span)
    return request if traceparent is None else dataclasses.replace(request, traceparent=traceparent)


FIRST_OUTPUT = "tandem.first_output_s"


def timed_first_output(stream: AsyncIterator[Any], span: Optional["Span"]) -> AsyncIterator[Any]:
    """`stream`, with the seconds to its first item on `span` (FIRST_OUTPUT): on a decode replica,
    the KV pull (or the prompt's recompute) and the first step. `stream` itself when `span` is None,
    so an untraced request pays nothing."""
    return stream if span is None else _timed(stream, span)


async def _timed(stream: AsyncIterator[Any], span: "Span") -> AsyncIterator[Any]:
    started, first = time.monotonic(), True
    async with contextlib.aclosing(stream):  # closed early, the engine stream aborts its request
        async for item in stream:
            if first:
                span.set_attribute(FIRST_OUTPUT, round(time.monotonic() - started, 6))
                first = False
            yield item
