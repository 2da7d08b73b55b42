"""The P/D path through the real Ray Serve graph (gateway → router → prefill → decode) with
FakeEngine in every replica: which replica did what is read from each engine's own counters
(FakeEngineStats: request ids seen, pulled, recomputed, aborted)."""

from __future__ import annotations

import json
import random
import time

import httpx
import pytest

from cluster.engine.fake import fake_tokens
from tests.support.serve_graph import DECODE_REPLICAS, MODEL_NAME, PREFILL_TIMEOUT_S, replica_stats


PROMPT = [17, 42, 99, 7, 250, 31, 64, 12, 88, 140, 23, 5, 77, 190, 46, 61, 33]  # 17 ids: 1 full block + 1


def _ids(field: str, pool: str, replicas: int) -> dict[str, set[str]]:
    """{worker_id: ids in `field`} of a pool, the NIXL warm-up's requests left out."""
    return {w: {i for i in getattr(s, field) if not i.startswith("warmup-")}
            for w, s in replica_stats(pool, replicas).items()}


def _new(after: dict[str, set[str]], before: dict[str, set[str]]) -> dict[str, set[str]]:
    return {w: ids - before.get(w, set()) for w, ids in after.items()}


def _complete(graph, prompt=PROMPT, max_tokens=6, **extra) -> dict:
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra}
    r = httpx.post(f"{graph.url}/v1/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def _expected_text(graph, prompt=PROMPT, n=6) -> str:
    return "".join(f"{t} " for t in fake_tokens(prompt, n, graph.vocab_size))


def test_a_request_is_prefilled_then_decoded_with_the_kv_pulled(graph):
    prefill_before = _ids("seen", "prefill", 1)
    pulled_before = _ids("pulled", "decode", DECODE_REPLICAS)
    answer = _complete(graph)
    assert answer["choices"][0]["text"] == _expected_text(graph)
    assert answer["choices"][0]["finish_reason"] == "length"
    (prefilled,) = _new(_ids("seen", "prefill", 1), prefill_before).values()
    pulled = _new(_ids("pulled", "decode", DECODE_REPLICAS), pulled_before)
    assert len(prefilled) == 1
    # The request prefilled is the one a decode engine pulled, on exactly one replica.
    assert sorted(ids for ids in pulled.values() if ids) == [prefilled]


def test_a_failing_prefill_hop_means_decode_recomputes_the_same_answer(graph):
    pulled_before = _ids("pulled", "decode", DECODE_REPLICAS)
    recomputed_before = _ids("recomputed", "decode", DECODE_REPLICAS)
    answer = _complete(graph, vllm_xargs={"fake_fail_prefill": 1})
    assert answer["choices"][0]["text"] == _expected_text(graph)  # latency, not a lost or changed answer
    assert not any(_new(_ids("pulled", "decode", DECODE_REPLICAS), pulled_before).values())
    recomputed = _new(_ids("recomputed", "decode", DECODE_REPLICAS), recomputed_before)
    assert sum(len(ids) for ids in recomputed.values()) == 1


def test_a_failed_kv_pull_is_counted_and_recomputed(graph):
    before = replica_stats("decode", DECODE_REPLICAS)
    answer = _complete(graph, vllm_xargs={"fake_fail_pull": 1})
    assert answer["choices"][0]["text"] == _expected_text(graph)
    after = replica_stats("decode", DECODE_REPLICAS)
    failed = sum(after[w].kv_failed_transfers - before[w].kv_failed_transfers for w in after)
    pulled = sum(after[w].kv_transfers - before[w].kv_transfers for w in after)
    assert (failed, pulled) == (1, 0)


def test_n_samples_are_pinned_to_the_one_routed_decode_replica(graph):
    seen_before = _ids("seen", "decode", DECODE_REPLICAS)
    answer = _complete(graph, n=3, max_tokens=4, temperature=1.0, seed=7)
    assert len(answer["choices"]) == 3
    new = _new(_ids("seen", "decode", DECODE_REPLICAS), seen_before)
    holders = [w for w, ids in new.items() if ids]
    assert len(holders) == 1, new  # all samples where the router sent the request
    assert sorted(i.rsplit("-s", 1)[1] for i in new[holders[0]]) == ["0", "1", "2"]


def test_a_client_that_leaves_stops_its_stream_on_the_replica_running_it(graph):
    seen_before = _ids("seen", "decode", DECODE_REPLICAS)
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 200, "temperature": 0, "stream": True,
            "vllm_xargs": {"fake_token_s": 0.1}}  # 20 s if never stopped
    with httpx.stream("POST", f"{graph.url}/v1/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        chunks = 0
        for line in r.iter_lines():
            chunks += line.startswith("data: {")
            if chunks == 2:  # the prefill's first token, then decode's: decode runs it; leave
                break
    seen = _new(_ids("seen", "decode", DECODE_REPLICAS), seen_before)
    (rid,) = set().union(*seen.values())
    (holder,) = [w for w, ids in seen.items() if rid in ids]
    deadline = time.monotonic() + 10
    while not _stopped(replica_stats("decode", DECODE_REPLICAS)[holder], rid) and time.monotonic() < deadline:
        time.sleep(0.2)
    stats = replica_stats("decode", DECODE_REPLICAS)
    # Stopped where it ran, long before 20 s: its generate stream closed by the gateway's hop
    # (which, by the engine contract in cluster/engine/base.py, aborts it in the engine) or the
    # backend's abort pinned to the holder, whichever came first. An abort never goes to a
    # replica that does not hold the request.
    assert _stopped(stats[holder], rid) and stats[holder].requests_running == 0
    assert not any(rid in s.aborted for w, s in stats.items() if w != holder)


def _stopped(stats, rid: str) -> bool:
    """The engine saw the request end early: aborted, or its stream closed before the last token."""
    return rid in stats.aborted or rid in stats.cancelled


def test_a_prefill_past_its_timeout_is_aborted_on_its_replica_and_decode_recomputes(graph):
    prefill_before = _ids("seen", "prefill", 1)
    recomputed_before = _ids("recomputed", "decode", DECODE_REPLICAS)
    started = time.monotonic()
    answer = _complete(graph, vllm_xargs={"fake_prefill_s": PREFILL_TIMEOUT_S + 1.5})
    assert PREFILL_TIMEOUT_S <= time.monotonic() - started < PREFILL_TIMEOUT_S + 1.5  # not waited out
    assert answer["choices"][0]["text"] == _expected_text(graph)
    (rid,) = set().union(*_new(_ids("seen", "prefill", 1), prefill_before).values())
    deadline = time.monotonic() + 10
    while rid not in set().union(*_ids("aborted", "prefill", 1).values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert rid in set().union(*_ids("aborted", "prefill", 1).values())  # the abort reached the prefill replica
    assert rid in set().union(*_new(_ids("recomputed", "decode", DECODE_REPLICAS), recomputed_before).values())


@pytest.mark.parametrize("stream", [False, True])
def test_a_list_of_prompts_is_answered_one_choice_each(graph, stream):
    """Four hops of one HTTP request wait on one pool at once: each must be its own request in
    Serve's router (router/pd/serve_calls.py); sharing the proxy's id, some waited forever."""
    prompts = [PROMPT, PROMPT[:9], PROMPT[:12], PROMPT[3:]]
    body = {"model": MODEL_NAME, "prompt": prompts, "max_tokens": 4, "temperature": 0, "stream": stream}
    r = httpx.post(f"{graph.url}/v1/completions", json=body, timeout=10)
    assert r.status_code == 200, r.text
    if stream:
        chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
        texts = {i: "".join(c["text"] for ch in chunks for c in ch["choices"] if c["index"] == i) for i in range(4)}
    else:
        texts = {c["index"]: c["text"] for c in r.json()["choices"]}
    assert texts == {i: _expected_text(graph, p, 4) for i, p in enumerate(prompts)}


def test_a_prompt_sharing_a_cached_prefix_is_decoded_where_the_prefix_is_cached(graph):
    """The decode engine that ran a prompt publishes its blocks (KV events, vLLM's publisher);
    the router follows them, and prompts that share the prefix go to that engine. Load alone
    would split them at random between the two idle replicas."""
    rng = random.Random(11)
    prefix = [rng.randrange(5, graph.vocab_size) for _ in range(64)]  # 4 full blocks
    seen_before = _ids("seen", "decode", DECODE_REPLICAS)
    _complete(graph, prompt=prefix, max_tokens=2)
    (holder,) = [w for w, ids in _new(_ids("seen", "decode", DECODE_REPLICAS), seen_before).items() if ids]
    time.sleep(1.0)  # the events' way: publisher → the gateway's subscriber → its prefix index
    seen_before = _ids("seen", "decode", DECODE_REPLICAS)
    for i in range(8):
        _complete(graph, prompt=prefix + [5 + i], max_tokens=2)
    new = _new(_ids("seen", "decode", DECODE_REPLICAS), seen_before)
    assert {w: len(ids) for w, ids in new.items() if ids} == {holder: 8}


@pytest.mark.parametrize("route", ["/v1/models", "/health"])
def test_the_gateway_answers_its_own_routes(graph, route):
    r = httpx.get(f"{graph.url}{route}", timeout=10)
    assert r.status_code == 200
    if route == "/v1/models":
        assert [m["id"] for m in r.json()["data"]] == [MODEL_NAME]
    else:
        assert r.json()["pools"] == {"interactive-prefill": "ready", "interactive-decode": "ready"}


def test_a_short_answer_runs_whole_on_the_prefill_replica(graph, monkeypatch):
    """The decider's "whole" path through the real prefill replica (PrefillWorker.generate),
    the request path built in this process (tests/support/pd_path.py) with an adaptive router whose
    whole-on-prefill bound is on (the graph's own gateway disaggregates always)."""
    import asyncio
    import uuid

    from vllm import SamplingParams

    from cluster.protocol import EngineRequest, new_token_ids
    from router.routing.decider import Objectives, PDDecider
    from tests.support.pd_path import TIER, in_process_path, prefill_idle, ready, record_verdicts

    verdicts = record_verdicts(monkeypatch)
    path = in_process_path(decider=PDDecider(mode="adaptive", whole_on_prefill_max_tokens=16), prefill_timeout_s=30,
                           objectives=Objectives(ttft_s=30.0, itl_s=1.0, gap_s=2.0),
                           prefill_chunk_budgets={TIER: 64})
    # 120 tokens: past what the decider keeps on decode as cheaper than the hops (rule 3).
    prompt = tuple(random.Random(7).randrange(5, graph.vocab_size) for _ in range(120))
    request = EngineRequest(f"whole-{uuid.uuid4()}", prompt, SamplingParams(max_tokens=6, temperature=0), tier=TIER)

    async def run() -> list[int]:
        await ready(path, timeout_s=30)
        await prefill_idle(path, timeout_s=30)  # the prefill-timeout test leaves a pending prompt in its stats
        return [t async for out in path.backend.generate(request) for t in new_token_ids(out)]

    decode_before = _ids("seen", "decode", DECODE_REPLICAS)
    try:
        tokens = asyncio.run(run())
    finally:
        path.router.close()
    assert [(v.path, v.reason) for v in verdicts] == [("whole", "short_output")], verdicts
    assert tokens == list(fake_tokens(prompt, 6, graph.vocab_size))
    assert request.request_id in _ids("seen", "prefill", 1).popitem()[1]
    assert not any(request.request_id in ids for ids in _new(_ids("seen", "decode", DECODE_REPLICAS),
                                                              decode_before).values())
