"""Workload generation (determinism, exact token counts), trace parsing, load files and the
report (loadtest/workloads.py, spec.py, report.py). No Locust run, no server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from loadtest.__main__ import locust_command, main
from loadtest.report import write_report
from loadtest.measure.record import RequestRecord, Samples
from loadtest.measure.slo import SLO, evaluate
from loadtest.meter import StreamMeter
from loadtest.spec import LoadSpec, TokenizerVocab
from loadtest.workloads import TOOLS, AgentShape, Mix, Request, Shape, Trace, TraceSpec, WorkloadSpec, agent_prefix, parse_trace

REPO = Path(__file__).resolve().parents[2]
SLO_DIR = REPO / "loadtest" / "slo"


@pytest.fixture(scope="module")
def vocab(tiny_model_dir) -> TokenizerVocab:
    return TokenizerVocab(tiny_model_dir)


SPEC = WorkloadSpec(
    seed=5,
    chat=Shape(weight=3, prompt_tokens=40, output_tokens=20, spread=0.25),
    agent=AgentShape(weight=2, system_tokens=120, turn_tokens=10, turns=3, output_tokens=8),
    summarize=Shape(weight=1, prompt_tokens=300, output_tokens=4),
    batch=Shape(weight=1, prompt_tokens=20, output_tokens=64, tier="batch"),
)


def drive(mix: Mix, n: int) -> list[Request]:
    out = []
    for _ in range(n):
        req = mix.next()
        out.append(req)
        mix.observe(tuple(range(100, 100 + req.output_tokens)))  # a stand-in answer
    return out


def test_same_seed_same_requests(vocab):
    assert drive(Mix(SPEC, vocab, user=0), 40) == drive(Mix(SPEC, vocab, user=0), 40)


def test_users_and_seeds_differ(vocab):
    a = drive(Mix(SPEC, vocab, user=0), 20)
    assert a != drive(Mix(SPEC, vocab, user=1), 20)
    assert a != drive(Mix(SPEC.model_copy(update={"seed": 6}), vocab, user=0), 20)


def test_weights_and_exact_lengths(vocab):
    reqs = drive(Mix(SPEC, vocab, user=3), 700)
    counts = {k: sum(r.workload == k for r in reqs) for k in ("chat", "agent", "summarize", "batch")}
    assert 250 < counts["chat"] < 350 and 150 < counts["agent"] < 250  # 3/7 and 2/7 of 700
    ordinary = set(vocab.ids())
    for r in reqs:
        if r.workload == "summarize":
            assert len(r.prompt_ids) == 300 and r.output_tokens == 4
        if r.workload == "chat":
            assert 30 <= len(r.prompt_ids) <= 50 and 15 <= r.output_tokens <= 25
        if r.workload == "batch":
            assert r.tier == "batch" and r.output_tokens == 64
        assert ordinary.issuperset(r.prompt_ids[:5])  # never a special token in filler


def test_agent_conversations_share_the_prefix_and_grow(vocab):
    spec = WorkloadSpec(seed=1, agent=AgentShape(system_tokens=120, turn_tokens=10, turns=3, output_tokens=8))
    prefix = agent_prefix(spec.agent, vocab, 1)
    assert len(prefix) == 120
    mix_a, mix_b = Mix(spec, vocab, 0), Mix(spec, vocab, 1)
    first = mix_a.next()
    assert first.prompt_ids[:120] == prefix == mix_b.next().prompt_ids[:120]  # shared across users
    answer = tuple(range(200, 208))
    mix_a.observe(answer)
    second = mix_a.next()
    assert second.prompt_ids[: len(first.prompt_ids) + 8] == first.prompt_ids + answer
    assert len(second.prompt_ids) == 120 + 10 + 8 + 10
    mix_a.observe(answer)
    third = mix_a.next()
    assert len(third.prompt_ids) == 120 + 3 * 10 + 2 * 8
    mix_a.observe(answer)
    assert len(mix_a.next().prompt_ids) == 130  # a new conversation after `turns` turns


def test_tool_schema_tokens_are_in_the_agent_prefix(vocab):
    spec = AgentShape(system_tokens=400, turn_tokens=1, output_tokens=1)
    tools = vocab.encode("\nTools:\n" + json.dumps(TOOLS))
    prefix = agent_prefix(spec, vocab, 0)
    assert len(prefix) == 400 and prefix[-len(tools):] == tuple(tools[:400])


def test_workload_spec_needs_one_source():
    with pytest.raises(ValidationError, match="at least one"):
        WorkloadSpec()
    with pytest.raises(ValidationError, match="either a trace"):
        WorkloadSpec(chat=Shape(prompt_tokens=1, output_tokens=1), trace=TraceSpec(path=Path("t.jsonl")))


def test_parse_trace_both_formats_sorted_and_shifted():
    lines = ['{"arrival_s": 2.5, "prompt_tokens": 10, "output_tokens": 3}', "",
             '{"timestamp": 1000, "input_length": 7, "output_length": 2, "hash_ids": [1]}']
    entries = parse_trace(lines)
    assert [(e.arrival_s, e.prompt_tokens, e.output_tokens) for e in entries] == [(0.0, 7, 2), (1.5, 10, 3)]


@pytest.mark.parametrize("line, message", [
    ("not json", "line 1: not JSON"),
    ("[1, 2]", "expected a JSON object"),
    ('{"arrival_s": 0, "output_tokens": 3}', "missing prompt_tokens or input_length"),
    ('{"arrival_s": -1, "prompt_tokens": 3, "output_tokens": 3}', "non-negative"),
    ('{"arrival_s": 0, "prompt_tokens": 0, "output_tokens": 3}', "at least 1"),
])
def test_parse_trace_errors_name_the_line(line, message):
    with pytest.raises(ValueError, match=message):
        parse_trace([line])
    with pytest.raises(ValueError, match="no requests"):
        parse_trace(["", " "])


def test_trace_replay_is_seeded_and_loops(vocab):
    entries = parse_trace(['{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 2}',
                           '{"arrival_s": 1, "prompt_tokens": 9, "output_tokens": 4}'])
    spec = TraceSpec(path=Path("x"), time_scale=0.5)
    a, b = Trace(spec, entries, vocab, 3), Trace(spec, entries, vocab, 3)
    taken = [a.take() for _ in range(4)]
    assert taken == [b.take() for _ in range(4)]
    assert [t for t, _ in taken] == [0.0, 0.5, 1.0, 1.5]  # period 2 s, scaled by 0.5
    assert [len(r.prompt_ids) for _, r in taken] == [5, 9, 5, 9]
    assert taken[0][1].prompt_ids != taken[2][1].prompt_ids  # each arrival its own prompt


def test_shipped_load_files_are_valid():
    for path in sorted(SLO_DIR.glob("*.yaml")):
        spec = LoadSpec.load(path)
        assert spec.users >= 1, path
    trace = LoadSpec.load(SLO_DIR / "trace-tiny.yaml").workload.trace
    assert trace is not None and trace.path.is_file()
    assert len(parse_trace(trace.path.read_text().splitlines())) == 40


def test_load_file_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nusers: 0\nduration_s: 1\nworkload: {chat: {prompt_tokens: 1, output_tokens: 1}}\nslo: {}\n")
    with pytest.raises(ValueError, match="bad.yaml is not a valid load file"):
        LoadSpec.load(bad)
    assert main(["--host", "http://x", "--slo", str(bad)]) == 2


def test_cli_builds_a_headless_locust_run(tmp_path):
    import argparse

    spec = LoadSpec.load(SLO_DIR / "cpu-tiny.yaml")
    args = argparse.Namespace(host="http://h:1", slo=SLO_DIR / "cpu-tiny.yaml", users=0, duration=0,
                              tokenizer=tmp_path, model="", api_key="k", report_dir=tmp_path / "r",
                              progress_s=5.0, web=False)
    cmd = locust_command(args, spec)
    joined = " ".join(cmd)
    assert "-u 4 -r 4" in joined and "-t 20s" in joined and "--headless" in cmd and "--api-key k" in joined
    assert "--headless" not in locust_command(argparse.Namespace(**{**vars(args), "web": True}), spec)


def sse(obj) -> bytes:
    return b"data: " + json.dumps(obj).encode()


def chunk(ids) -> bytes:
    return sse({"choices": [{"index": 0, "text": "x", "token_ids": list(ids), "finish_reason": None}]})


def test_meter_measures_ttft_every_gap_and_rate():
    req = Request("chat", (1, 2, 3), 5, "interactive")
    m = StreamMeter(req, t_send=10.0, t0=9.0)
    for line, now in [(b"", 10.05), (chunk([7]), 10.1), (chunk([8]), 10.12),
                      (chunk([9, 10]), 10.16),  # two tokens after a 40 ms gap: 2 gaps of 20 ms
                      (chunk([11]), 10.18), (sse({"choices": [], "usage": {"prompt_tokens": 3}}), 10.19)]:
        assert m.feed(line, now)
    assert not m.feed(b"data: [DONE]", 10.2)
    r = m.record(10.2)
    assert r.ok, r.error
    assert r.start_s == pytest.approx(1.0) and r.ttft_ms == pytest.approx(100.0) and r.e2e_ms == pytest.approx(200.0)
    assert r.itl_ms == pytest.approx((20.0, 20.0, 20.0, 20.0))
    assert r.tokens_per_s == pytest.approx(4 / 0.1)
    assert m.ids == [7, 8, 9, 10, 11]


def test_meter_fails_short_miscounted_or_broken_streams():
    req = Request("chat", (1, 2, 3), 2, "interactive")

    def run(lines):
        m = StreamMeter(req, 0.0, 0.0)
        for i, line in enumerate(lines):
            if not m.feed(line, 0.1 * (i + 1)):
                break
        return m.record(1.0)

    assert run([chunk([1]), chunk([2]), b"data: [DONE]"]).ok
    assert "without [DONE]" in run([chunk([1]), chunk([2])]).error
    assert "got 1 of 2" in run([chunk([1]), b"data: [DONE]"]).error
    assert "counted 5 prompt tokens" in run([chunk([1, 2]), sse({"choices": [], "usage": {"prompt_tokens": 5}}),
                                             b"data: [DONE]"]).error
    assert "error event: boom" in run([chunk([1]), sse({"error": {"message": "boom"}})]).error
    assert not run([]).ok


def test_report_files(tmp_path):
    s = Samples()
    for i in range(20):
        s.add(RequestRecord(start_s=i * 0.5, workload="chat" if i % 2 else "agent", tier="interactive",
                            prompt_tokens=10, ttft_ms=100.0 + i, e2e_ms=200.0 + i,
                            token_gaps_ms=(20.0, 25.0, 30.0, 25.0)))
    s.add(RequestRecord(start_s=3.0, workload="chat", tier="interactive", prompt_tokens=10, error="HTTP 503: busy"))
    slo = SLO(ttft_ms={"p95": 110})
    page = write_report(tmp_path, "t", s, slo, evaluate(slo, s))
    text = page.read_text()
    assert "SLO FAILED" in text and "ttft_ms p95 &lt;= 110" in text and "latency.png" in text
    assert (tmp_path / "latency.png").read_bytes()[:4] == b"\x89PNG"
    rows = (tmp_path / "requests.csv").read_text().splitlines()
    assert len(rows) == 22 and "HTTP 503: busy" in rows[-1]
    summary = (tmp_path / "summary.csv").read_text()
    assert "all,ttft_ms,20," in summary and "agent,itl_ms,40," in summary
    assert "FAIL" in (tmp_path / "slo.csv").read_text()
