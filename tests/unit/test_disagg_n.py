"""Sampling n > 1 through DisaggregatedBackend (router/pd/path.py, router/pd/samples.py): one prefill, n decode
requests on one decode replica (the first pulls the KV, the others start after its first
output, from decode's prefix cache), vLLM's seeds (seed + i), outputs re-indexed per sample
with one finish, aborts of every sample; and the prompt's logprobs, computed by the prefill,
riding on the first output while no decode request asks for them again (fake Serve pools,
tests/support/fakes.py)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from vllm import SamplingParams

from cluster.protocol import EngineRequest, finish_reason, new_token_ids
from router.pd import samples as n_path
from tests.support.fakes import RecordingMetric
from tests.unit.test_disagg_abort import TIER, make_backend

PROMPT_LOGPROBS = [None, {2: -1.0}, {3: -2.0}]  # stands in for vLLM's per-position dicts


class Recorder:
    """Wraps a fake pool's methods: what each call was sent, and when, in one event log
    shared by the pools: ("call", method, request_id) and, per decode output, ("out", request_id)."""

    def __init__(self, pools, prompt_logprobs=None, events=None):
        self.events = [] if events is None else events
        self.sent: dict[str, list[tuple]] = {"prefill": [], "generate": []}
        self._wrap(pools.prefill, "prefill", prompt_logprobs)
        self._wrap(pools.decode, "generate", None)

    def _wrap(self, pool, method: str, prompt_logprobs) -> None:
        inner = getattr(pool, method)
        recorder = self

        class Recording:
            def remote(self, *args):
                rid = args[0].request_id
                recorder.sent[method].append(args)
                recorder.events.append(("call", method, rid))
                answer = inner.remote(*args)
                if method == "generate":
                    return recorder._stream(answer, rid)
                return recorder._result(answer, prompt_logprobs)

        setattr(pool, method, Recording())

    async def _result(self, answer, prompt_logprobs):
        result = await answer
        return result if prompt_logprobs is None else replace(result, prompt_logprobs=prompt_logprobs)

    def _stream(self, stream, rid: str):
        recorder = self

        class Stream:
            def cancel(self):
                stream.cancel()

            def __aiter__(self):
                return self

            async def __anext__(self):
                output = await stream.__anext__()
                recorder.events.append(("out", rid))
                return output

        return Stream()

    def requests(self, method: str) -> dict[str, EngineRequest]:
        return {args[0].request_id: args[0] for args in self.sent[method]}


def request(rid: str, **sampling) -> EngineRequest:
    return EngineRequest(rid, (1, 2, 3), SamplingParams(**sampling), tier=TIER)


def collect(backend, req) -> list:
    async def main():
        return [output async for output in backend.generate(req)]
    return asyncio.run(main())


def test_n_samples_share_one_prefill_and_one_decode_replica(monkeypatch):
    counted = RecordingMetric()
    monkeypatch.setattr(n_path, "FIRST_TOKEN", counted)
    backend, pools = make_backend()
    rec = Recorder(pools)
    req = request("req-0", n=3, temperature=0.8, seed=10, max_tokens=4)
    outputs = collect(backend, req)

    # One prefill, for the KV only (each sample samples its own first token on decode).
    assert [(args[0].request_id, args[1]) for args in rec.sent["prefill"]] == [("req-0-s0", False)]
    samples = ["req-0-s0", "req-0-s1", "req-0-s2"]
    assert [args[0].request_id for args in rec.sent["generate"]] == samples
    assert [args[1] is not None for args in rec.sent["generate"]] == [True, False, False]  # one KV pull
    replicas = [r for rid in samples for r in pools.decode.replica_of("generate", rid)]
    assert len(replicas) == 3 and len(set(replicas)) == 1
    # Samples 1 and 2 start once sample 0 has produced: decode's prefix cache then holds the prompt.
    first_out = rec.events.index(("out", "req-0-s0"))
    assert all(rec.events.index(("call", "generate", rid)) > first_out for rid in samples[1:])
    # vLLM's own n: sample i is seeded seed + i, each a request of n = 1.
    sent = rec.requests("generate")
    assert [(sent[rid].sampling.seed, sent[rid].sampling.n) for rid in samples] == [(10, 1), (11, 1), (12, 1)]
    assert (req.sampling.n, req.sampling.seed) == (3, 10)  # the client's request is left as it was

    # The client's view: one request, outputs indexed per sample, finished once, at the end.
    assert {o.request_id for o in outputs} == {"req-0"}
    assert all(len(o.outputs) == 1 for o in outputs)
    by_index = {i: sum(len(new_token_ids(o)) for o in outputs if o.outputs[0].index == i) for i in range(3)}
    assert by_index == {0: 4, 1: 4, 2: 4}
    assert [o.finished for o in outputs] == [False] * (len(outputs) - 1) + [True]
    assert sorted(o.outputs[0].index for o in outputs if o.outputs[0].finish_reason == "length") == [0, 1, 2]
    assert backend.hops._in_flight == {} and backend.hops._samples == {}
    assert counted.values("inc", path="decode", reason="n") == [1]  # counted once per request


def test_samples_that_finish_together_still_end_the_request_once():
    """Samples 1..n-1 start together, so they may finish within one engine step: the last
    finished output must still say finished, whichever sample's stream closes first."""
    backend, pools = make_backend()
    Recorder(pools)
    for i in range(10):
        outputs = collect(backend, request(f"req-{i}", n=4, temperature=0.8, max_tokens=2))
        assert [o.finished for o in outputs].count(True) == 1 and outputs[-1].finished, i
        assert finish_reason(outputs[-1]) == "length"


