"""Migration (router/pd/migration.py): the pure rules, the state machine step by step, and the
P/D path over fake Serve pools whose decode replicas die mid-answer (tests/support/fakes.py,
`die_after`, `positional`: a token is its position, so a continued answer equals an
uninterrupted one only if no token is lost or sent twice)."""

from __future__ import annotations

import asyncio
import random

import pytest
from ray.exceptions import ActorDiedError
from vllm import SamplingParams
from vllm.sampling_params import StructuredOutputsParams

from cluster.protocol import EngineRequest
from cluster.types import TierPools
from router.openai.errors import too_many_requests
from router.pd import migration as migration_module
from router.pd.migration import Migration, continuation, failure_of, refusal
from router.pd.path import DisaggregatedBackend
from router.routing.decider import PDDecider
from router.routing.directory import PoolDirectory
from router.routing.service import KVRouter
from tests.support.fakes import FakeServePool, RecordingMetric, fake_output

TIER = "interactive"
PROMPT = (3, 4, 5, 6, 7)


@pytest.fixture
def counted(monkeypatch) -> RecordingMetric:
    metric = RecordingMetric()
    monkeypatch.setattr(migration_module, "MIGRATIONS", metric)
    return metric


def counts(metric: RecordingMetric) -> list[tuple[str, str]]:
    return [(labels["result"], labels["reason"]) for labels, kind, _ in metric.calls if kind == "inc"]


def request(rid: str = "r", **sampling) -> EngineRequest:
    sampling.setdefault("max_tokens", 10)
    sampling.setdefault("temperature", 0)
    return EngineRequest(rid, PROMPT, SamplingParams(**sampling), tier=TIER)


# -- the rules ------------------------------------------------------------------------------

@pytest.mark.parametrize("sampling", [
    {"temperature": 0}, {"temperature": 0, "seed": 3}, {"temperature": 1.0}, {"temperature": 0.7, "top_p": 0.9},
    {"temperature": 0, "repetition_penalty": 1.2}, {"temperature": 0, "stop": ["\n"]},
    {"temperature": 0, "logit_bias": {7: 2.0}}, {"temperature": 0, "extra_args": {"fake_token_s": 0.1}},
    {"temperature": 0, "stop_token_ids": [9]}, {"temperature": 0, "min_tokens": 4},
    {"temperature": 0, "stop": ["END"]},  # the gateway checks it across the cut (test_answer_text.py)
])
def test_greedy_and_unseeded_sampling_may_migrate(sampling):
    assert refusal(SamplingParams(**sampling)) is None


@pytest.mark.parametrize("sampling, reason", [
    ({"temperature": 1.0, "seed": 3}, "seeded_sampling"),
    ({"temperature": 0, "structured_outputs": StructuredOutputsParams(json={"type": "object"})}, "structured_output"),
    ({"temperature": 0, "presence_penalty": 0.5}, "penalties"),
    ({"temperature": 0, "frequency_penalty": 0.5}, "penalties"),
    ({"temperature": 0, "bad_words": ["no way"]}, "bad_words"),
    ({"temperature": 0, "extra_args": {"my_logits_processor": 1}}, "extra_args"),
])
def test_what_the_engine_holds_state_for_is_refused_with_its_reason(sampling, reason):
    assert refusal(SamplingParams(**sampling)) == reason
    assert reason in migration_module.REFUSALS  # declared at 0 (router/request_metrics.py)


def test_the_continuation_is_the_prompt_and_the_tokens_sent_with_the_bounds_reduced():
    original = request(max_tokens=10, min_tokens=6, temperature=0.5, top_p=0.8, prompt_logprobs=2,
                       extra_args={"kv_transfer_params": {"x": 1}, "fake_token_s": 0.1})
    cont = continuation(original, [40, 41, 42, 43], 1)
    assert cont.request_id == "r-m1" and cont.tier == TIER
    assert cont.prompt_token_ids == PROMPT + (40, 41, 42, 43)
    s = cont.sampling
    assert (s.max_tokens, s.min_tokens, s.prompt_logprobs) == (6, 2, None)
    assert (s.temperature, s.top_p, s.extra_args) == (0.5, 0.8, {"fake_token_s": 0.1})
    # The original is untouched: its samples or a later continuation start from it.
    assert original.sampling.max_tokens == 10 and original.sampling.min_tokens == 6
    assert continuation(original, list(range(8)), 2).sampling.min_tokens == 0


