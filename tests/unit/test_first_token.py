"""First-token reuse (kv_transfer/first_token.py and its use in router/disagg.py): which
requests may reuse the prefill's token, the decode request that continues after it, the
pull bound of the connector, and the path through the backend."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from cluster.protocol import EngineRequest, SamplingSettings, StructuredOutput, TokenChunk
from kv_transfer.first_token import FirstTokenOffset, continuation, reuse_blocker, tokens_to_load
from tests.unit.test_disagg_abort import make_backend


@pytest.mark.parametrize("sampling, blocker", [
    (SamplingSettings(max_tokens=8), None),
    (SamplingSettings(max_tokens=8, temperature=0.7, top_p=0.9, top_k=5, min_p=0.1), None),
    (SamplingSettings(max_tokens=8, stop=("\n",), stop_token_ids=(7,), repetition_penalty=1.2,
                      logprobs=3, min_tokens=2, ignore_eos=True), None),
    (SamplingSettings(max_tokens=8, seed=3, temperature=0.0), None),  # greedy: the seed draws nothing
    (SamplingSettings(max_tokens=8, seed=3, temperature=0.8), "seeded_sampling"),
    (SamplingSettings(max_tokens=8, structured=StructuredOutput("regex", "[a-z]+")), "structured_output"),
    (SamplingSettings(max_tokens=8, presence_penalty=0.5), "penalties"),
    (SamplingSettings(max_tokens=8, frequency_penalty=-0.5), "penalties"),
    (SamplingSettings(max_tokens=8, stop=("\n", "END")), "stop_strings"),
])
def test_reuse_blocker(sampling, blocker):
    assert reuse_blocker(sampling) == blocker


def test_continuation_extends_the_prompt_and_shortens_the_bounds():
    request = EngineRequest("r", (1, 2, 3), SamplingSettings(max_tokens=8, min_tokens=3), tier="batch")
    after = continuation(request, TokenChunk("x", (9,), None, 3, 1))
    assert after.request_id == "r" and after.tier == "batch"
    assert after.prompt_token_ids == (1, 2, 3, 9)
    assert (after.sampling.max_tokens, after.sampling.min_tokens) == (7, 2)
    assert continuation(replace(request, sampling=SamplingSettings(max_tokens=8)),
                        TokenChunk("x", (9,))).sampling.min_tokens == 0


def test_offset_restates_decode_counters_as_the_clients():
    offset = FirstTokenOffset(prompt_tokens=3, reused_tokens=1)
    assert offset.apply(TokenChunk("y", (5,), None, 4, 2)) == TokenChunk("y", (5,), None, 3, 3)


@pytest.mark.parametrize("params, vllm_count, computed, expected", [
    ({"do_remote_prefill": True, "remote_num_tokens": 128}, 129, 0, 128),  # reused token: one less
    ({"do_remote_prefill": True, "remote_num_tokens": 128}, 128, 0, 128),  # plain handoff: unchanged
    ({"do_remote_prefill": True, "remote_num_tokens": 128}, 1, 128, 0),  # local cache holds it all
    ({"do_remote_prefill": True, "remote_num_tokens": 300}, 45, 256, 44),  # partial local hit
    ({"do_remote_prefill": True}, 129, 0, 129),  # no count from the prefill: vLLM's own
    ({"do_remote_prefill": False, "remote_num_tokens": 5}, 0, 0, 0),
    (None, 0, 0, 0),
])
def test_tokens_to_load_never_exceeds_what_the_prefill_computed(params, vllm_count, computed, expected):
    assert tokens_to_load(params, vllm_count, computed) == expected


def _collect(backend, request):
    async def main():
        return [chunk async for chunk in backend.generate(request)]
    return asyncio.run(main())


def test_the_prefill_token_goes_first_and_decode_continues_after_it():
    backend, pools = make_backend()
    request = EngineRequest("req-1", (1, 2, 3), SamplingSettings(max_tokens=3), tier="interactive")

    async def bounded():
        it = backend.generate(request)
        first = await anext(it)
        calls = list(pools.decode.replica_of("generate", "req-1"))
        second = await anext(it)
        await it.aclose()
        return first, calls, second

    first, calls_at_first, second = asyncio.run(bounded())
    assert first.token_ids == (1,) and first.num_prompt_tokens == 3 and first.num_output_tokens == 1
    assert calls_at_first == []  # the first token left before the decode hop began
    assert pools.decode.replica_of("generate", "req-1") != []
    # The fake decode reports its own running count (0) over a 4-token prompt: restated as the
    # client's, the reused token counts as output and not as prompt.
    assert (second.num_prompt_tokens, second.num_output_tokens) == (3, 1)


def test_an_answer_that_ends_on_the_first_token_never_calls_decode(monkeypatch):
    from tests import fakes

    backend, pools = make_backend()
    original = fakes._FakeMethod._answer

    async def finished(self, request_id, first_token):
        result = await original(self, request_id, first_token)
        return replace(result, kv_transfer_params=None,
                       first=TokenChunk("a", (2,), "stop", 3, 1)) if self.name == "prefill" else result

    monkeypatch.setattr(fakes._FakeMethod, "_answer", finished)
    chunks = _collect(backend, EngineRequest("req-2", (1, 2, 3), SamplingSettings(max_tokens=5), tier="interactive"))
    assert [c.finish_reason for c in chunks] == ["stop"]
    assert pools.decode.replica_of("generate", "req-2") == []
    assert backend._hops == {}


def test_a_request_the_prefill_cannot_serve_exactly_asks_no_first_token():
    backend, pools = make_backend()
    request = EngineRequest("req-3", (1, 2, 3), SamplingSettings(max_tokens=5, presence_penalty=1.0),
                            tier="interactive")

    async def main():
        it = backend.generate(request)
        first = await anext(it)
        await it.aclose()
        return first

    first = asyncio.run(main())
    assert first.text == "a" and first.num_output_tokens == 0  # from the fake decode, not the prefill
    assert pools.decode.replica_of("generate", "req-3") != []
