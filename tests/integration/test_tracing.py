"""One trace per request on the real cluster (issue 33): the gateway, the prefill and decode
replicas and both vLLM engines export OTLP/HTTP to the session's receiver
(tests/support/otlp_receiver.py; the cluster traces with sampling 0 and engine spans on,
tests/support/integration_cluster.py), and a request that sends a sampled W3C traceparent
comes back as one trace, parented gateway → hop → replica → vLLM's own `llm_request`.
The 429 and the fallback-recompute traces are checked where those happen: test_faults_overload
and test_prefill_outage (traced_headers, below)."""

from __future__ import annotations

import json
import secrets
import time

import httpx
import pytest

from tests.support.integration_cluster import MODEL_NAME
from tests.support.otlp_receiver import ReceivedSpan

# OpenTelemetry's BatchSpanProcessor sends every 5 s (its default schedule delay), and each
# process (gateway, replicas, engines) batches on its own: a span may reach the receiver up to
# that long after a later span of another process.
BATCH_DELAY_S = 6
SECRET_WORD = "zebraquartz"  # in every prompt here: no span may carry it
CHAT = "/v1/chat/completions"
P_D = {f"POST {CHAT}": 1, "tandem.admission": 1, "tandem.prefill_hop": 1, "tandem.prefill": 1,
       "tandem.decode_hop": 1, "tandem.decode": 1, "llm_request": 2}


def traced_headers() -> tuple[str, str, dict[str, str]]:
    """(trace id, the caller's span id, headers) of a request its caller asks to be traced."""
    trace_id, caller = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, caller, {"traceparent": f"00-{trace_id}-{caller}-01"}


def only(spans: dict[str, list[ReceivedSpan]], name: str) -> ReceivedSpan:
    assert len(spans.get(name, ())) == 1, (name, sorted(spans))
    return spans[name][0]


def no_request_text(spans: dict[str, list[ReceivedSpan]]) -> None:
    dumped = json.dumps([span.__dict__ for found in spans.values() for span in found], default=str)
    assert SECRET_WORD not in dumped


def _chat(base_url: str, headers: dict[str, str], stream: bool) -> httpx.Response:
    body = {"model": MODEL_NAME, "max_tokens": 8, "ignore_eos": True, "temperature": 0, "stream": stream,
            "messages": [{"role": "user", "content": f"A traced question about {SECRET_WORD} and the sea"}]}
    return httpx.post(f"{base_url}{CHAT}", json=body, headers=headers, timeout=120)


@pytest.mark.parametrize("stream", [False, True], ids=["chat", "chat-stream"])
def test_a_pd_request_is_one_trace_from_the_gateway_to_both_vllm_engines(base_url, otlp_receiver, tiny_model_dir,
                                                                           stream):
    trace_id, caller, headers = traced_headers()
    r = _chat(base_url, headers, stream)
    assert r.status_code == 200, r.text
    assert r.headers["X-Trace-Id"] == trace_id

    spans = otlp_receiver.trace(trace_id, P_D)
    assert {name: len(spans.get(name, ())) for name in P_D} == P_D, sorted(spans)
    root = only(spans, f"POST {CHAT}")
    assert root.parent_id == caller and root.service == "tandem-gateway"
    assert root.attributes["http.response.status_code"] == 200
    assert root.attributes["tandem.route.path"] == "remote"
    assert root.attributes["gen_ai.usage.output_tokens"] == 8
    span_id = {name: only(spans, name).span_id for name in P_D if name != "llm_request"}
    for child, parent in (("tandem.admission", f"POST {CHAT}"), ("tandem.prefill_hop", f"POST {CHAT}"),
                          ("tandem.decode_hop", f"POST {CHAT}"), ("tandem.prefill", "tandem.prefill_hop"),
                          ("tandem.decode", "tandem.decode_hop")):
        assert only(spans, child).parent_id == span_id[parent], (child, parent)
    assert only(spans, "tandem.prefill").service == "tandem-prefill"
    decode = only(spans, "tandem.decode")
    assert decode.service == "tandem-decode"
    assert decode.attributes["tandem.kv.pull"] is True and decode.attributes["tandem.kv.blocks"] >= 1
    assert 0 < decode.attributes["tandem.first_output_s"] < 60

    # vLLM's own request spans, one per engine, each under its replica's span.
    engines = {span.parent_id: span for span in spans["llm_request"]}
    assert set(engines) == {span_id["tandem.prefill"], span_id["tandem.decode"]}
    assert {span.service for span in engines.values()} == {"tandem-engine"}
    prefill_engine, decode_engine = engines[span_id["tandem.prefill"]], engines[span_id["tandem.decode"]]
    prompt_tokens = root.attributes["gen_ai.usage.input_tokens"]
    assert prefill_engine.attributes["gen_ai.usage.prompt_tokens"] == prompt_tokens
    # Decode continues after the prefill's first token: its prompt is the prompt and that token.
    assert decode_engine.attributes["gen_ai.usage.prompt_tokens"] == prompt_tokens + 1
    assert decode_engine.attributes["gen_ai.usage.completion_tokens"] == 7
    assert decode_engine.attributes["gen_ai.latency.time_in_queue"] >= 0
    # The bytes pulled: every block of the prompt, K and V of each layer and KV head, float32.
    model = json.loads((tiny_model_dir / "config.json").read_text())
    per_token = 2 * model["num_hidden_layers"] * model["num_key_value_heads"] * model["head_dim"] * 4
    blocks = decode.attributes["tandem.kv.blocks"]
    block_size, rest = divmod(decode.attributes["tandem.kv.bytes"], blocks * per_token)
    assert rest == 0 and block_size in (16, 32, 64, 128) and -(-prompt_tokens // block_size) == blocks, \
        (decode.attributes, prompt_tokens)
    no_request_text(spans)


def test_vllm_traces_only_what_the_gateway_traces(base_url, otlp_receiver):
    """An untraced request makes no span in any engine: vLLM would otherwise start a trace of its
    own for each request (cluster/engine/vllm.py UNSAMPLED_PARENT). Every earlier request of the
    session ran untraced unless it asked; once a later traced request's spans all arrived, and
    every process's batch exporter has sent what it held (BATCH_DELAY_S), every `llm_request` the
    receiver holds must belong to a trace the gateway started."""
    assert _chat(base_url, {}, stream=False).status_code == 200
    trace_id, _, headers = traced_headers()
    assert _chat(base_url, headers, stream=False).status_code == 200
    spans = otlp_receiver.trace(trace_id, P_D)
    assert {name: len(spans.get(name, ())) for name in P_D} == P_D, sorted(spans)
    time.sleep(BATCH_DELAY_S)
    received = otlp_receiver.received()
    traced = {span.trace_id for span in received if span.service == "tandem-gateway" and span.name.startswith("POST")}
    engine_spans = [span for span in received if span.name == "llm_request"]
    assert len(engine_spans) >= 2
    assert all(span.parent_id and span.trace_id in traced for span in engine_spans), \
        [span for span in engine_spans if span.trace_id not in traced][:3]
