"""LoRA adapters through the P/D path on real engines (model.lora_adapters, issue 31). The
session's cluster and the direct vLLM server serve the same two adapters of the tiny model
(tests/support/integration_cluster.py); compat_corpus/lora.json checks their answers against
plain vLLM, greedy text for text. Here: the adapter's KV crosses between the pools over NIXL,
the router hashes an adapter's prompt exactly as the engines do (its KV events match), and KV
computed with one adapter is never continued under another."""

from __future__ import annotations

import random
import time
import uuid

import httpx
from vllm import SamplingParams

from cluster.protocol import Adapter, EngineRequest
from tests.integration.test_tracing import traced_headers
from tests.support.integration_cluster import LORA_SEEDS, MODEL_NAME, lora_adapters, metric, replica_stats

DECODE = "interactive-decode"
ADAPTER = "tiny-lora-a"


def _traced_completion(base_url: str, otlp_receiver, model: str, prompt: str) -> tuple[str, dict]:
    """(text, {span name: span}) of one traced greedy completion."""
    trace_id, _, headers = traced_headers()
    r = httpx.post(f"{base_url}/v1/completions", headers=headers, timeout=120,
                   json={"model": model, "prompt": prompt, "max_tokens": 8, "temperature": 0})
    assert r.status_code == 200, r.text
    want = {"POST /v1/completions": 1, "tandem.decode": 1, "llm_request": 2}
    spans = otlp_receiver.trace(trace_id, want)
    assert all(len(spans.get(name, ())) >= n for name, n in want.items()), sorted(spans)
    return r.json()["choices"][0]["text"], {name: found[0] for name, found in spans.items()}


def test_an_adapters_prompt_is_pulled_over_nixl_and_found_again_by_the_router(base_url, otlp_receiver):
    # A prompt of several full blocks, new to every engine.
    prompt = " ".join(random.Random(time.time_ns()).choice(["sea", "cat", "road", "sun", "bird"]) for _ in range(120))
    first_text, first = _traced_completion(base_url, otlp_receiver, ADAPTER, prompt)
    assert first["tandem.decode"].attributes["tandem.kv.pull"] is True  # the adapter's KV crossed the pools
    assert first["POST /v1/completions"].attributes["tandem.route.predicted_hit_tokens"] == 0
    # The prefill engine's KV events for the adapter's blocks reach the router a moment later.
    deadline = time.monotonic() + 30
    while True:
        text, again = _traced_completion(base_url, otlp_receiver, ADAPTER, prompt)
        hits = again["POST /v1/completions"].attributes["tandem.route.predicted_hit_tokens"]
        if hits > 0 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert hits > 0, "the router never matched the adapter's prompt to the engine's KV events"
    assert text == first_text
    # The base model's hashes of the same prompt differ (vLLM keys every block by the adapter).
    _, base = _traced_completion(base_url, otlp_receiver, MODEL_NAME, prompt)
    assert base["POST /v1/completions"].attributes["tandem.route.predicted_hit_tokens"] == 0


def test_kv_of_one_adapter_is_recomputed_under_another_and_counted(base_url, tiny_model_dir):
    from ray import serve

    prefill = serve.get_deployment_handle("interactive-prefill", app_name="tandem")
    decode = serve.get_deployment_handle(DECODE, app_name="tandem")
    path = lora_adapters(tiny_model_dir)[ADAPTER]
    prompt = tuple(random.Random(time.time_ns()).randrange(5, 250) for _ in range(100))
    sampling = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    with_adapter = EngineRequest(f"lora-{uuid.uuid4()}", prompt, sampling, tier="interactive",
                                 adapter=Adapter(ADAPTER, list(LORA_SEEDS).index(ADAPTER) + 1, path))
    handoff = prefill.prefill.remote(with_adapter).result().handoff
    assert handoff is not None and handoff.adapter == f"{ADAPTER}={path}"

    def decoded(request, handoff) -> list[int]:
        return [t for chunk in decode.options(stream=True).generate.remote(request, handoff)
                for t in chunk.outputs[0].token_ids]

    mismatched = metric("ray_tandem_handoffs_mismatched_total", tier="interactive")
    before = next(iter(replica_stats(DECODE, 1).values()))
    base_request = EngineRequest(f"lora-base-{uuid.uuid4()}", prompt, sampling, tier="interactive")
    continued = decoded(base_request, handoff)  # the adapter's KV, offered to a base-model request
    after = next(iter(replica_stats(DECODE, 1).values()))
    reference = decoded(EngineRequest(f"lora-ref-{uuid.uuid4()}", prompt, sampling, tier="interactive"), None)
    assert continued == reference  # the base model's own answer: the adapter's KV was not used
    assert after.prompt_tokens_transferred == before.prompt_tokens_transferred  # nothing pulled
    deadline = time.monotonic() + 30
    while metric("ray_tandem_handoffs_mismatched_total", tier="interactive") < mismatched + 1:
        assert time.monotonic() < deadline, "the refused handoff was not counted"
        time.sleep(0.5)
