"""Per-tenant prefix-cache isolation (auth.prefix_cache): each tenant's requests carry a cache
salt, vLLM salts their block hashes with it, and the router's prefix index hashes the same way,
so tenant B sending tenant A's prompt neither hits A's cache nor is routed as if it did."""

from __future__ import annotations

import asyncio
import random
from types import SimpleNamespace

import pytest
from vllm import SamplingParams

from cluster.config import AuthConfig, ClusterConfig
from cluster.protocol import EngineRequest
from router.auth import ApiKeyAuth, cache_salt
from cluster.hashing import DEFAULT_SEED, BlockHasher
from router.prefix_index import BlockStored, MemoryPrefixIndex
from router.routing.decider import PDDecider
from router.routing.directory import PoolDirectory, ReplicaInfo
from cluster.types import RoutingStats
from router.routing.service import KVRouter
from tests.support.fakes import FakeBackend

TOKENS = list(range(3, 3 + 4 * 9 + 2))  # 9 full blocks of 4 and a partial one


def vllm_hashes(tokens, block_size, salt, lora=None):
    """vLLM 0.32's own block hashes (v1/core/kv_cache_utils.py) of a request with `salt`."""
    from vllm.utils.hashing import sha256
    from vllm.v1.core import kv_cache_utils

    kv_cache_utils.init_none_hash(sha256)
    lora_request = None if lora is None else SimpleNamespace(lora_name=lora[0], lora_path=lora[1])
    request = SimpleNamespace(block_hashes=[], num_tokens=len(tokens), all_token_ids=list(tokens), mm_features=[],
                              lora_request=lora_request, cache_salt=salt, prompt_embeds=None)
    hasher = kv_cache_utils.get_request_block_hasher(block_size, sha256)
    return [bytes(h) for h in hasher(request)], kv_cache_utils.resolve_none_hash_seed(sha256)


@pytest.mark.parametrize("salt", [None, "", "tenant-a", cache_salt("acme")])
@pytest.mark.parametrize("block_size", [4, 16])
def test_router_hashes_equal_vllms_with_and_without_a_salt(salt, block_size):
    pytest.importorskip("vllm")
    expected, seed = vllm_hashes(TOKENS, block_size, salt)
    assert BlockHasher(block_size, seed).raw_hashes(TOKENS, salt) == expected
    assert len(expected) == len(TOKENS) // block_size


@pytest.mark.parametrize("salt", [None, "tenant-a"])
def test_router_hashes_equal_vllms_for_a_lora_adapter(salt):
    """model.lora_adapters: vLLM keys every block of an adapter's request by its name and path."""
    pytest.importorskip("vllm")
    lora = ("french", "/adapters/french")
    expected, seed = vllm_hashes(TOKENS, 4, salt, lora)
    assert BlockHasher(4, seed).raw_hashes(TOKENS, salt, lora) == expected
    base = BlockHasher(4, seed).raw_hashes(TOKENS, salt)
    assert not set(expected) & set(base)  # no block shared with the base model's
    assert not set(expected) & set(BlockHasher(4, seed).raw_hashes(TOKENS, salt, ("french", "/adapters/v2")))


def test_a_salt_changes_every_block_hash():
    plain, salted = BlockHasher(4).hashes(TOKENS), BlockHasher(4).hashes(TOKENS, "s")
    assert len(plain) == len(salted) and not set(plain) & set(salted)
    assert BlockHasher(4).hashes(TOKENS, "t") != salted


def test_isolation_defaults_to_isolate_with_keys_and_share_when_open():
    keys = [{"tenant": "a", "value": "sk-0123456789"}]
    assert AuthConfig(tenants={"a": {"tier": "interactive"}}, keys=keys).isolates_prefix_cache()
    assert not AuthConfig().isolates_prefix_cache()
    assert not AuthConfig(tenants={"a": {"tier": "interactive"}}, keys=keys, prefix_cache="share").isolates_prefix_cache()


# Over HTTP, the real edge (build_openai_app, tests/support/openai_helpers.py): its imports stay
# inside, so the other tests here do not depend on the edge's test helpers.
def test_each_tenant_gets_its_own_salt_in_the_engine_request(tmp_path):
    from tests.support.openai_helpers import MODEL, make_client

    cfg = ClusterConfig.model_validate({
        "model": {"path": str(tmp_path)},
        "auth": {"tenants": {"a": {"tier": "interactive"}, "b": {"tier": "interactive"}},
                 "keys": [{"tenant": "a", "value": "sk-aaaaaaaaaa"}, {"tenant": "b", "value": "sk-bbbbbbbbbb"}]},
    })
    auth = ApiKeyAuth.from_config(cfg)
    backend = FakeBackend()
    client, _ = make_client(backend, authenticate=auth.caller)
    body = {"model": MODEL, "prompt": "the same prompt", "max_tokens": 2}
    for key in ("sk-aaaaaaaaaa", "sk-bbbbbbbbbb", "sk-aaaaaaaaaa"):
        assert client.post("/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}).status_code == 200
    salts = [r.cache_salt for r in backend.requests]
    assert salts[0] == salts[2] == cache_salt("a") and salts[1] == cache_salt("b") != salts[0]
    assert len(salts[0]) == 32 and salts[0] != "a"  # a digest: the tenant name does not reach the engines
    # An open API (no keys) has no salt.
    open_backend = FakeBackend()
    make_client(open_backend)[0].post("/v1/completions", json=body)
    assert open_backend.requests[0].cache_salt is None


def test_both_hops_pass_the_salt_to_vllm():
    from cluster.engine.vllm import _prompt

    salted = EngineRequest("r", (1, 2), SamplingParams(max_tokens=1), cache_salt="s", tier="interactive")
    assert _prompt(salted) == {"type": "token", "prompt_token_ids": [1, 2], "cache_salt": "s"}
    assert _prompt(EngineRequest("r", (1, 2), SamplingParams(max_tokens=1), tier="interactive")) == {"type": "token", "prompt_token_ids": [1, 2]}


def test_the_router_finds_a_tenants_prefix_only_for_that_tenant():
    def directory(pool):
        d = PoolDirectory()
        d.set_replicas([ReplicaInfo(n, 8, RoutingStats.from_dict({"worker_id": f"interactive-{pool}-{n}", "block_size": 4,
                                           "hash_algo": "sha256", "hash_seed": DEFAULT_SEED})) for n in ("x1", "x2")])
        return d

    index = MemoryPrefixIndex()
    salt_a, salt_b = cache_salt("a"), cache_salt("b")
    # What the engine publishes after tenant A's request: A-salted hashes.
    index.apply([BlockStored("interactive-prefill-x2", tuple(BlockHasher(4).hashes(TOKENS, salt_a)))])
    router = KVRouter(directories={("interactive", "prefill"): directory("prefill"),
                                   ("interactive", "decode"): directory("decode")},
                      index=index, weights={"prefix": 1.0, "load": 0.1}, decider=PDDecider(0), subscribe=False,
                      rng=random.Random(0))

    def route(salt):
        req = EngineRequest("r", tuple(TOKENS), SamplingParams(max_tokens=1), cache_salt=salt, tier="interactive")
        return asyncio.run(router.route(req, "interactive"))

    a = route(salt_a)
    assert a.reason == "prefix_hit" and a.predicted_hit_tokens == 36
    assert a.prefill.worker.worker_id == "interactive-prefill-x2"
    for other in (salt_b, None):
        decision = route(other)
        assert decision.predicted_hit_tokens == 0 and decision.reason == "load"
