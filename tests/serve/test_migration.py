"""A decode replica that dies mid-answer costs latency, not the answer (router/pd/migration.py):
through the real Serve graph, FakeEngine's `die_after_tokens` knob kills the replica's process
(os._exit) in the middle of a streamed greedy answer; the gateway continues it elsewhere, and
the client's stream is the uninterrupted answer token for token, with one usage for all of it.

It kills decode replicas, which Serve replaces: `replaces_decode` orders it after the tests
that count on both (tests/serve/conftest.py), and it waits for the pool to be whole again.
Prints the time from each kill to the client's next token (p50/max over the kills)."""

from __future__ import annotations

import json
import statistics
import time

import httpx
import pytest

from cluster.engine.fake import fake_tokens
from tests.support.closed_loop import running_replicas, wait_for
from tests.support.serve_graph import DECODE_REPLICAS, MODEL_NAME, migrations_continued

PROMPT = [17, 42, 99, 7, 250, 31, 64, 12, 88, 140, 23, 5, 77, 190, 46, 61, 33]
MAX_TOKENS = 24
TOKEN_S = 0.05
DIE_AFTER = 12  # decode tokens; the continuation has 11 left, so it never reaches the knob
KILLS = 5
DECODE = "interactive-decode"


def _stream(graph, **xargs) -> tuple[list[str], list[float], dict, str]:
    """(each chunk's text, when it came, the usage, the finish reason) of a streamed greedy answer."""
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "vllm_xargs": {"fake_token_s": TOKEN_S, **xargs}}
    texts, times, usage, finish = [], [], {}, None
    with httpx.stream("POST", f"{graph.url}/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            for choice in chunk.get("choices", ()):
                if choice["text"]:
                    texts.append(choice["text"])
                    times.append(time.monotonic())
                finish = choice.get("finish_reason") or finish
            usage = chunk.get("usage") or usage
    return texts, times, usage, finish


@pytest.mark.usefixtures("replaces_decode")
def test_a_decode_replica_killed_mid_answer_costs_latency_not_the_answer(graph):
    # Compared as one text: a chunk may carry several tokens (the decode channel merges what
    # waited while the gateway was behind: cluster/engine/outbox.py).
    expected = "".join(f"{t} " for t in fake_tokens(PROMPT, MAX_TOKENS, graph.vocab_size))
    texts, _, usage, finish = _stream(graph)  # uninterrupted
    assert "".join(texts) == expected and finish == "length"
    # Whatever broke the stream counts: the replica's death reaches the gateway as the run call's
    # ActorDiedError or as its step stream's loss, whichever comes first.
    counted_before = migrations_continued(graph)
    gaps = []
    for kill in range(KILLS):
        wait_for("both decode replicas running", lambda: running_replicas(DECODE) == DECODE_REPLICAS, 120)
        texts, times, usage, finish = _stream(graph, fake_die_after_tokens=DIE_AFTER)
        # One uninterrupted stream for the client: nothing lost, nothing twice, one usage.
        assert "".join(texts) == expected, (kill, texts)
        assert finish == "length"
        assert usage["completion_tokens"] == MAX_TOKENS and usage["prompt_tokens"] == len(PROMPT)
        # The replica died one step after its last token (the knob): from then to the next token.
        gaps.append(max(b - a for a, b in zip(times, times[1:])) - TOKEN_S)
    wait_for("every migration counted", lambda: migrations_continued(graph) - counted_before >= KILLS, 60, every_s=1)
    assert migrations_continued(graph) - counted_before == KILLS
    print(f"\n[migration] kill → next token over {KILLS} kills: p50 {statistics.median(gaps) * 1000:.0f} ms, "
          f"max {max(gaps) * 1000:.0f} ms, each {[round(g * 1000) for g in gaps]} ms (token every {TOKEN_S * 1000:.0f} ms); recomputed per migration: "
          f"the prompt + {DIE_AFTER + 1} tokens sent ({len(PROMPT) + DIE_AFTER + 1} tokens)")
    wait_for("the decode pool whole again", lambda: running_replicas(DECODE) == DECODE_REPLICAS, 120)
