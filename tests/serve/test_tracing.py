"""One trace across processes (observability.tracing, exporter file): a request that sends a
sampled W3C traceparent is traced by the gateway and by the prefill and decode replicas it
reaches, each process writing its own spans (tests/support/serve_graph.py TRACES_DIR), joined
by the trace id and parented gateway → hop → replica."""

from __future__ import annotations

import json
import secrets
import time

import httpx

from tests.support.serve_graph import MODEL_NAME, TRACES_DIR

PROMPT = "trace me across the pools " * 8


def _spans(trace_id: str, want: set[str], deadline_s: float = 15.0) -> dict[str, dict]:
    """The trace's spans by name, once every name in `want` was written (replicas end theirs as
    their streams end, a moment after the response)."""
    found: dict[str, dict] = {}
    deadline = time.monotonic() + deadline_s
    while True:
        found = {}
        for path in TRACES_DIR.glob("*.jsonl"):
            for line in path.read_text().splitlines():
                if trace_id in line:
                    span = json.loads(line)
                    if span["context"]["trace_id"] == f"0x{trace_id}":
                        found[span["name"]] = span
        if want <= set(found) or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def test_a_traced_request_is_one_trace_across_gateway_prefill_and_decode(graph):
    trace_id, caller_span = secrets.token_hex(16), secrets.token_hex(8)
    r = httpx.post(f"{graph.url}/v1/completions", timeout=30,
                   json={"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 6},
                   headers={"traceparent": f"00-{trace_id}-{caller_span}-01"})
    assert r.status_code == 200, r.text
    assert r.headers["X-Trace-Id"] == trace_id
    want = {"POST /v1/completions", "tandem.admission", "tandem.prefill_hop", "tandem.prefill",
            "tandem.decode_hop", "tandem.decode"}
    spans = _spans(trace_id, want)
    assert want <= set(spans), sorted(spans)
    span_id = {name: span["context"]["span_id"] for name, span in spans.items()}
    assert spans["POST /v1/completions"]["parent_id"] == f"0x{caller_span}"
    for child, parent in (("tandem.admission", "POST /v1/completions"), ("tandem.prefill_hop", "POST /v1/completions"),
                          ("tandem.decode_hop", "POST /v1/completions"), ("tandem.prefill", "tandem.prefill_hop"),
                          ("tandem.decode", "tandem.decode_hop")):
        assert spans[child]["parent_id"] == span_id[parent], (child, parent)
    services = {name: span["resource"]["attributes"]["service.name"] for name, span in spans.items()}
    assert services["tandem.prefill"] == "tandem-prefill" and services["tandem.decode"] == "tandem-decode"
    assert services["POST /v1/completions"] == "tandem-gateway"
    assert spans["tandem.decode"]["attributes"]["tandem.kv.pull"] is True
    assert spans["POST /v1/completions"]["attributes"]["gen_ai.usage.output_tokens"] == 6
    assert "trace me" not in json.dumps(list(spans.values()))


def test_an_untraced_request_leaves_no_span(graph):
    r = httpx.post(f"{graph.url}/v1/completions", timeout=30,
                   json={"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 2})
    assert r.status_code == 200 and "X-Trace-Id" not in r.headers
