"""First-token reuse (kv_transfer/first_token.py and its use in router/pd/path.py): which
requests may reuse the prefill's token, the decode request that continues after it, the
pull bound of the connector, and the path through the backend."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from vllm import SamplingParams
from vllm.sampling_params import StructuredOutputsParams

from cluster.protocol import EngineRequest, finish_reason, new_token_ids
from kv_transfer.first_token import FirstTokenOffset, continuation, reuse_blocker, tokens_to_load
from tests.support.fakes import fake_output
from tests.unit.test_disagg_abort import make_backend


@pytest.mark.parametrize("sampling, blocker", [
    (SamplingParams(max_tokens=8), None),
    (SamplingParams(max_tokens=8, temperature=0.7, top_p=0.9, top_k=5, min_p=0.1), None),
    (SamplingParams(max_tokens=8, stop=["\n"], stop_token_ids=[7], repetition_penalty=1.2,
                    logprobs=3, min_tokens=2, ignore_eos=True), None),
    (SamplingParams(max_tokens=8, seed=3, temperature=0.0), None),  # greedy: the seed draws nothing
    (SamplingParams(max_tokens=8, seed=3, temperature=0.8), "seeded_sampling"),
    (SamplingParams(max_tokens=8, structured_outputs=StructuredOutputsParams(regex="[a-z]+")), "structured_output"),
    (SamplingParams(max_tokens=8, presence_penalty=0.5), "penalties"),
    (SamplingParams(max_tokens=8, frequency_penalty=-0.5), "penalties"),
    (SamplingParams(max_tokens=8, stop=["\n", "END"]), "stop_strings"),
    (SamplingParams(max_tokens=8, n=2, temperature=0.8), "n"),
    (SamplingParams(max_tokens=8, bad_words=["foo"]), "bad_words"),
])
def test_reuse_blocker(sampling, blocker):
    assert reuse_blocker(sampling) == blocker


def test_continuation_extends_the_prompt_and_shortens_the_bounds():
    request = EngineRequest("r", (1, 2, 3), SamplingParams(max_tokens=8, min_tokens=3, prompt_logprobs=2),
                            tier="batch")
    after = continuation(request, fake_output("r", "x", [9]))
    assert after.request_id == "r" and after.tier == "batch"
    assert after.prompt_token_ids == (1, 2, 3, 9)
    assert (after.sampling.max_tokens, after.sampling.min_tokens) == (7, 2)
    assert after.sampling.prompt_logprobs is None  # the prefill computed them over the real prompt
    # The request's own SamplingParams are left as they were (the edge may still read them).
    assert (request.sampling.max_tokens, request.sampling.min_tokens, request.sampling.prompt_logprobs) == (8, 3, 2)
    assert continuation(replace(request, sampling=SamplingParams(max_tokens=8)),
                        fake_output("r", "x", [9])).sampling.min_tokens == 0


def test_offset_adds_the_first_tokens_cumulative_logprob_to_decodes():
    decoded = fake_output("r", "y", [5], cumulative_logprob=-1.0)
    restated = FirstTokenOffset(-0.5).apply(decoded)
    assert restated.outputs[0].cumulative_logprob == -1.5
    assert list(new_token_ids(restated)) == [5] and restated.outputs[0].text == "y"
    assert decoded.outputs[0].cumulative_logprob == -1.0  # the input is not changed
    # No cumulative logprob on either side: nothing to add.
    assert FirstTokenOffset(None).apply(decoded).outputs[0].cumulative_logprob == -1.0
    assert FirstTokenOffset(-0.5).apply(fake_output("r", "y", [5])).outputs[0].cumulative_logprob is None


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


def record(pool, method: str) -> list[tuple]:
    """The arguments of every `method.remote` call on a FakeServePool, which still answers."""
    sent = []
    inner = getattr(pool, method)

    class Recording:
        def remote(self, *args):
            sent.append(args)
            return inner.remote(*args)

    setattr(pool, method, Recording())
    return sent


def _collect(backend, request):
    async def main():
        return [chunk async for chunk in backend.generate(request)]
    return asyncio.run(main())


def test_the_prefill_token_goes_first_and_decode_continues_after_it():
    backend, pools = make_backend()
    request = EngineRequest("req-1", (1, 2, 3), SamplingParams(max_tokens=3, min_tokens=2), tier="interactive")
    sent = record(pools.decode, "generate")

    async def bounded():
        it = backend.generate(request)
        first = await anext(it)
        calls = list(pools.decode.replica_of("generate", "req-1"))
        second = await anext(it)
        await it.aclose()
        return first, calls, second

    first, calls_at_first, second = asyncio.run(bounded())
    assert list(new_token_ids(first)) == [1] and first.outputs[0].text == "a"  # the fake prefill's token
    assert not first.finished and finish_reason(first) is None
    assert calls_at_first == []  # the first token left before the decode hop began
    assert pools.decode.replica_of("generate", "req-1") != []
    assert list(new_token_ids(second)) == [1]  # decode's own next token
    # Decode continues after the reused token: prompt + token, the bounds one less.
    (continued, handoff), = sent
    assert continued.prompt_token_ids == (1, 2, 3, 1)
    assert (continued.sampling.max_tokens, continued.sampling.min_tokens) == (2, 1)
    assert handoff is not None


def test_an_answer_that_ends_on_the_first_token_never_calls_decode(monkeypatch):
    from tests.support import fakes

    backend, pools = make_backend()
    original = fakes._FakeMethod._answer

    async def finished(self, request_id, first_token):
        result = await original(self, request_id, first_token)
        return replace(result, kv_transfer_params=None,
                       first=fake_output(request_id, "a", [2], "stop")) if self.name == "prefill" else result

    monkeypatch.setattr(fakes._FakeMethod, "_answer", finished)
    outputs = _collect(backend, EngineRequest("req-2", (1, 2, 3), SamplingParams(max_tokens=5), tier="interactive"))
    assert [finish_reason(o) for o in outputs] == ["stop"]
    assert pools.decode.replica_of("generate", "req-2") == []
    assert backend.hops._in_flight == {}


def test_a_request_the_prefill_cannot_serve_exactly_asks_no_first_token():
    backend, pools = make_backend()
    request = EngineRequest("req-3", (1, 2, 3), SamplingParams(max_tokens=5, presence_penalty=1.0),
                            tier="interactive")
    prefills = record(pools.prefill, "prefill")

    async def main():
        it = backend.generate(request)
        first = await anext(it)
        await it.aclose()
        return first

    first = asyncio.run(main())
    assert first.request_id == "fake"  # from the fake decode's stream, not the prefill's output
    assert pools.decode.replica_of("generate", "req-3") != []
    assert [args[1] for args in prefills] == [False]  # the prompt still went to prefill, for its KV only