def test_abort_reaches_every_sample_in_flight():
    async def main():
        backend, pools = make_backend()
        rec = Recorder(pools)
        it = backend.generate(request("req-1", n=3, temperature=0.8, max_tokens=1000))
        seen = set()
        while seen != {0, 1, 2}:  # every sample's decode hop is in flight
            seen.add((await anext(it)).outputs[0].index)
        await backend.abort("req-1")
        await it.aclose()
        await asyncio.sleep(0.05)  # the closed stream's inner generators are finalized by the loop
        produced = len(rec.events)
        await asyncio.sleep(0.05)
        return backend, pools, produced, len(rec.events)

    backend, pools, produced, later = asyncio.run(main())
    assert later == produced  # the client left: no sample decodes on
    for i in range(3):
        rid = f"req-1-s{i}"
        assert pools.decode.replica_of("abort", rid) == pools.decode.replica_of("generate", rid)
        assert len(pools.decode.replica_of("abort", rid)) == 1
    assert pools.decode.replica_of("abort", "req-1") == []  # the client's id is no engine's request
    assert backend.hops._in_flight == {} and backend.hops._samples == {}


def test_n_samples_without_a_handoff_all_compute_the_prompt_on_decode():
    backend, pools = make_backend(hang_prefill=True, prefill_timeout_s=0.05)
    rec = Recorder(pools)
    outputs = collect(backend, request("req-2", n=2, temperature=0.8, max_tokens=2))
    assert [args[1] for args in rec.sent["generate"]] == [None, None]
    assert sorted(o.outputs[0].index for o in outputs) == [0, 0, 1, 1] and outputs[-1].finished


def test_prompt_logprobs_of_n_samples_come_from_the_prefill_on_each_samples_first_output():
    """Computed once, by the prefill; but as vLLM's own n yields them (each sample's first
    output has them), since vLLM's streaming echo reads them per choice."""
    backend, pools = make_backend()
    rec = Recorder(pools, prompt_logprobs=PROMPT_LOGPROBS)
    outputs = collect(backend, request("req-3", n=2, temperature=0.8, max_tokens=3, prompt_logprobs=1))
    assert rec.sent["prefill"][0][0].sampling.prompt_logprobs == 1  # computed where the prompt is
    assert [r.sampling.prompt_logprobs for r in rec.requests("generate").values()] == [None, None]
    assert outputs[0].prompt_logprobs == PROMPT_LOGPROBS
    for i in range(2):
        of_sample = [o.prompt_logprobs for o in outputs if o.outputs[0].index == i]
        assert of_sample == [PROMPT_LOGPROBS, None, None], i


