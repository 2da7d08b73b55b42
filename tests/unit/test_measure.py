"""The clients' measuring home (loadtest/measure/): SSE reading and timing, the record's
views of the gaps, the percentile convention, and stream_async over a mock transport."""

import asyncio
import json

import httpx
import pytest

from loadtest.measure.percentiles import latency_summary, summarize
from loadtest.measure.record import RequestRecord
from loadtest.measure.sse import StreamReader, payload, read_events, stream_async


def sse(obj) -> str:
    return "data: " + json.dumps(obj)


def chat(content=None, token_ids=None, role=None, finish=None):
    delta = {}
    if role:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    if token_ids is not None:
        choice["token_ids"] = token_ids
    return sse({"choices": [choice]})


def read(events, end=None) -> RequestRecord:
    """(seconds since sent, SSE line) pairs through a StreamReader sent at 0."""
    reader = StreamReader(0.0)
    for at, line in events:
        reader.feed(line, at)
    return reader.record(end if end is not None else (events[-1][0] if events else 0.0))


# ---------------------------------------------------------------- SSE timing

def test_chat_stream_one_arrival_per_token_role_and_usage_chunks_carry_none():
    rec = read([(0.10, chat(content="", role="assistant")),
                (0.30, chat(content="Hel", token_ids=[11])),
                (0.35, chat(content="lo", token_ids=[12])),
                (0.50, chat(content="", token_ids=[13])),  # a token whose text is held back still arrived
                (0.51, sse({"choices": [], "usage": {"prompt_tokens": 60, "completion_tokens": 3}})),
                (0.52, "data: [DONE]")])
    assert rec.ttft_ms == pytest.approx(300.0)
    assert rec.token_gaps_ms == pytest.approx((50.0, 150.0))
    assert rec.mean_itl_ms == pytest.approx(100.0)
    assert rec.e2e_ms == pytest.approx(520.0)
    assert (rec.prompt_tokens, rec.usage_tokens, rec.tokens, rec.ok) == (60, 3, 3, True)


def test_a_chunk_carrying_several_tokens_counts_them_all_arriving_together():
    rec = read([(0.2, chat(content="a", token_ids=[1])), (0.9, chat(content="bcd", token_ids=[2, 3, 4])),
                (0.9, "data: [DONE]")])
    assert rec.tokens == 4
    assert rec.token_gaps_ms == pytest.approx((700.0, 0.0, 0.0))  # as measured: one stall
    assert rec.itl_ms == pytest.approx((700 / 3,) * 3)  # shared by the chunk's tokens
    assert rec.max_gap_ms == pytest.approx(700.0)


def test_itl_shares_each_chunks_gap_and_the_first_chunks_extra_tokens_have_none():
    gaps = RequestRecord(ttft_ms=100.0, token_gaps_ms=(0.0, 0.0, 20.0, 40.0, 0.0)).itl_ms
    assert gaps == pytest.approx((0.0, 0.0, 20.0, 20.0, 20.0))
    assert sum(gaps) == pytest.approx(60.0)  # the mean ITL is unchanged


def test_without_token_ids_a_chunk_with_content_is_one_token_and_completions_text_counts():
    rec = read([(0.1, chat(content="", role="assistant")), (0.2, chat(content="x")), (0.4, chat(content="y"))])
    assert rec.ttft_ms == pytest.approx(200.0) and rec.token_gaps_ms == pytest.approx((200.0,))
    reader = StreamReader(0.0)
    for at, line in [(0.3, sse({"choices": [{"index": 0, "text": "a"}]})),
                     (0.4, sse({"choices": [{"index": 0, "text": ""}]})),
                     (0.5, sse({"choices": [{"index": 0, "text": "b", "finish_reason": "length"}]}))]:
        reader.feed(line, at)
    comp = reader.record(0.5)
    assert comp.ttft_ms == pytest.approx(300.0) and comp.token_gaps_ms == pytest.approx((200.0,))
    assert reader.text == "ab" and reader.finished and reader.finish_reasons == ["length"]


def test_comments_and_blank_data_are_skipped_and_an_empty_or_failed_stream_is_an_error():
    rec = read([(0.1, ": keep-alive"), (0.2, "data: "), (0.3, chat(content="z", token_ids=[5])), (0.3, "data: [DONE]")])
    assert rec.tokens == 1 and rec.mean_itl_ms is None and rec.token_gaps_ms == () and rec.ok
    assert read([(0.1, "data: [DONE]")]).error == "stream ended without a token"
    assert read([(0.1, chat(content="z"))]).error == "stream ended without [DONE]"
    failed = read([(0.1, chat(content="a", token_ids=[1])), (0.2, sse({"error": {"message": "boom"}}))])
    assert failed.error == "error event: boom" and failed.tokens == 1
    assert read([(0.1, "data: {not json")]).error.startswith("malformed event")


