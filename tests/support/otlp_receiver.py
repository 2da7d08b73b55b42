"""An OTLP/HTTP trace receiver for the integration session: what a collector would receive
from every tandem process and every vLLM engine (observability.tracing, exporter otlp,
protocol http, engine_spans on). It decodes OpenTelemetry's own protobuf request
(ExportTraceServiceRequest) and keeps each span as a small `ReceivedSpan`; tests ask for one
trace's spans by its id."""

from __future__ import annotations

import gzip
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterable

TRACES_PATH = "/v1/traces"


@dataclass(frozen=True)
class ReceivedSpan:
    trace_id: str  # 32 hex digits, as in X-Trace-Id
    span_id: str
    parent_id: str  # "" for a root span
    name: str
    service: str  # the resource's service.name
    attributes: dict[str, Any]
    events: tuple[str, ...]


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    return None if kind is None else getattr(any_value, kind)


def _attributes(pairs: Iterable[Any]) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs}


def decode_spans(body: bytes) -> list[ReceivedSpan]:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest.FromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        service = str(_attributes(resource_spans.resource.attributes).get("service.name", ""))
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(ReceivedSpan(span.trace_id.hex(), span.span_id.hex(), span.parent_span_id.hex(),
                                          span.name, service, _attributes(span.attributes),
                                          tuple(event.name for event in span.events)))
    return spans


class OtlpReceiver:
    """Listens on 127.0.0.1:`port` for OTLP/HTTP (protobuf) exports; `start()`, then `trace()`."""

    def __init__(self, port: int) -> None:
        self.endpoint = f"http://127.0.0.1:{port}{TRACES_PATH}"
        self.spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != TRACES_PATH:
                    self.send_response(404)
                    self.end_headers()
                    return
                received = decode_spans(body)
                with receiver._lock:
                    receiver.spans.extend(received)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-receiver", daemon=True)

    def start(self) -> "OtlpReceiver":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def received(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self.spans)

    def trace(self, trace_id: str, want: dict[str, int], timeout_s: float = 30.0) -> dict[str, list[ReceivedSpan]]:
        """The trace's spans by name, once at least `want[name]` of each name arrived (batching
        exporters send every few seconds) or at the timeout (the caller's assertion then says
        what is missing)."""
        deadline = time.monotonic() + timeout_s
        while True:
            found: dict[str, list[ReceivedSpan]] = {}
            for span in self.received():
                if span.trace_id == trace_id:
                    found.setdefault(span.name, []).append(span)
            if all(len(found.get(name, ())) >= n for name, n in want.items()) or time.monotonic() > deadline:
                return found
            time.sleep(0.25)
