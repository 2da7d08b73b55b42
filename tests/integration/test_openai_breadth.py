"""OpenAI API breadth through the real prefill/decode path (issue 9).

Structured output, logprobs, penalties, stop token ids and tools, each through the gateway
(prefill engine → NIXL → decode engine) and, where the brief asks, decode-only: the decode
deployment called directly through a Serve handle with no handoff, so it computes the
prompt itself. The tiny model has random weights: its text is gibberish, which is fine,
since what is checked is that constraints hold and numbers agree.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import pytest
from vllm import SamplingParams
from vllm.sampling_params import StructuredOutputsParams

from cluster.protocol import finish_reason
import regex

from loadtest.measure.sse import read_events
from tests.conftest import REPO
from tests.support.integration_cluster import MODEL_NAME


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z]{1,6}$"},
        "ok": {"type": "boolean"},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "color": {"enum": ["red", "green", "blue"]},
    },
    "required": ["name", "ok", "n", "color"],
    "additionalProperties": False,
}
JSON_MAX_TOKENS = 96
PATTERN = r"[0-9]{3}-[a-z]{2,8}"
@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _handle(name: str):
    from ray import serve

    return serve.get_deployment_handle(name, app_name="tandem")


def decode_only(prompt_ids: list[int], **sampling) -> list:
    """All RequestOutputs of a request served by decode alone (handoff None: no remote prefill)."""
    import uuid

    from cluster.protocol import EngineRequest

    request = EngineRequest(f"decode-only-{uuid.uuid4().hex}", tuple(prompt_ids), SamplingParams(**sampling), tier="interactive")
    return list(_handle("interactive-decode").options(stream=True).generate.remote(request, None))


def _text(chunks) -> str:
    return "".join(c.outputs[0].text for c in chunks)


def _sse(response: httpx.Response) -> list[dict]:
    return read_events(response.iter_lines())[0]


def _chat(base_url: str, **body) -> dict:
    # The interactive tier refuses a request whose expected queue wait is over its bound
    # (429 + Retry-After); a burst of 20 meets it on a slow machine, and is retried as the
    # OpenAI SDKs do. What these tests check is the answer, not admission.
    for _ in range(20):
        resp = httpx.post(f"{base_url}/v1/chat/completions", json={"model": MODEL_NAME, **body}, timeout=180)
        if resp.status_code != 429:
            break
        time.sleep(float(resp.headers["retry-after"]))
    assert resp.status_code == 200, resp.text
    return resp.json()


def _chat_ids(tokenizer, messages: list[dict]) -> list[int]:
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(rendered, add_special_tokens=False)["input_ids"]


def _decode_stats():
    return _handle("interactive-decode").stats.remote().result()


def test_json_schema_holds_for_20_seeded_prompts_via_pd_and_decode_only(base_url, tokenizer):
    

    messages = [[{"role": "user", "content": f"Describe item number {i} as JSON."}] for i in range(20)]
    fmt = {"type": "json_schema", "json_schema": {"name": "item", "schema": SCHEMA, "strict": True}}
    before = _decode_stats()
    with ThreadPoolExecutor(20) as pool:  # all 20 at once: batched on the decode engine
        pd = list(pool.map(lambda i: _chat(base_url, messages=messages[i], response_format=fmt, seed=i,
                                           temperature=1.0, max_tokens=JSON_MAX_TOKENS), range(20)))
        after = _decode_stats()
        constraint = StructuredOutputsParams(json=SCHEMA)
        local = list(pool.map(lambda i: decode_only(_chat_ids(tokenizer, messages[i]), structured_outputs=constraint,
                                                    seed=i, temperature=1.0, max_tokens=JSON_MAX_TOKENS), range(20)))
    # The P/D answers really came through a remote prefill: decode computed no prompt token.
    assert after.prompt_tokens_transferred > before.prompt_tokens_transferred
    assert after.prompt_tokens_computed == before.prompt_tokens_computed
    answers = [(r["choices"][0]["message"]["content"], r["choices"][0]["finish_reason"]) for r in pd]
    answers += [(_text(chunks), finish_reason(chunks[-1])) for chunks in local]
    for text, finish in answers:
        assert finish == "stop", (text, finish)
        jsonschema.validate(json.loads(text), SCHEMA)
    assert len({text for text, _ in answers}) > 1  # seeds differ, so do the answers


def test_regex_holds_from_the_first_token_after_a_remote_prefill(base_url):
    body = {"model": MODEL_NAME, "prompt": "Give me a code:", "max_tokens": 24, "temperature": 1.0, "seed": 3,
            "structured_outputs": {"regex": PATTERN}, "stream": True}
    before = _decode_stats()
    with httpx.stream("POST", f"{base_url}/v1/completions", json=body, timeout=180) as s:
        assert s.status_code == 200
        events = _sse(s)
    after = _decode_stats()  # the prompt's KV came from the prefill engine: decode computed none
    assert after.prompt_tokens_transferred > before.prompt_tokens_transferred
    assert after.prompt_tokens_computed == before.prompt_tokens_computed
    deltas = [c["text"] for e in events for c in e["choices"] if c["text"]]
    assert deltas and deltas[0][0].isdigit(), deltas
    so_far = ""
    for delta in deltas:  # every prefix of the stream is a prefix of a match
        so_far += delta
        assert regex.fullmatch(PATTERN, so_far, partial=True), so_far
    assert regex.fullmatch(PATTERN, so_far), so_far

    chat = _chat(base_url, messages=[{"role": "user", "content": "Pick one."}], temperature=1.0, seed=5,
                 max_tokens=8, structured_outputs={"choice": ["alpha", "beta", "gamma"]})
    assert chat["choices"][0]["message"]["content"] in ("alpha", "beta", "gamma")
    obj = _chat(base_url, messages=[{"role": "user", "content": "JSON please."}], temperature=0, max_tokens=64,
                response_format={"type": "json_object"}, structured_outputs=None)
    if obj["choices"][0]["finish_reason"] == "stop":
        assert isinstance(json.loads(obj["choices"][0]["message"]["content"]), dict)
    else:  # cut by max_tokens: still a valid prefix of a JSON object
        assert obj["choices"][0]["message"]["content"].startswith("{")


def test_logprobs_shape_and_equal_to_decode_only(base_url):
    messages = [{"role": "user", "content": "Tell me about the sea."}]
    out = _chat(base_url, messages=messages, temperature=0, max_tokens=8, ignore_eos=True, logprobs=True,
                top_logprobs=3, return_token_ids=True)
    content = out["choices"][0]["logprobs"]["content"]
    token_ids = out["choices"][0]["token_ids"]
    assert len(content) == len(token_ids) == out["usage"]["completion_tokens"] == 8
    for entry in content:
        assert len(entry["top_logprobs"]) == 3
        assert entry["bytes"] == list(entry["token"].encode())
        assert entry["logprob"] == pytest.approx(entry["top_logprobs"][0]["logprob"], abs=1e-6)  # greedy = top-1
        assert [t["logprob"] for t in entry["top_logprobs"]] == sorted(
            (t["logprob"] for t in entry["top_logprobs"]), reverse=True)

    local = decode_only(out["prompt_token_ids"], max_tokens=8, temperature=0, ignore_eos=True, logprobs=3)
    ids = [t for c in local for t in c.outputs[0].token_ids]
    entries = [e for c in local for e in c.outputs[0].logprobs]
    assert ids == token_ids
    for token, mine, theirs in zip(ids, entries, content):
        assert mine[token].logprob == pytest.approx(theirs["logprob"], abs=1e-4)
        top = sorted((e for e in mine.values() if e.rank <= 3), key=lambda e: e.rank)
        assert [e.logprob for e in top] == pytest.approx([t["logprob"] for t in theirs["top_logprobs"]], abs=1e-4)

    body = {"model": MODEL_NAME, "prompt": "Once upon a time", "max_tokens": 6, "temperature": 0, "logprobs": 2,
            "ignore_eos": True}
    plain = httpx.post(f"{base_url}/v1/completions", json=body, timeout=120).json()["choices"][0]
    lp = plain["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == 6
    with httpx.stream("POST", f"{base_url}/v1/completions", json={**body, "stream": True}, timeout=120) as s:
        streamed = [c["logprobs"] for e in _sse(s) for c in e["choices"] if c["logprobs"]]
    assert [x for part in streamed for x in part["token_logprobs"]] == pytest.approx(lp["token_logprobs"], abs=1e-4)
    assert [x for part in streamed for x in part["text_offset"]] == lp["text_offset"]


def test_penalties_and_stop_token_ids(base_url):
    common = {"model": MODEL_NAME, "prompt": "The quick brown fox", "max_tokens": 16, "temperature": 0,
              "ignore_eos": True, "return_token_ids": True}
    url = f"{base_url}/v1/completions"
    greedy = httpx.post(url, json=common, timeout=120).json()["choices"][0]["token_ids"]
    penalized = httpx.post(url, json={**common, "frequency_penalty": 2.0, "presence_penalty": 2.0},
                           timeout=120).json()["choices"][0]["token_ids"]
    assert penalized != greedy  # the tiny model repeats itself; penalties break the runs
    assert len(set(penalized)) >= len(set(greedy))
    stop_at = greedy[3]
    stopped = httpx.post(url, json={**common, "stop_token_ids": [stop_at]}, timeout=120).json()
    choice = stopped["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["token_ids"] == greedy[: greedy.index(stop_at) + 1]


@pytest.mark.parametrize("param, value", [("logit_bias", {"5": 1}), ("n", 2), ("echo", True)])
def test_what_the_old_edge_refused_is_served_as_vllm_serves_it(base_url, param, value):
    body = {"model": MODEL_NAME, "max_tokens": 2, "prompt": "hi", param: value}
    resp = httpx.post(f"{base_url}/v1/completions", json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    assert len(resp.json()["choices"]) == (value if param == "n" else 1)


SPEC_SCRIPT = textwrap.dedent('''
    import asyncio, json, sys, uuid
    from pathlib import Path

    def main():
        from cluster.config import EngineConfig, KVTransferConfig
        from cluster.engine.base import EngineSpec
        from cluster.engine.metrics import read_vllm_metrics as _read_vllm_metrics
        from cluster.engine.vllm import VLLMEngine
        from cluster.protocol import EngineRequest
        from vllm import SamplingParams

        model, prompts = Path(sys.argv[1]), json.loads(sys.argv[2])
        engine_cfg = EngineConfig.model_validate({"kv_cache_memory_bytes": 64 << 20, "max_num_seqs": 4, "speculative_config": {
            "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}})
        spec = EngineSpec(model_path=model, served_name="spec", dtype="float32", max_model_len=512,
                          engine=engine_cfg, kv_role=None, kv=KVTransferConfig(), nixl=None, cpu_binding="0",
                          on_gpu=False, worker_id="spec")
        engine = VLLMEngine(spec)
        engine.start()

        async def run(ids):
            req = EngineRequest(uuid.uuid4().hex, tuple(ids), SamplingParams(max_tokens=24, temperature=0,
                                                                                 ignore_eos=True), tier="interactive")
            return [t for chunk in [c async for c in engine.generate(req, None)] for t in chunk.outputs[0].token_ids]

        async def all_of():
            return [await run(ids) for ids in prompts]

        try:
            outputs = asyncio.run(all_of())
            metrics = _read_vllm_metrics()
            accepted = sum(v for (name, _), v in metrics.items()
                           if "spec_decode_num_accepted_tokens" in name and name.endswith("_total"))
            print("RESULT " + json.dumps({"outputs": outputs, "accepted": accepted}))
        finally:
            engine.shutdown()

    if __name__ == "__main__":
        main()
''')


def test_ngram_speculative_decoding_gives_the_same_greedy_output(tiny_model_dir, tokenizer, tmp_path):
    """An engine with `speculative_config: {method: ngram}` in its pool config (a short-lived engine
    in a subprocess, inside the session's cluster lock) against the cluster's decode engine."""
    prompts = [tokenizer("a b c a b c a b c a b")["input_ids"],
               tokenizer("one two three one two three one two")["input_ids"]]
    script = tmp_path / "spec_check.py"
    script.write_text(SPEC_SCRIPT)
    done = subprocess.run([sys.executable, str(script), str(tiny_model_dir), json.dumps(prompts)],
                          capture_output=True, text=True, timeout=300, cwd=str(REPO),
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    result = json.loads(lines[-1][len("RESULT "):])
    assert result["accepted"] > 0  # speculation really happened
    for ids, spec_out in zip(prompts, result["outputs"]):
        plain = [t for c in decode_only(ids, max_tokens=24, temperature=0, ignore_eos=True) for t in c.outputs[0].token_ids]
        assert spec_out == plain