def test_failures_are_named_for_the_counter():
    from router.pd.channels import ChannelLost

    assert failure_of(ActorDiedError()) == "replica_died"
    assert failure_of(ChannelLost("x")) == "stream_lost"
    assert failure_of(RuntimeError("x")) == "error"
    assert failure_of(None) == "stream_ended"
    assert set(map(failure_of, (ActorDiedError(), None, RuntimeError()))) <= set(migration_module.FAILURES)


# -- the state machine ----------------------------------------------------------------------

def out(rid: str, tokens, cumulative=None, finished=False):
    return fake_output(rid, "".join(f"{t} " for t in tokens), tokens, "length" if finished else None, cumulative)


def test_the_state_machine_accounts_every_token_across_cuts(counted):
    m = Migration(request(max_tokens=10, min_tokens=5), limit=2)
    m.ran_on("d0")
    for i, t in enumerate([50, 51, 52]):
        m.sent(out("r", [t], -1.0 * (i + 1)))
    cont = m.failed(ActorDiedError())
    assert cont.request_id == "r-m1" and cont.prompt_token_ids == PROMPT + (50, 51, 52)
    assert (cont.sampling.max_tokens, cont.sampling.min_tokens) == (7, 2)
    assert m.exclude == {"d0"} and m.current_id == "r-m1"
    m.ran_on("d1")
    # The continuation's outputs, as the client's: its id, the whole answer's cumulative logprob.
    o = m.sent(out("r-m1", [53, 54], -2.0))
    assert o.request_id == "r" and o.outputs[0].cumulative_logprob == -5.0
    cont2 = m.failed(RuntimeError("stream broke"))
    assert cont2.request_id == "r-m2" and cont2.prompt_token_ids == PROMPT + (50, 51, 52, 53, 54)
    assert (cont2.sampling.max_tokens, cont2.sampling.min_tokens) == (5, 0)
    assert m.exclude == {"d0", "d1"}
    o = m.sent(out("r-m2", [55, 56, 57, 58, 59], -5.0, finished=True))
    assert o.outputs[0].cumulative_logprob == -10.0 and m.finished
    assert m.tokens == list(range(50, 60))
    assert counts(counted) == [("continued", "replica_died"), ("continued", "error")]


def test_the_limit_and_the_cases_that_are_not_migrations(counted):
    m = Migration(request(), limit=1)
    assert m.failed(ActorDiedError()) is None  # nothing sent yet: the hop's own retry/error, not a migration
    m.sent(out("r", [50]))
    assert m.failed(too_many_requests("busy")) is None  # a deliberate refusal (429) stays one
    assert counts(counted) == []
    assert m.failed(ActorDiedError()) is not None
    m.sent(out("r-m1", [51]))
    assert m.failed(ActorDiedError()) is None
    assert counts(counted) == [("continued", "replica_died"), ("refused", "limit")]
    off = Migration(request(), limit=0)
    off.sent(out("r", [50]))
    assert off.failed(None) is None and counts(counted)[-1] == ("refused", "limit")
    seeded = Migration(request(temperature=1.0, seed=1), limit=2)
    seeded.sent(out("r", [50]))
    assert seeded.failed(ActorDiedError()) is None and counts(counted)[-1] == ("refused", "seeded_sampling")


# -- the P/D path over fake pools -----------------------------------------------------------

def make_backend(decode_replicas=("d0", "d1"), limit: int = 2):
    dirs = {(TIER, pool): PoolDirectory() for pool in ("prefill", "decode")}
    pools = TierPools(prefill=FakeServePool(dirs[(TIER, "prefill")], ["p0"]),
                      decode=FakeServePool(dirs[(TIER, "decode")], list(decode_replicas)))
    pools.prefill.positional = pools.decode.positional = True
    router = KVRouter(directories=dirs, index=None, weights={"load": 1.0}, decider=PDDecider(),
                      subscribe=False, rng=random.Random(7))
    backend = DisaggregatedBackend(pools={TIER: pools}, decode_streams="per_request", prefill_timeout_s=5,
                                   router=router, first_token_reuse=False, migration_limit=limit)
    return backend, pools, dirs


def expected(n: int) -> list[int]:
    return list(range(len(PROMPT), len(PROMPT) + n))  # positional: token k is at position len(PROMPT) + k


async def collect(backend, req) -> dict[int, list[int]]:
    tokens: dict[int, list[int]] = {}
    finished = []
    async for o in backend.generate(req):
        assert "-m" not in o.request_id  # never a continuation's own id
        for c in o.outputs:
            tokens.setdefault(c.index, []).extend(c.token_ids)
        finished.append(o.finished)
    assert finished[-1] and not any(finished[:-1])  # one stream, finished once, at its end
    return tokens


