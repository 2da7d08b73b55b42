"""`observability:` — what tandem exports about itself beyond metrics: OpenTelemetry traces
(cluster/tracing.py builds each process's tracer from `observability.tracing`)."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, model_validator

from cluster.config.base import _Strict


class TracingConfig(_Strict):
    """OpenTelemetry tracing: one trace per request, gateway → prefill → decode (docs/operations.md
    "Tracing"). Off by default; when off no tracer exists and the request path does no tracing work."""

    enabled: bool = Field(False, description="Export a trace per sampled request. Off: no tracer is built in any "
                                             "process, and no span is made.")
    exporter: Literal["otlp", "file"] = Field(
        "otlp", description="Where spans go: `otlp`, an OpenTelemetry collector (or Jaeger, Tempo) at `endpoint`; "
                            "`file`, JSON lines under `file_dir`, one file per process (no collector needed).")
    endpoint: Optional[str] = Field(
        None, max_length=2048, pattern=r"^https?://\S+$",
        description="The OTLP receiver, e.g. `http://otel-collector:4317` (grpc) or "
                    "`http://otel-collector:4318/v1/traces` (http). Required with exporter otlp when enabled. "
                    "Also handed to the vLLM engines (`otlp_traces_endpoint`) so their own spans join the trace.")
    protocol: Literal["grpc", "http"] = Field("grpc", description="OTLP over gRPC or over HTTP (protobuf).")
    insecure: bool = Field(True, description="gRPC without TLS (an in-cluster collector); false: TLS with the "
                                             "system's CA certificates. HTTP follows the endpoint's scheme.")
    sampling_ratio: float = Field(
        1.0, ge=0.0, le=1.0,
        description="Share of requests that start a trace at the gateway (1.0: every one). A request that "
                    "arrives with a W3C `traceparent` follows its caller's sampled flag instead. 1.0 because "
                    "tracing is off by default and is turned on to see requests; for always-on tracing of a busy "
                    "cluster use e.g. 0.01 (Ray Serve's own default).")
    service_name_prefix: str = Field(
        "tandem", pattern=r"^[A-Za-z][A-Za-z0-9_.-]{0,62}$",
        description="Each process reports service.name `<prefix>-gateway`, `<prefix>-prefill` or "
                    "`<prefix>-decode` (vLLM's engine spans: `<prefix>-engine`).")
    file_dir: Optional[str] = Field(
        None, max_length=4096,
        description="With exporter file: the folder each process writes `<service>-<pid>.jsonl` into "
                    "(one span per line, OpenTelemetry's JSON form).")
    engine_spans: bool = Field(
        False, description="With exporter otlp: pass `endpoint` to every vLLM engine as `otlp_traces_endpoint`, "
                           "its spans (`llm_request`: queue, prefill, decode times) parented under the replica's span, with "
                           "`protocol` and the service name `<prefix>-engine`. Needs exporter otlp; with grpc, "
                           "insecure (vLLM's gRPC exporter has no TLS).")

    @model_validator(mode="after")
    def _check_destination(self) -> "TracingConfig":
        if self.enabled and self.exporter == "otlp" and not self.endpoint:
            raise ValueError("observability.tracing.endpoint: set the OTLP receiver (or exporter: file)")
        if self.enabled and self.exporter == "file" and not self.file_dir:
            raise ValueError("observability.tracing.file_dir: set the folder spans are written to")
        if self.enabled and self.engine_spans and self.exporter != "otlp":
            raise ValueError("observability.tracing.engine_spans: vLLM exports its spans over OTLP only; "
                             "set exporter: otlp and an endpoint, or engine_spans: false")
        if self.enabled and self.engine_spans and self.protocol == "grpc" and not self.insecure:
            raise ValueError("observability.tracing.engine_spans: vLLM's gRPC exporter connects without TLS only; "
                             "use protocol: http with an https:// endpoint, or insecure: true")
        return self


class ObservabilityConfig(_Strict):
    """What tandem exports about itself beyond metrics."""

    tracing: TracingConfig = Field(TracingConfig(), description="OpenTelemetry traces, one per request.")