def test_the_callers_error_comes_first_and_later_lines_are_ignored():
    reader = StreamReader(1.0)
    assert reader.feed(b"data: " + json.dumps({"choices": [{"text": "a", "token_ids": [1]}]}).encode(), 1.1)
    assert not reader.feed(b"data: [DONE]", 1.2)
    assert not reader.feed(b"data: " + json.dumps({"choices": [{"text": "b"}]}).encode(), 1.3)
    assert reader.record(1.2, error="ReadTimeout: x", status=200).error == "ReadTimeout: x"
    rec = reader.record(1.2, expect_tokens=2, index=4, workload="chat")
    assert rec.error == "got 1 of 2 output tokens" and (rec.index, rec.workload) == (4, "chat")
    assert reader.ids == [1]


def test_payload_and_read_events():
    assert payload("data: [DONE]") == "[DONE]" and payload(b"data:{}") == "{}" and payload(": ping") is None
    events, done = read_events(["data: {\"a\": 1}", "", "data: text", "event: x", "data: [DONE]"])
    assert events == [{"a": 1}, "text"] and done
    assert read_events(["data: {}"]) == ([{}], False)


def test_tokens_per_s_and_output_tokens_prefer_the_servers_count():
    rec = RequestRecord(ttft_ms=100.0, token_gaps_ms=(10.0,) * 4, e2e_ms=140.0)
    assert rec.tokens == rec.output_tokens == 5 and rec.tokens_per_s == pytest.approx(100.0)
    merged = RequestRecord(ttft_ms=100.0, token_gaps_ms=(30.0,), usage_tokens=4)  # chunks without token ids
    assert merged.tokens == 2 and merged.output_tokens == 4 and merged.mean_itl_ms == pytest.approx(10.0)


# ---------------------------------------------------------------- percentiles

def test_latency_summary_holds_the_tail_and_the_worst_case():
    s = latency_summary([float(v) for v in range(1, 201)])  # 1..200 ms
    assert s == {"p50_ms": 100.5, "p90_ms": 180.1, "p99_ms": 198.0, "max_ms": 200.0, "mean_ms": 100.5, "n": 200}
    assert latency_summary([]) == {"n": 0}
    assert latency_summary([7.0])["p99_ms"] == 7.0
    assert latency_summary([1.234, 2.0], digits=2)["p50_ms"] == 1.62
    assert summarize([1.0, 2.0, 3.0]).percentiles[95.0] == pytest.approx(2.9)


# ---------------------------------------------------------------- stream_async

def body_of(*events) -> bytes:
    return "".join(f"data: {e}\n\n" for e in events).encode()


def run_async(handler, **kwargs):
    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await stream_async(client, "http://test/v1/completions", {"stream": True}, **kwargs)

    return asyncio.run(go())


def test_stream_async_reads_a_stream_to_its_end():
    def handler(request):
        text = body_of(json.dumps({"choices": [{"text": "a", "token_ids": [1]}]}),
                       json.dumps({"choices": [{"text": "b", "token_ids": [2], "finish_reason": "length"}]}),
                       json.dumps({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}), "[DONE]")
        return httpx.Response(200, content=text, headers={"content-type": "text/event-stream"})

    rec, reader = run_async(handler, expect_tokens=2, index=7)
    assert rec.ok, rec.error
    assert (rec.status, rec.tokens, rec.usage_tokens, rec.prompt_tokens, rec.index) == (200, 2, 2, 3, 7)
    assert rec.ttft_ms >= 0 and rec.e2e_ms >= rec.ttft_ms and reader.ids == [1, 2] and reader.finished


def test_stream_async_fails_on_http_errors_and_lost_connections():
    rec, _ = run_async(lambda request: httpx.Response(503, text="busy"))
    assert (rec.ok, rec.status, rec.error) == (False, 503, "HTTP 503: busy")

    def refuse(request):
        raise httpx.ConnectError("refused", request=request)

    rec, _ = run_async(refuse)
    assert rec.status == 0 and rec.error == "ConnectError: refused"
