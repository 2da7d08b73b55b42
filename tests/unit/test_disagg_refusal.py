"""A request the engine refuses (vLLM's own request checks) is the client's error: a 400 at
the edge, not a decode retry and not a 500."""

from __future__ import annotations

import asyncio

import pytest

from dataclasses import replace

from vllm import SamplingParams
from vllm.sampling_params import StructuredOutputsParams

from cluster.protocol import InvalidEngineRequest
from router.openai.errors import OpenAIError
from tests.unit.test_disagg_abort import make_backend, request


def test_a_request_the_engine_refuses_is_a_400_without_retry():
    """vLLM's own request checks (cluster/engine/vllm.py turns them into InvalidEngineRequest) are
    the client's error: the same request would fail on any replica, so no retry and no 500."""
    async def main():
        backend, pools = make_backend()
        pools.decode.refuse = InvalidEngineRequest("Failed to transform regex into a grammar: backreference")
        # A regex constraint: decode samples every token itself (no first-token reuse).
        constrained = replace(request(0), sampling=SamplingParams(
            max_tokens=1000, structured_outputs=StructuredOutputsParams(regex=r"(a)\1")))
        with pytest.raises(OpenAIError) as exc:
            await anext(backend.generate(constrained))
        return pools, exc.value

    pools, error = asyncio.run(main())
    assert error.status == 400 and error.type == "invalid_request_error"
    assert "Failed to transform regex into a grammar" in error.message
    assert len(pools.decode.replica_of("generate", "req-0")) == 1  # not retried
