"""First-token reuse on the real cluster (kv_transfer/first_token.py): the prefill engine's
token is the answer's first, decode continues after it, and every request answers exactly
what one engine alone answers: the decode engine serving it with no handoff is the reference.

Greedy equality with transformers, streaming and not, is test_walking_cluster.py's (those
requests take the reuse path by default); here: the counters that show which path a
request took, and the requests whose first token has something special about it."""

from __future__ import annotations

import uuid

import httpx
import pytest
from vllm import SamplingParams
from vllm.sampling_params import StructuredOutputsParams

from cluster.protocol import EngineRequest, finish_reason
from tests.support.integration_cluster import MODEL_NAME, metric, replica_stats, wait_for_metric


PROMPT = "Prefill samples the first token, and decode carries on from there with"
DECODE = "interactive-decode"


def _decode_handle():
    from ray import serve

    return serve.get_deployment_handle(DECODE, app_name="tandem")


def alone(prompt_ids: list[int], sampling: SamplingParams) -> tuple[list[int], str, list]:
    """The decode engine computing the request by itself: what a single engine answers."""
    request = EngineRequest(f"single-{uuid.uuid4()}", tuple(prompt_ids), sampling, tier="interactive")
    ids, text, logprobs, finish = [], "", [], None
    for chunk in _decode_handle().options(stream=True).generate.remote(request, None):
        ids += chunk.outputs[0].token_ids
        text += chunk.outputs[0].text
        logprobs += chunk.outputs[0].logprobs or []
        finish = finish_reason(chunk) or finish
    return ids, text, logprobs, finish


def complete(base_url: str, **body) -> dict:
    resp = httpx.post(f"{base_url}/v1/completions", timeout=120,
                      json={"model": MODEL_NAME, "prompt": PROMPT, "return_token_ids": True, **body})
    assert resp.status_code == 200, resp.text
    return resp.json()


def first_token_count(path: str, reason: str = "") -> float:
    return metric("ray_tandem_first_token_total", path=path, reason=reason)


def counted(before: float, path: str, reason: str = "") -> None:
    """The counter went past `before` (Ray exports the gateway's metrics every second)."""
    wait_for_metric("ray_tandem_first_token_total", before + 1, path=path, reason=reason)


def test_greedy_reuses_the_prefill_token_and_decode_computes_only_that_token(base_url):
    prompt = "The prefill computes the whole prompt and samples its first token. " * 5
    reused_before = first_token_count("prefill")
    before = next(iter(replica_stats(DECODE, 1).values()))
    out = httpx.post(f"{base_url}/v1/completions", timeout=120, json={
        "model": MODEL_NAME, "prompt": prompt, "max_tokens": 6, "temperature": 0, "ignore_eos": True,
        "return_token_ids": True}).json()
    after = next(iter(replica_stats(DECODE, 1).values()))
    n = out["usage"]["prompt_tokens"]
    assert out["usage"]["completion_tokens"] == 6 == len(out["choices"][0]["token_ids"])
    # Decode pulled the prompt's KV and computed one token: the reused first token, which it
    # holds as the last token of its prompt (kv_transfer/first_token.py).
    assert after.prompt_tokens_transferred - before.prompt_tokens_transferred == n
    assert after.prompt_tokens_computed - before.prompt_tokens_computed == 1
    ids, text, _, finish = alone(out["choices"][0]["prompt_token_ids"], SamplingParams(max_tokens=6, temperature=0,
                                                                           ignore_eos=True))
    assert out["choices"][0]["token_ids"] == ids and out["choices"][0]["text"] == text
    counted(reused_before, "prefill")


def test_a_stop_on_the_first_token_ends_the_answer_on_the_prefill(base_url):
    greedy = complete(base_url, max_tokens=4, temperature=0)
    first = greedy["choices"][0]["token_ids"][0]
    out = complete(base_url, max_tokens=4, temperature=0, stop_token_ids=[first])
    ids, text, _, finish = alone(out["choices"][0]["prompt_token_ids"], SamplingParams(max_tokens=4, temperature=0,
                                                                           stop_token_ids=[first]))
    assert out["choices"][0]["finish_reason"] == finish == "stop"
    assert out["choices"][0]["token_ids"] == ids and out["choices"][0]["text"] == text
    assert out["usage"]["completion_tokens"] == 1

    with httpx.stream("POST", f"{base_url}/v1/completions", timeout=120, json={
            "model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 4, "temperature": 0,
            "stop_token_ids": [first], "stream": True}) as s:
        lines = [line for line in s.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" and '"finish_reason":"stop"' in lines[-2]


def test_logprobs_of_the_reused_token_and_after_equal_one_engines(base_url):
    out = complete(base_url, max_tokens=5, temperature=0, logprobs=3)
    ids, _, logprobs, _ = alone(out["choices"][0]["prompt_token_ids"], SamplingParams(max_tokens=5, temperature=0, logprobs=3))
    got = out["choices"][0]["logprobs"]
    assert out["choices"][0]["token_ids"] == ids
    assert got["token_logprobs"] == pytest.approx([lp[t].logprob for t, lp in zip(ids, logprobs)], abs=1e-4)
    # The completions format keys the top tokens by text (two tokens may share one): build the
    # reference the same way, from vLLM's per-position {token id: Logprob} (rank 1..3).
    # Texts two top tokens share are compared by presence only (which one's logprob the dict keeps
    # is the response builder's choice).
    for top, lp in zip(got["top_logprobs"], logprobs):
        entries = [e for e in lp.values() if e.rank <= 3]
        texts = [e.decoded_token for e in entries]
        assert sorted(top) == sorted(set(texts))
        for e in entries:
            if texts.count(e.decoded_token) == 1:
                assert top[e.decoded_token] == pytest.approx(e.logprob, abs=1e-4)


def test_a_regex_constraint_falls_back_and_equals_one_engine(base_url):
    before = first_token_count("decode", "structured_output")
    out = complete(base_url, max_tokens=8, temperature=0, structured_outputs={"regex": "[a-z]{3} [0-9]{2}"})
    ids, text, _, _ = alone(out["choices"][0]["prompt_token_ids"], SamplingParams(
        max_tokens=8, temperature=0, structured_outputs=StructuredOutputsParams(regex="[a-z]{3} [0-9]{2}")))
    assert out["choices"][0]["text"] == text and out["choices"][0]["token_ids"] == ids
    counted(before, "decode", "structured_output")


def test_a_seed_with_sampling_falls_back_and_equals_one_engine(base_url):
    before = first_token_count("decode", "seeded_sampling")
    out = complete(base_url, max_tokens=8, temperature=0.9, seed=11, ignore_eos=True)
    ids, text, _, _ = alone(out["choices"][0]["prompt_token_ids"], SamplingParams(max_tokens=8, temperature=0.9, seed=11,
                                                                      ignore_eos=True))
    assert out["choices"][0]["token_ids"] == ids and out["choices"][0]["text"] == text
    counted(before, "decode", "seeded_sampling")
