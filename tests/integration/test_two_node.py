"""Pools on separate Ray nodes: the session cluster is a head and a worker started with
`ray start` (tests/integration/conftest.py), prefill placed on the head by its custom resource,
decode on the worker. A request's KV crosses between the nodes through NIXL and the greedy
output stays equal to transformers'."""

from __future__ import annotations

import httpx

from tests.support.integration_cluster import MODEL_NAME, NODE_RESOURCES


PROMPT = "Two Ray nodes share one machine, and the prefill engine hands its cache to"
MAX_TOKENS = 10


def _replica_nodes(deployment: str) -> list[str]:
    """Node ids of the live replicas of a deployment, as Ray's GCS records them."""
    # ray.util.state needs the dashboard, which the test cluster leaves off to save memory;
    # this reads the same GCS actor table directly.
    from ray._private.state import actors

    name = f"ServeReplica:tandem:{deployment}"
    return [a["Address"]["NodeID"] for a in actors(actor_state_name="ALIVE").values()
            if a["ActorClassName"] == name]


def _node_with(resource: str) -> str:
    import ray

    [node] = [n["NodeID"] for n in ray.nodes() if n["Alive"] and resource in n["Resources"]]
    return node


def test_pools_run_on_their_own_nodes(cluster):
    import ray

    assert len([n for n in ray.nodes() if n["Alive"]]) == 2
    prefill_node = _node_with(next(iter(NODE_RESOURCES["head"])))
    decode_node = _node_with(next(iter(NODE_RESOURCES["worker"])))
    assert prefill_node != decode_node
    for tier in cluster.cfg.tiers:  # every pool of every tier, however many replicas
        prefill, decode = _replica_nodes(f"{tier}-prefill"), _replica_nodes(f"{tier}-decode")
        assert prefill and set(prefill) == {prefill_node}, tier
        assert decode and set(decode) == {decode_node}, tier


def test_kv_crosses_nodes_and_output_is_unchanged(base_url, tiny_model_dir):
    import torch
    from ray import serve
    from transformers import AutoModelForCausalLM, AutoTokenizer

    decode = serve.get_deployment_handle("interactive-decode", app_name="tandem")
    before = decode.stats.remote().result()
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0,
            "return_token_ids": True}
    resp = httpx.post(f"{base_url}/v1/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    out = resp.json()
    after = decode.stats.remote().result()

    prompt_ids = out["choices"][0]["prompt_token_ids"]
    # Decode (on the worker node) computed none of the prompt: all of it came over NIXL.
    assert after.prompt_tokens_transferred - before.prompt_tokens_transferred == len(prompt_ids)
    # The one token it computes is the prefill's first token, which it continues after
    # (first-token reuse, kv_transfer/first_token.py); none if the answer ended on token 1.
    reused = 1 if len(out["choices"][0]["token_ids"]) > 1 else 0
    assert after.prompt_tokens_computed - before.prompt_tokens_computed == reused
    assert after.kv_failed_transfers == before.kv_failed_transfers

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = model.generate(torch.tensor([prompt_ids]), max_new_tokens=MAX_TOKENS, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id)
    expected = ref[0, len(prompt_ids):].tolist()
    eos = tokenizer.eos_token_id
    if eos in expected:  # the gateway stops at EOS; transformers pads after it
        expected = expected[: expected.index(eos) + 1]
    assert out["choices"][0]["token_ids"] == expected