def test_first_token_reuse_yields_the_prefills_output_first_and_decode_continues_after_it():
    backend, pools = make_backend()
    rec = Recorder(pools, prompt_logprobs=PROMPT_LOGPROBS)
    outputs = collect(backend, request("req-4", max_tokens=3, prompt_logprobs=1))

    assert [args[1] for args in rec.sent["prefill"]] == [True]  # asked for the first token
    first = outputs[0]
    assert first.request_id == "req-4"  # the prefill's output (the fake decode's say "fake")
    assert list(new_token_ids(first)) == [1] and first.outputs[0].text == "a" and not first.finished
    assert first.prompt_logprobs == PROMPT_LOGPROBS  # the prefill's, on the first output
    assert rec.events.index(("call", "prefill", "req-4")) < rec.events.index(("call", "generate", "req-4"))
    continued = rec.requests("generate")["req-4"]
    assert continued.prompt_token_ids == (1, 2, 3, 1)  # prompt + the reused token
    assert continued.sampling.max_tokens == 2 and continued.sampling.prompt_logprobs is None
    # Decode's outputs follow: 2 more tokens, the last finishing, none carrying prompt logprobs.
    assert [o.request_id for o in outputs[1:]] == ["fake", "fake"]
    assert sum(len(new_token_ids(o)) for o in outputs) == 3 and finish_reason(outputs[-1]) == "length"
    assert all(o.prompt_logprobs is None for o in outputs[1:])


def test_without_reuse_the_prefills_prompt_logprobs_ride_on_decodes_first_output():
    backend, pools = make_backend()
    rec = Recorder(pools, prompt_logprobs=PROMPT_LOGPROBS)
    # Presence penalties block reuse (kv_transfer/first_token.py): decode samples token 1.
    outputs = collect(backend, request("req-5", max_tokens=2, presence_penalty=0.5, prompt_logprobs=1))
    assert [args[1] for args in rec.sent["prefill"]] == [False]
    assert rec.requests("generate")["req-5"].sampling.prompt_logprobs is None
    assert rec.requests("generate")["req-5"].prompt_token_ids == (1, 2, 3)
    assert [o.request_id for o in outputs] == ["fake", "fake"]
    assert outputs[0].prompt_logprobs == PROMPT_LOGPROBS and outputs[1].prompt_logprobs is None


def test_abort_while_the_n_request_waits_for_its_prefill_reaches_the_prefill_replica():
    async def main():
        backend, pools = make_backend(hang_prefill=True)
        task = asyncio.ensure_future(anext(backend.generate(request("req-6", n=2, temperature=0.8, max_tokens=4))))
        await asyncio.sleep(0.05)
        await backend.abort("req-6")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(0.05)
        return backend, pools

    backend, pools = asyncio.run(main())
    assert pools.prefill.replica_of("abort", "req-6-s0") == pools.prefill.replica_of("prefill", "req-6-s0")
    assert len(pools.prefill.replica_of("abort", "req-6-s0")) == 1
    assert pools.decode.calls == []
    assert backend.hops._in_flight == {} and backend.hops._samples == {}


def test_n_samples_the_decider_keeps_local_skip_the_prefill_pool():
    from tests.unit.test_decider_path import make_backend as decider_backend

    backend, pools = decider_backend(queued_prompt_tokens=20_000)
    req = EngineRequest("req-7", tuple(range(300)), SamplingParams(n=2, temperature=0.8, max_tokens=3), tier=TIER)
    outputs = collect(backend, req)
    assert pools.prefill.calls == []
    assert [r for rid in ("req-7-s0", "req-7-s1") for r in pools.decode.replica_of("generate", rid)] == ["d0", "d0"]
    assert sum(len(new_token_ids(o)) for o in outputs) == 6 and outputs[-1].finished


def test_without_a_handoff_each_samples_decode_computes_its_prompt_logprobs():
    backend, pools = make_backend(hang_prefill=True, prefill_timeout_s=0.05)
    rec = Recorder(pools)
    decoded = {}  # request_id → the prompt logprobs its decode's first output carried
    stream_of = rec._stream

    def stream(inner, rid):  # a decode that computed the prompt's logprobs itself, as asked
        async def outputs():
            first = True
            async for output in stream_of(inner, rid):
                if first and rec.requests("generate")[rid].sampling.prompt_logprobs:
                    output.prompt_logprobs = decoded[rid] = [None, {rid: -1.0}]
                first = False
                yield output
        return outputs()

    rec._stream = stream
    outputs = collect(backend, request("req-8", n=2, temperature=0.8, max_tokens=2, prompt_logprobs=1))
    assert [r.sampling.prompt_logprobs for r in rec.requests("generate").values()] == [1, 1]
    for i in range(2):
        of_sample = [o.prompt_logprobs for o in outputs if o.outputs[0].index == i]
        assert of_sample == [decoded[f"req-8-s{i}"], None], i
