"""LoRA adapters through the P/D path (model.lora_adapters, issue 31): the config reaches vLLM's
serving code and every engine alike, the adapter travels with the request across Ray, and KV
computed with one adapter is never continued under another."""

from __future__ import annotations

import pickle

import pytest

from cluster.config import ClusterConfig, ModelConfig
from cluster.protocol import Adapter, EngineRequest
from kv_transfer.handoff import EngineIdentity, Handoff, HandoffMismatch, adapter_key

PARAMS = {"do_remote_prefill": True, "remote_engine_id": "e1", "remote_block_ids": [1]}
M = EngineIdentity(model="m", dtype="float32", kv_cache_dtype="auto", block_size=16)
FRENCH = Adapter("french", 1, "/adapters/french")


def test_adapters_are_served_by_name_and_bounded():
    model = ModelConfig(path="/models/tiny", lora_adapters={"french": "/adapters/french"})
    assert (model.max_loras, model.max_lora_rank) == (4, 16)
    with pytest.raises(ValueError, match="base model's name"):
        ModelConfig(path="/models/tiny", lora_adapters={"tiny": "/adapters/x"})
    with pytest.raises(ValueError):
        ModelConfig(path="/models/tiny", lora_adapters={"has space": "/adapters/x"})
    with pytest.raises(ValueError):
        ModelConfig(path="/models/tiny", max_lora_rank=12)  # not a rank vLLM builds


@pytest.mark.parametrize("key", ["enable_lora", "max_loras", "max_lora_rank"])
def test_a_pool_cannot_set_lora_on_its_own(key):
    """Every pool serves the same adapters: a handoff needs both engines alike."""
    with pytest.raises(ValueError, match="model."):
        ClusterConfig.model_validate({"model": {"path": "/m"}, "tiers": {"interactive": {
            "prefill": {"engine": {key: True if key == "enable_lora" else 8}}}}})


def test_every_engine_and_the_gateway_get_the_adapters():
    from cluster.config import EngineConfig, KVTransferConfig
    from cluster.engine.base import EngineSpec, LoraLimits
    from cluster.engine.vllm import engine_args
    from router.openai.app import vllm_server_args

    spec = EngineSpec(model_path="/m", served_name="m", dtype="float32", max_model_len=256, engine=EngineConfig(),
                      kv_role=None, kv=KVTransferConfig(), nixl=None, cpu_binding=None, on_gpu=False, worker_id="w",
                      lora=LoraLimits(max_loras=2, max_lora_rank=8))
    args = engine_args(spec)
    assert (args.enable_lora, args.max_loras, args.max_lora_rank) == (True, 2, 8)
    assert not engine_args(spec.__class__(**{**spec.__dict__, "lora": None})).enable_lora
    served = vllm_server_args(model_path="/m", served_name="m", dtype="float32", max_model_len=256,
                              lora_adapters={"french": "/adapters/french"}, max_loras=2, max_lora_rank=8)
    assert served.enable_lora and (served.max_loras, served.max_lora_rank) == (2, 8)
    assert [(m.name, m.path) for m in served.lora_modules] == [("french", "/adapters/french")]
    assert not vllm_server_args(model_path="/m", served_name="m", dtype="float32", max_model_len=256).enable_lora


def test_the_adapter_crosses_ray_with_the_request():
    from vllm import SamplingParams

    from cluster.protocol import sampling_params

    request = EngineRequest("r", (1, 2, 3), SamplingParams(max_tokens=4), tier="interactive", adapter=FRENCH)
    received = pickle.loads(pickle.dumps(request))
    assert received.adapter == FRENCH and sampling_params(received).max_tokens == 4
    lora = received.adapter.lora_request()
    assert (lora.lora_name, lora.lora_int_id, lora.lora_path) == ("french", 1, "/adapters/french")


def test_kv_of_one_adapter_is_never_continued_under_another():
    handoff = Handoff.from_prefill(M, PARAMS, adapter=adapter_key(FRENCH))
    assert handoff.decode_params(M, adapter=adapter_key(FRENCH)) == PARAMS
    with pytest.raises(HandoffMismatch, match="french=/adapters/french, this request runs the base model"):
        handoff.decode_params(M, adapter=None)
    with pytest.raises(HandoffMismatch, match="none \\(the base model\\), this request runs french"):
        Handoff.from_prefill(M, PARAMS).decode_params(M, adapter=adapter_key(FRENCH))
    repointed = Adapter("french", 1, "/adapters/french-v2")  # the same name, other weights
    with pytest.raises(HandoffMismatch):
        handoff.decode_params(M, adapter=adapter_key(repointed))