def assert_no_leak(backend, dirs):
    hops = backend.hops
    assert hops._in_flight == {} and hops._samples == {}
    assert all(not d._pins for d in dirs.values()), [d._pins for d in dirs.values()]
    assert all(w.in_flight == 0 for pool in ("prefill", "decode") for w in backend._router.workers(TIER, pool))


def test_a_decode_replica_dying_mid_answer_costs_a_continuation_not_the_answer(counted):
    backend, pools, dirs = make_backend()
    pools.decode.die_after = {"d0": 4, "d1": 4}
    tokens = asyncio.run(collect(backend, request(max_tokens=10)))
    # Died on the first decode replica after 4 tokens, on the second after 4 more: the rest
    # ran whole on the prefill replica (no decode replica left that has not failed).
    assert tokens == {0: expected(10)}
    assert counts(counted) == [("continued", "replica_died")] * 2
    first, second = (pools.decode.replica_of("generate", rid) for rid in ("r", "r-m1"))
    assert len(first) == len(second) == 1 and first != second
    assert pools.prefill.replica_of("generate", "r-m2") == ["p0"]  # whole on prefill
    assert_no_leak(backend, dirs)


def test_past_the_limit_the_failure_is_the_requests(counted):
    backend, pools, dirs = make_backend(limit=1)
    pools.decode.die_after = {"d0": 3, "d1": 3}

    async def main():
        got = []
        with pytest.raises(ActorDiedError):
            async for o in backend.generate(request(max_tokens=10)):
                got.extend(o.outputs[0].token_ids)
        return got

    assert asyncio.run(main()) == expected(6)
    assert counts(counted) == [("continued", "replica_died"), ("refused", "limit")]
    assert_no_leak(backend, dirs)


def test_a_request_that_may_not_migrate_fails_as_before_counted(counted):
    backend, pools, dirs = make_backend()
    pools.decode.die_after = {"d0": 3, "d1": 3}

    async def main():
        with pytest.raises(ActorDiedError):
            async for _ in backend.generate(request(max_tokens=10, temperature=1.0, seed=5)):
                pass

    asyncio.run(main())
    assert counts(counted) == [("refused", "seeded_sampling")]
    assert_no_leak(backend, dirs)


def test_n_samples_continue_each_as_its_own_request(counted):
    backend, pools, dirs = make_backend(decode_replicas=("d0", "d1", "d2"))
    req = request(max_tokens=8, n=2, temperature=1.0)
    holder = {}

    async def main():
        # The samples run on one decode replica (samples.py): let it die after 3 tokens of each.
        pools.decode.die_after = {}
        original = pools.decode.route

        def route(method, rid):
            replica = original(method, rid)
            if method == "generate" and "-m" not in rid:
                holder.setdefault("d", replica)
                pools.decode.die_after = {holder["d"]: 3}
            return replica

        pools.decode.route = route
        return await collect(backend, req)

    tokens = asyncio.run(main())
    assert tokens == {0: expected(8), 1: expected(8)}
    assert counts(counted) == [("continued", "replica_died")] * 2
    for i in (0, 1):
        (where,) = pools.decode.replica_of("generate", f"r-s{i}-m1")
        assert where != holder["d"]  # each sample's continuation away from the replica that died
    assert_no_leak(backend, dirs)


def test_an_abort_reaches_the_continuation_where_it_runs(counted):
    backend, pools, dirs = make_backend(decode_replicas=("d0", "d1", "d2"))
    pools.decode.die_after = {r: 2 for r in pools.decode.replica_ids}

    async def main():
        it = backend.generate(request(max_tokens=100))
        got = [await anext(it) for _ in range(3)]  # 2 tokens, then the continuation's first
        pools.decode.die_after = {}
        await backend.abort("r")
        await it.aclose()
        return got

    got = asyncio.run(main())
    assert [t for o in got for t in o.outputs[0].token_ids] == expected(3)
    (where,) = pools.decode.replica_of("generate", "r-m1")
    assert pools.decode.replica_of("abort", "r-m1") == [where]
    assert_no_leak(backend, dirs)


def test_the_limit_is_configured_within_bounds():
    from pydantic import ValidationError

    from cluster.config.services import KVTransferConfig

    assert KVTransferConfig().migration_limit == 2 and KVTransferConfig(migration_limit=0).migration_limit == 0
    for bad in (-1, 9):
        with pytest.raises(ValidationError):
            KVTransferConfig(migration_limit=bad)
