"""The control-plane benchmark's pure parts (loadtest/bench/control_plane_*.py): the light
client's HTTP/SSE parsing and token counting, the window's arithmetic, CPU per token by
process kind, the demanded rate, and the command line's overrides. No Ray, no server."""

import json

import pytest

from loadtest.bench import procs
from loadtest.bench.control_plane_config import (
    Variant, apply_sets, base_config, load_variants, parse_env, parse_ints, parse_set)
from loadtest.bench.control_plane_sse import (
    ProtocolError, RequestState, ResponseParser, Tally, Window, slow_event, usage_tokens)
from loadtest.bench.control_plane_stats import (
    DECODE, GATEWAY, OTHER, PREFILL, PROXY, TANDEM_KINDS, TOTAL, bench_kind, cell_figures, client_summary,
    cpu_by_kind, cpu_figures, demanded_tok_s)


# ---------------------------------------------------------------- HTTP/1.1 + SSE parsing

def event(completion_tokens=None, content="7 ", error=None) -> bytes:
    if error is not None:
        chunk = {"error": {"message": error, "type": "BadRequestError", "code": 400}}
    else:
        chunk = {"id": "c", "object": "chat.completion.chunk",
                 "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}]}
        if completion_tokens is not None:
            chunk["usage"] = {"prompt_tokens": 9, "completion_tokens": completion_tokens,
                              "total_tokens": 9 + completion_tokens}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def chunked(*pieces: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


HEAD_200 = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def collect(response: bytes, split_every: int) -> tuple[ResponseParser, list[bytes]]:
    got = []
    parser = ResponseParser(lambda payload, now: got.append(payload))
    for i in range(0, len(response), split_every):
        parser.feed(response[i:i + split_every], float(i))
    return parser, got


@pytest.mark.parametrize("split_every", [1, 2, 3, 7, 64, 100000])
def test_chunked_sse_is_read_whole_however_the_bytes_are_split(split_every):
    body = chunked(event(0, content=""), event(1), event(3) + event(4), b"data: [DONE]\n\n")
    parser, got = collect(HEAD_200 + body, split_every)
    assert parser.status == 200 and parser.complete and parser.keep_alive
    assert [usage_tokens(p) for p in got[:-1]] == [0, 1, 3, 4]
    assert got[-1] == b"[DONE]"


def test_an_sse_event_split_across_chunks_and_keepalive_comments():
    whole = event(2)
    body = chunked(b": keep-alive\n\n" + whole[:10], whole[10:], b"data: [DONE]\n\n")
    _, got = collect(HEAD_200 + body, 5)
    assert [usage_tokens(p) for p in got[:-1]] == [2] and got[-1] == b"[DONE]"


def test_an_error_status_keeps_its_body_and_a_sized_body_ends():
    body = b'{"error": {"message": "too busy"}}'
    response = b"HTTP/1.1 429 Too Many Requests\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
    parser, got = collect(response, 4)
    assert parser.status == 429 and parser.complete and not parser.keep_alive
    assert parser.error_body == body and got == []


def test_a_bad_status_line_and_a_bad_chunk_size_are_protocol_errors():
    with pytest.raises(ProtocolError):
        ResponseParser(lambda *_: None).feed(b"SSH-2.0-OpenSSH\r\n\r\n", 0.0)
    with pytest.raises(ProtocolError):
        ResponseParser(lambda *_: None).feed(HEAD_200 + b"zz\r\n", 0.0)


def test_usage_tokens_reads_the_count_and_content_cannot_fake_it():
    assert usage_tokens(event(42)[6:].strip()) == 42
    assert usage_tokens(b'{"usage": {"completion_tokens": 5}}') == 5
    assert usage_tokens(event(None, content='"completion_tokens":99')[6:].strip()) is None
    assert slow_event(event(None, content="hi")[6:].strip()) == (1, "")
    tokens, error = slow_event(event(error="boom")[6:].strip())
    assert tokens == 0 and "boom" in error
    assert slow_event(b"not json")[1].startswith("malformed event")


# ---------------------------------------------------------------- the window's accounting

def feed(state: RequestState, events: list[tuple[float, bytes]]) -> None:
    for now, raw in events:
        state.on_data(raw[6:].strip(), now)


def test_tokens_gaps_and_ttft_count_inside_the_window_only():
    tally = Tally(window=Window(start=10.0, end=20.0))
    state = RequestState(tally, t_send=9.0, expect_tokens=6)
    feed(state, [(9.5, event(0, content="")),  # role-only opening: no token, no event
                 (9.8, event(1)),  # first token before the window: not counted, not a TTFT
                 (10.2, event(2)),  # its gap began before the window: not counted
                 (10.5, event(4)),  # two tokens in one event: one gap, two tokens
                 (11.0, event(5)), (11.0, event(5, content="")),  # usage only: nothing
                 (20.5, event(6)),  # after the window
                 (20.6, b"data: [DONE]\n\n")])
    assert tally.tokens == 4 and tally.events == 3
    assert tally.gaps_ms == pytest.approx([300.0, 500.0])
    assert tally.ttfts_ms == []
    assert state.finish(20.7, 200) and tally.completed_outside == 1 and tally.completed == 0


def test_ttft_of_a_request_whose_first_token_is_in_the_window():
    tally = Tally(window=Window(start=0.0, end=100.0))
    state = RequestState(tally, t_send=1.0, expect_tokens=2)
    feed(state, [(1.25, event(1)), (1.3, event(2)), (1.31, b"data: [DONE]\n\n")])
    assert tally.ttfts_ms == pytest.approx([250.0]) and tally.gaps_ms == pytest.approx([50.0])
    assert state.finish(1.32, 200) and tally.completed == 1 and tally.errors == 0


@pytest.mark.parametrize("events,status,why", [
    ([event(1), b"data: [DONE]\n\n"], 200, "short answer: 1 of 2"),
    ([event(1), event(2)], 200, "without [DONE]"),
    ([event(1), event(error="engine dead")], 200, "engine dead"),
    ([], 429, "HTTP 429"),
])
def test_failures_are_counted_with_a_sample(events, status, why):
    tally = Tally(window=Window(start=0.0, end=100.0))
    state = RequestState(tally, 1.0, expect_tokens=2)
    feed(state, [(1.1 + i / 10, e) for i, e in enumerate(events)])
    assert not state.finish(2.0, status, body=b"busy")
    assert tally.errors == 1 and tally.completed == 0 and why in tally.error_samples[0]


def test_a_warm_up_failure_is_counted_apart():
    tally = Tally(window=Window(start=10.0, end=20.0))
    RequestState(tally, 1.0, 2).finish(2.0, 0, failure="ConnectionError: refused")
    assert tally.errors == 0 and tally.errors_outside == 1


def test_client_summary_percentiles_and_rate():
    tally = Tally(window=Window(start=0.0, end=2.0), tokens=400, events=200,
                  gaps_ms=[float(g) for g in range(1, 101)], ttfts_ms=[10.0, 30.0], completed=3)
    s = client_summary(tally)
    assert s["delivered_tok_s"] == 200.0 and s["tokens_per_event"] == 2.0
    assert s["token_gap"]["p50_ms"] == 50.5 and s["token_gap"]["p99_ms"] == 99.0 and s["token_gap"]["max_ms"] == 100
    assert s["ttft"]["p50_ms"] == 20.0 and s["ttft"]["n"] == 2
    assert s["requests"]["completed"] == 3 and s["requests"]["errors"] == 0


# ---------------------------------------------------------------- CPU per token, demand

@pytest.mark.parametrize("kind,role,expected", [
    (procs.GATEWAY, None, GATEWAY),
    (procs.PROXY, None, PROXY),
    (procs.ENGINE_REPLICA, "interactive-prefill", PREFILL),
    (procs.ENGINE_REPLICA, "batch-decode", DECODE),
    (procs.ENGINE_CORE, "interactive-decode", "vLLM engine"),
    (procs.API_SERVER, None, "vLLM API server"),
    (procs.RAY_CORE, None, "Ray core"),
    (procs.DRIVER, None, OTHER),
    (procs.OTHER, None, OTHER),
])
def test_bench_kinds(kind, role, expected):
    assert bench_kind(kind, role) == expected


def test_cpu_per_token_by_kind_and_total():
    kind_of = {1: GATEWAY, 2: PROXY, 3: DECODE, 4: PREFILL, 5: OTHER}
    cpu = cpu_by_kind({1: 3.0, 2: 1.0, 3: 1.0, 4: 0.2, 5: 0.3, 6: 0.1}, kind_of)
    assert cpu[OTHER] == pytest.approx(0.4)  # pid 6: no kind known, other
    # 10 s window, 1,000 tokens/s: gateway 0.3 cores = 0.3 ms per token.
    fig = cpu_figures(cpu, 10.0, 1000.0, TANDEM_KINDS)
    assert fig["cores_busy"][GATEWAY] == 0.3 and fig["cpu_ms_per_token"][GATEWAY] == pytest.approx(0.3)
    assert fig["cpu_ms_per_token"]["Serve controller"] == 0.0
    assert fig["cpu_ms_per_token"][TOTAL] == pytest.approx(0.56)
    assert cpu_figures(cpu, 10.0, None, TANDEM_KINDS)["cpu_ms_per_token"][TOTAL] is None
    stray = cpu_figures({"vLLM engine": 1.0, OTHER: 1.0}, 1.0, 1000.0, TANDEM_KINDS)["cpu_ms_per_token"]
    assert stray[OTHER] == 2.0 and stray[TOTAL] == 2.0 and "vLLM engine" not in stray


def test_demanded_rate_and_a_whole_cell():
    assert demanded_tok_s(128, 0.02) == pytest.approx(6400) and demanded_tok_s(32, None) is None
    client = {"client": "x", "client_cpu_s": 2.0, "cpu_s_by_pid": {"7": 5.0}, "machine_busy_s": 19.0,
              "steal_s": 0.5, **client_summary(
                  Tally(window=Window(0.0, 10.0), tokens=10000, events=10000, gaps_ms=[20.0] * 10))}
    cell = cell_figures(32, 0.02, client, {GATEWAY: 5.0}, TANDEM_KINDS)
    assert cell["demanded_tok_s"] == 1600.0 and cell["delivered_tok_s"] == 1000.0
    assert cell["delivered_over_demanded"] == 0.625 and cell["pace_ms"] == 20.0
    assert cell["cpu_ms_per_token"][GATEWAY] == 0.5 and cell["load_generator"]["cpu_ms_per_token"] == 0.2
    assert cell["machine"] == {"busy_cores": 1.9, "other_work_cores": 1.2, "steal_cores": 0.05}
    assert not {"client", "client_cpu_s", "cpu_s_by_pid", "machine_busy_s"} & set(cell)


def test_gaps_of_events_in_one_read_are_zero_and_counted():
    s = client_summary(Tally(window=Window(0.0, 1.0), tokens=5, events=5, gaps_ms=[0.0, 0.0, 20.0, 0.0]))
    assert s["token_gap"]["same_read_share"] == 0.75 and s["token_gap"]["p50_ms"] == 0.0


# ---------------------------------------------------------------- overrides

def test_set_values_are_yaml_and_paths_dotted():
    assert parse_set("gateway.replicas=2") == ("gateway.replicas", 2)
    assert parse_set("routing.disaggregation=adaptive") == ("routing.disaggregation", "adaptive")
    assert parse_set("a.b=null") == ("a.b", None)
    assert parse_set("a={x: 1}") == ("a", {"x": 1})
    assert parse_set("a.b=x=y") == ("a.b", "x=y")
    for bad in ("noequals", "=1", "a..b=1"):
        with pytest.raises(ValueError):
            parse_set(bad)
    assert parse_env("RAY_SERVE_THROUGHPUT_OPTIMIZED=1") == ("RAY_SERVE_THROUGHPUT_OPTIMIZED", "1")
    with pytest.raises(ValueError):
        parse_env("1BAD=x")


def test_apply_sets_in_order_without_touching_the_base(tmp_path):
    base = base_config(tmp_path, 8000, 8080, max_streams=512, max_model_len=512)
    out = apply_sets(base, (("tiers.interactive.decode.replicas", 2), ("gateway.extra.deep", True),
                            ("tiers.interactive.decode.replicas", 3)))
    assert out["tiers"]["interactive"]["decode"]["replicas"] == 3 and out["gateway"]["extra"] == {"deep": True}
    assert base["tiers"]["interactive"]["decode"]["replicas"] == 1 and "extra" not in base["gateway"]
    with pytest.raises(ValueError, match="not a mapping"):
        apply_sets(base, (("gateway.port.x", 1),))


def test_the_base_config_validates_and_leaves_room_for_every_stream(tmp_path):
    from cluster.config import ClusterConfig

    cfg = ClusterConfig.model_validate(base_config(tmp_path, 8000, 8080, max_streams=2048, max_model_len=512))
    tier = cfg.tiers["interactive"]
    assert tier.admission.max_running >= 2048 and tier.decode.engine.max_num_seqs * 2 >= 2048
    assert cfg.routing.disaggregation == "always" and tier.prefill.num_cpus == 0 and tier.decode.replicas == 1


def test_variants_file_and_the_command_lines_base(tmp_path):
    path = tmp_path / "v.yaml"
    path.write_text("fast:\n  ray_env: {RAY_SERVE_THROUGHPUT_OPTIMIZED: 1}\n  set: {gateway.port: 9000}\nplain:\n")
    fast, plain = load_variants(path)
    assert fast == Variant("fast", (("gateway.port", 9000),), (("RAY_SERVE_THROUGHPUT_OPTIMIZED", "1"),))
    assert plain == Variant("plain")
    merged = fast.with_base((("gateway.port", 1),), (("A", "b"),))
    assert apply_sets({}, merged.sets) == {"gateway": {"port": 9000}} and dict(merged.ray_env)["A"] == "b"
    path.write_text("vllm: {}\n")
    with pytest.raises(ValueError):
        load_variants(path)
    assert parse_ints("32, 128,512") == (32, 128, 512)


def test_cpu_watch_reads_live_processes_and_skips_gone_ones():
    import os

    from loadtest.bench.control_plane_client import CpuWatch

    watch = CpuWatch([os.getpid(), 2 ** 22 + 12345])  # above Linux's pid_max: no such process
    first = watch.read()
    sum(range(200000))
    assert set(first) == {os.getpid()} and watch.read()[os.getpid()] >= first[os.getpid()]


# ---------------------------------------------------------------- the client against a fake server

def serve_sse(tokens: int, drop_after: int | None = None):
    """A keep-alive HTTP/1.1 server streaming `tokens` content events per request (usage on
    each), closing the connection mid-answer after `drop_after` events when set."""
    import asyncio

    async def handle(reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                writer.write(HEAD_200)
                for i in range(tokens + 1):
                    if drop_after is not None and i > drop_after:
                        writer.close()
                        return
                    writer.write(chunked(event(i, content="" if i == 0 else "7 "))[:-5])  # no terminator yet
                    await asyncio.sleep(0.002)
                writer.write(chunked(b"data: [DONE]\n\n"))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    return handle


def run_client(handle, streams=3, max_tokens=8):
    import argparse
    import asyncio

    from loadtest.bench.control_plane_client import run

    async def main():
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        args = argparse.Namespace(url=f"http://127.0.0.1:{port}", model="m", streams=streams, warmup_s=0.2,
                                  duration_s=0.5, max_tokens=max_tokens, request_timeout_s=5, progress_s=5,
                                  cpu_pids=[])
        async with server:
            return await asyncio.wait_for(run(args), 20)

    return asyncio.run(main())


def test_the_client_streams_closed_loops_over_keep_alive_connections():
    result = run_client(serve_sse(tokens=8))
    requests = result["requests"]
    assert requests["errors"] == 0 and requests["errors_outside_window"] == 0, requests["error_samples"]
    # Requests that ended in the window began before it (one per stream at most) with some tokens outside.
    assert requests["completed"] > 3 and result["tokens"] >= 8 * (requests["completed"] - 3)
    assert result["tokens_per_event"] == 1.0 and result["token_gap"]["n"] > 0
    assert result["window_s"] == pytest.approx(0.5, abs=0.2) and "client_cpu_s" in result


def test_the_client_counts_a_server_dropping_streams_and_still_ends():
    result = run_client(serve_sse(tokens=8, drop_after=3))
    requests = result["requests"]
    assert requests["completed"] == 0 and requests["errors"] > 0
    assert any("ConnectionError" in e for e in requests["error_samples"])
