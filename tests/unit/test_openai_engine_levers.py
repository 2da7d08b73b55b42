"""Engine levers per pool (cluster/config/ EngineConfig): invalid combinations fail at load,
naming the field (vLLM's own checks of each value: test_engine_args.py); each hop's
SamplingParams (cluster/engine/vllm.py)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from cluster.config import ClusterConfig
from cluster.engine.vllm import _sampling_params
from cluster.protocol import EngineRequest


def _cfg(prefill: dict | None = None, decode: dict | None = None, **model) -> ClusterConfig:
    return ClusterConfig.model_validate({
        "model": {"path": "/m", "max_model_len": 1024, **model},
        "tiers": {"interactive": {"prefill": {"engine": prefill or {}}, "decode": {"engine": decode or {}}}},
    })


@pytest.mark.parametrize("prefill, decode, field", [
    ({"speculative_config": {}}, {}, "tiers.interactive.prefill.engine.speculative_config"),
    ({}, {"max_num_batched_tokens": 256}, "enable_chunked_prefill"),
    ({}, {"enable_chunked_prefill": False}, "max_num_batched_tokens"),
    ({}, {"tensor_parallel_size": 0}, "tensor_parallel_size"),
])
def test_invalid_combinations_name_the_field(prefill, decode, field) -> None:
    with pytest.raises(ValidationError, match=field.replace(".", r"\.")):
        _cfg(prefill, decode)


def test_chunked_prefill_allows_small_batches_and_tool_parser_is_a_name() -> None:
    cfg = _cfg({}, {"max_num_batched_tokens": 256, "enable_chunked_prefill": True}, tool_parser="hermes")
    assert cfg.tiers["interactive"].decode.engine.max_num_batched_tokens == 256
    assert cfg.model.tool_parser == "hermes"
    with pytest.raises(ValidationError, match="tool_parser"):
        _cfg(tool_parser="bad name!")


def test_tensor_parallel_needs_enough_gpus() -> None:
    with pytest.raises(ValidationError, match=r"tiers\.interactive\.decode\.engine\.tensor_parallel_size"):
        ClusterConfig.model_validate({"model": {"path": "/m"}, "tiers": {"interactive": {
            "decode": {"num_gpus": 1, "engine": {"tensor_parallel_size": 2}}}}})


def test_prefill_drops_decoding_time_extras_decode_keeps_them() -> None:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

    sampling = SamplingParams(max_tokens=8, min_tokens=3, logprobs=2, presence_penalty=0.5, stop_token_ids=[7],
                              top_k=4, structured_outputs=StructuredOutputsParams(regex="[0-9]+"))
    request = EngineRequest("r", (1, 2, 3), sampling, tier="interactive")
    prefill = _sampling_params(request, max_tokens=1, kv_params={"do_remote_decode": True}, prefill=True)
    assert prefill.logprobs is None and prefill.structured_outputs is None and prefill.max_tokens == 1
    assert prefill.min_tokens == 1  # never above the hop's max_tokens
    assert prefill.extra_args == {"kv_transfer_params": {"do_remote_decode": True}}
    decode = _sampling_params(request, max_tokens=8, kv_params=None)
    assert decode.logprobs == 2 and decode.structured_outputs.regex == "[0-9]+"
    assert (decode.presence_penalty, decode.stop_token_ids, decode.top_k, decode.min_tokens) == (0.5, [7], 4, 3)
    assert decode.output_kind == prefill.output_kind == RequestOutputKind.DELTA
    assert not decode.extra_args
    # Each hop gets a copy: the request's own SamplingParams stay as the edge made them.
    assert (sampling.max_tokens, sampling.logprobs, sampling.extra_args) == (8, 2, None)
    assert sampling.structured_outputs is not None and sampling.output_kind == RequestOutputKind.CUMULATIVE
