"""observability.tracing at the gateway (router/tracing.py, cluster/tracing.py): vLLM's real app
behind tandem's edge, over the real admission, KVRouter and P/D path on fake Serve pools, traced
into the OpenTelemetry SDK's InMemorySpanExporter. One trace per request, parent-child correct,
a caller's traceparent honoured, the trace id in a header, a 429 traced with its status, and no
prompt, completion, key or tenant in any exported span."""

from __future__ import annotations

import json
import pickle
import random
from typing import Any

import pytest
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from cluster.config import AdmissionConfig, TracingConfig
from cluster.protocol import EngineRequest
from cluster.tracing import TRACE_ID_HEADER, Tracing, replica_span
from router.admission import AdmissionControl
from router.openai.context import Caller
from router.openai.errors import OpenAIError
from router.pd.path import DisaggregatedBackend
from router.request_metrics import MeasuredBackend
from router.routing.decider import PDDecider
from router.routing.directory import PoolDirectory
from router.routing.service import KVRouter
from router.tracing import TracedHops, TracingEdge, instrument_gateway
from cluster.types import TierPools
from tests.support.fakes import FakeServePool
from tests.support.openai_helpers import MODEL, TIER, edge_app

ON = TracingConfig(enabled=True, exporter="file", file_dir="/nonexistent")  # the exporter is replaced below
KEY = "sk-tandem-very-secret-key-4711"
TENANT = "acme-tenant-zq"
PROMPT = "zebra quartz umbrella sentinel phrase"


class RecordingPool(FakeServePool):
    """A fake pool that keeps every EngineRequest it is sent (to read its traceparent)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[EngineRequest] = []

    def route(self, method: str, request_id: str) -> str:
        return super().route(method, request_id)


def _record(pool: RecordingPool) -> None:
    for method in (pool.prefill, pool.generate):
        real = method.remote

        def remote(*args: Any, _real=real) -> Any:
            if isinstance(args[0], EngineRequest):
                pool.sent.append(args[0])
            return _real(*args)

        method.remote = remote  # type: ignore[method-assign]


def traced_edge(*, ratio: float = 1.0, admission: AdmissionConfig | None = None, authenticate=None,
                decode_replicas: tuple[str, ...] = ("d0",)):
    exporter = InMemorySpanExporter()
    cfg = TracingConfig(enabled=True, exporter="file", file_dir="/nonexistent", sampling_ratio=ratio)
    tracing = Tracing.from_config(cfg, "gateway", exporter=exporter, batch=False)
    dirs = {(TIER, pool): PoolDirectory() for pool in ("prefill", "decode")}
    pools = TierPools(prefill=RecordingPool(dirs[(TIER, "prefill")], ["p0"]),
                      decode=RecordingPool(dirs[(TIER, "decode")], list(decode_replicas)))
    _record(pools.prefill)
    _record(pools.decode)
    router = KVRouter(directories=dirs, index=None, weights={"load": 1.0}, decider=PDDecider(0),
                      subscribe=False, rng=random.Random(7))
    backend = DisaggregatedBackend(pools={TIER: pools}, decode_streams="per_request", prefill_timeout_s=5.0,
                                   router=router)
    gate = AdmissionControl(backend, {TIER: admission or AdmissionConfig(max_running=4, max_queued=4)})
    outer = instrument_gateway(tracing, backend=backend, router=router, admission=gate,
                               outer=MeasuredBackend(gate))
    app = TracingEdge(edge_app(outer, authenticate=authenticate), tracing)
    return TestClient(app, raise_server_exceptions=False), exporter, pools, gate


def by_name(exporter: InMemorySpanExporter) -> dict[str, Any]:
    spans = exporter.get_finished_spans()
    named = {s.name: s for s in spans}
    assert len(named) == len(spans), [s.name for s in spans]
    return named


CHAT = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 4}


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_is_one_trace_request_admission_prefill_decode(stream: bool) -> None:
    client, exporter, pools, _ = traced_edge()
    r = client.post("/v1/chat/completions", json={**CHAT, "stream": stream})
    assert r.status_code == 200, r.text
    spans = by_name(exporter)
    root = spans["POST /v1/chat/completions"]
    assert set(spans) == {"POST /v1/chat/completions", "tandem.admission", "tandem.prefill_hop",
                          "tandem.decode_hop"}
    assert root.parent is None
    trace_id = root.context.trace_id
    assert r.headers[TRACE_ID_HEADER] == f"{trace_id:032x}"
    for name in ("tandem.admission", "tandem.prefill_hop", "tandem.decode_hop"):
        assert spans[name].context.trace_id == trace_id
        assert spans[name].parent.span_id == root.context.span_id, name
    a = root.attributes
    assert a["http.response.status_code"] == 200 and a["tandem.tier"] == TIER
    assert a["tandem.route.path"] == "remote" and a["tandem.route.reason"] == "index_unavailable"  # no prefix index here
    assert a["gen_ai.usage.output_tokens"] == 4 and a["gen_ai.response.finish_reasons"] == ("length",)
    assert [e.name for e in root.events] == ["first_token"]
    decode = spans["tandem.decode_hop"].attributes
    assert decode["tandem.handoff"] is True and decode["tandem.route"] == "disaggregated"
    assert decode["tandem.finish_reason"] == "length" and decode["tandem.tokens_streamed"] >= 3
    # Each hop carried its own span as the replica's parent.
    (prefill_req,) = pools.prefill.sent
    (decode_req,) = pools.decode.sent
    for sent, hop in ((prefill_req, spans["tandem.prefill_hop"]), (decode_req, spans["tandem.decode_hop"])):
        flags = int(hop.context.trace_flags)
        assert flags & 1 and sent.traceparent == f"00-{trace_id:032x}-{hop.context.span_id:016x}-{flags:02x}"


def test_an_incoming_traceparent_is_honoured() -> None:
    client, exporter, _, _ = traced_edge(ratio=0.0)  # the caller's sampled flag wins over the ratio
    trace_id, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    r = client.post("/v1/chat/completions", json=CHAT, headers={"traceparent": f"00-{trace_id}-{parent}-01"})
    assert r.status_code == 200
    root = by_name(exporter)["POST /v1/chat/completions"]
    assert f"{root.context.trace_id:032x}" == trace_id and f"{root.parent.span_id:016x}" == parent
    assert r.headers[TRACE_ID_HEADER] == trace_id


def test_an_unsampled_request_makes_no_span_and_no_header() -> None:
    client, exporter, pools, _ = traced_edge()
    r = client.post("/v1/chat/completions", json=CHAT,
                    headers={"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"})
    assert r.status_code == 200 and TRACE_ID_HEADER not in r.headers
    assert exporter.get_finished_spans() == ()
    assert all(req.traceparent is None for req in pools.prefill.sent + pools.decode.sent)
    client, exporter, _, _ = traced_edge(ratio=0.0)
    assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
    assert exporter.get_finished_spans() == ()


def test_a_malformed_traceparent_starts_a_new_trace() -> None:
    client, exporter, _, _ = traced_edge()
    r = client.post("/v1/chat/completions", json=CHAT, headers={"traceparent": "00-zz-not-a-trace"})
    assert r.status_code == 200
    root = by_name(exporter)["POST /v1/chat/completions"]
    assert root.parent is None and r.headers[TRACE_ID_HEADER] == f"{root.context.trace_id:032x}"


def test_a_429_refusal_is_traced_with_its_status() -> None:
    client, exporter, pools, gate = traced_edge(admission=AdmissionConfig(max_running=1, max_queued=0))
    gate.gates[TIER].running = 1  # the tier's one place is taken
    r = client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert r.status_code == 429
    spans = by_name(exporter)
    assert set(spans) == {"POST /v1/chat/completions", "tandem.admission"}
    root, wait = spans["POST /v1/chat/completions"], spans["tandem.admission"]
    assert root.attributes["http.response.status_code"] == 429
    assert wait.attributes["http.response.status_code"] == 429 and wait.status.is_ok is False
    assert wait.parent.span_id == root.context.span_id
    assert r.headers[TRACE_ID_HEADER] == f"{root.context.trace_id:032x}"
    assert pools.prefill.sent == [] and pools.decode.sent == []


def test_probes_are_not_traced() -> None:
    client, exporter, _, _ = traced_edge()
    assert client.get("/livez").status_code == 200
    assert client.get("/health").status_code == 200
    assert exporter.get_finished_spans() == ()


def test_no_prompt_completion_key_or_tenant_in_any_exported_span() -> None:
    def authenticate(headers):
        if headers.get("authorization") != f"Bearer {KEY}":
            raise OpenAIError(401, "Invalid API key.", "authentication_error", None, "invalid_api_key")
        return Caller(TIER, tenant=TENANT, cache_salt="salt-of-acme-9931")

    client, exporter, _, _ = traced_edge(authenticate=authenticate)
    answers = []
    for stream in (False, True):
        r = client.post("/v1/chat/completions", json={**CHAT, "stream": stream},
                        headers={"Authorization": f"Bearer {KEY}", "X-Request-Id": "plain-id-1"})
        assert r.status_code == 200, r.text
        answers.append(r.text)
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": PROMPT, "max_tokens": 4},
                    headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200
    completion = r.json()["choices"][0]["text"]
    refused = client.post("/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer sk-wrong-key-0815"})
    assert refused.status_code == 401
    spans = exporter.get_finished_spans()
    assert len(spans) >= 13
    dump = "\n".join(s.to_json() for s in spans)
    for secret in (PROMPT, *PROMPT.split(), KEY, "sk-wrong-key-0815", TENANT, "salt-of-acme-9931", "Bearer"):
        assert secret not in dump, secret
    assert len(completion.strip()) >= 4 and completion.strip() not in dump
    # No token ids either: no attribute holds a list of ints.
    for span in spans:
        for key, value in span.attributes.items():
            assert not (isinstance(value, tuple) and value and isinstance(value[0], int)), key


def test_off_builds_nothing_and_touches_nothing() -> None:
    assert Tracing.from_config(TracingConfig(), "gateway") is None
    backend, router, admission, outer = object(), object(), object(), object()
    assert instrument_gateway(None, backend=backend, router=router, admission=admission, outer=outer) is outer
    assert AdmissionControl.tracing is None and KVRouter.traced is False


def test_the_hop_wrapper_is_hops_for_everything_else() -> None:
    class Hops:
        def close(self):
            return "closed"

    tracing = Tracing.from_config(ON, "gateway", exporter=InMemorySpanExporter(), batch=False)
    assert TracedHops(Hops(), tracing).close() == "closed"


def test_a_replica_span_joins_the_hop_and_gives_vllm_its_own_parent() -> None:
    exporter = InMemorySpanExporter()
    replica = Tracing.from_config(ON, "decode", exporter=exporter, batch=False)
    hop = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    request = EngineRequest("r", (1, 2), None, tier=TIER, traceparent=hop)  # type: ignore[arg-type]
    with replica_span(replica, "tandem.decode", request, lambda: {"tandem.kv.pull": True}) as span:
        from cluster.tracing import joined

        inner = joined(request, span)
    (done,) = exporter.get_finished_spans()
    assert f"{done.parent.span_id:016x}" == "00f067aa0ba902b7" and done.resource.attributes["service.name"] == "tandem-decode"
    assert inner.traceparent.startswith(f"00-4bf92f3577b34da6a3ce929d0e0e4736-{done.context.span_id:016x}-")
    # Untraced hop (no traceparent), or tracing off here: no span.
    with replica_span(replica, "tandem.decode", EngineRequest("s", (1,), None, tier=TIER)) as span:  # type: ignore[arg-type]
        assert span is None
    with replica_span(None, "tandem.decode", request) as span:
        assert span is None
    with pytest.raises(ValueError), replica_span(replica, "tandem.prefill", request):
        raise ValueError("the prompt was: zebra")
    failed = exporter.get_finished_spans()[-1]
    assert failed.attributes["error.type"] == "ValueError" and "zebra" not in failed.to_json()


def test_the_traceparent_crosses_ray_in_the_request() -> None:
    from vllm import SamplingParams

    request = EngineRequest("r", (1, 2), SamplingParams(max_tokens=3), tier=TIER,
                            traceparent="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
    assert pickle.loads(pickle.dumps(request)).traceparent == request.traceparent
    assert pickle.loads(pickle.dumps(EngineRequest("r", (1,), SamplingParams(), tier=TIER))).traceparent is None


def test_the_file_exporter_writes_json_lines(tmp_path) -> None:
    cfg = TracingConfig(enabled=True, exporter="file", file_dir=str(tmp_path))
    tracing = Tracing.from_config(cfg, "gateway")
    tracing.start("one").end()
    tracing.shutdown()
    (path,) = tmp_path.glob("tandem-gateway-*.jsonl")
    (line,) = path.read_text().splitlines()
    assert json.loads(line)["name"] == "one"


def test_the_config_needs_a_destination_and_bounds_the_ratio() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="endpoint"):
        TracingConfig(enabled=True)
    with pytest.raises(ValidationError, match="file_dir"):
        TracingConfig(enabled=True, exporter="file")
    with pytest.raises(ValidationError):
        TracingConfig(sampling_ratio=1.5)
    with pytest.raises(ValidationError):
        TracingConfig(endpoint="collector:4317")  # a URL with its scheme
    assert TracingConfig(enabled=True, endpoint="http://otel:4317").sampling_ratio == 1.0


def test_a_migrated_answer_says_so_on_its_request_span() -> None:
    """A decode replica dying mid-answer: the request span carries the migration, once, with
    what broke (router/pd/path.py annotate_migration); the answer is still whole."""
    client, exporter, pools, _ = traced_edge(decode_replicas=("d0", "d1"))
    pools.decode.die_after = {"d0": 2, "d1": 2}
    r = client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 6})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 6
    spans = exporter.get_finished_spans()
    (root,) = [s for s in spans if s.name == "POST /v1/chat/completions"]
    # The continuation is hops of its own, in the same trace.
    assert [s.name for s in spans].count("tandem.decode_hop") >= 2
    assert {s.context.trace_id for s in spans} == {root.context.trace_id}
    migrations = [e for e in root.events if e.name == "tandem.migration"]
    assert migrations, [e.name for e in root.events]
    first = migrations[0].attributes
    assert first["tandem.migration.result"] == "continued" and first["tandem.migration.reason"] == "replica_died"
    assert first["tandem.migration.tokens_sent"] >= 1 and first["tandem.migration.attempt"] == 1


def test_the_first_output_is_timed_on_a_traced_hop_and_an_untraced_one_is_left_alone() -> None:
    import asyncio

    from cluster.tracing import FIRST_OUTPUT, timed_first_output

    closed = []

    async def engine_stream():
        try:
            for i in range(3):
                await asyncio.sleep(0.01)
                yield i
        finally:
            closed.append(True)  # vLLM aborts the request when its stream is closed

    stream = engine_stream()
    assert timed_first_output(stream, None) is stream  # untraced: no wrapper, no cost
    exporter = InMemorySpanExporter()
    replica = Tracing.from_config(ON, "decode", exporter=exporter, batch=False)
    span = replica.start("tandem.decode")

    async def first_then_leave():
        timed = timed_first_output(engine_stream(), span)
        first = await timed.__anext__()
        await timed.aclose()  # the client left after one token
        return first

    assert asyncio.run(first_then_leave()) == 0
    assert closed == [True]  # the engine's stream was closed too, not left to the collector
    span.end()
    (done,) = exporter.get_finished_spans()
    assert 0.005 < done.attributes[FIRST_OUTPUT] < 5
