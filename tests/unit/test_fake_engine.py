"""FakeEngine (cluster/engine/fake.py) through the role halves, in-process: the prefill
replica's Handoff, decode's check against its own engine, pull vs recompute, aborts, and the
counters the replica hooks read. No Ray, no vLLM engine."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from cluster.config import EngineConfig, KVTransferConfig
from cluster.engine.base import EngineSpec
from cluster.engine.fake import FakeEngine, FakeKnobs, fake_tokens
from cluster.protocol import EngineRequest
from kv_transfer.nixl import NixlEndpoint

PROMPT = (11, 12, 13, 14, 15)


def _spec(role, **kw) -> EngineSpec:
    base = dict(model_path="/no-model", served_name="m", dtype="float32", max_model_len=64,
                engine=EngineConfig(block_size=16), kv_role=role, kv=KVTransferConfig(),
                nixl=NixlEndpoint("127.0.0.1", 5000), cpu_binding=None, on_gpu=False, worker_id=f"w-{role}")
    return EngineSpec(**{**base, **kw})


def _worker(cls_path: str, role: str, knobs: FakeKnobs = FakeKnobs(), **spec):
    """A deployment's class without Serve: its engine started as its constructor would."""
    import importlib

    module, name = cls_path.rsplit(".", 1)
    cls = getattr(importlib.import_module(module), name).func_or_class
    worker = object.__new__(cls)
    worker.tier = "interactive"
    worker.start_engine(FakeEngine(_spec(role, **spec), knobs), "interactive")
    worker._metrics.stop()
    return worker


def _request(rid="r", max_tokens=4, **extra) -> EngineRequest:
    from vllm import SamplingParams  # here, not at the top: the no-vLLM test imports this module

    return EngineRequest(rid, PROMPT, SamplingParams(max_tokens=max_tokens, extra_args=extra or None),
                         tier="interactive")


async def _decode(decode, request, handoff):
    return [t for out in [o async for o in decode.generate(request, handoff)] for t in out.token_ids]


def test_a_handoff_from_prefill_is_pulled_and_without_one_recomputed_with_the_same_answer():
    prefill = _worker("prefill_workers.deployment.PrefillWorker", "kv_producer")
    decode = _worker("decode_workers.deployment.DecodeWorker", "kv_consumer")
    result = asyncio.run(prefill.prefill(_request("a")))
    handoff = result.handoff
    assert handoff.producer == prefill.info.identity and handoff.producer_id == "w-kv_producer"
    assert handoff.params["remote_engine_id"] == "w-kv_producer" and handoff.lease_deadline is not None
    pulled = asyncio.run(_decode(decode, _request("a"), handoff))
    computed = asyncio.run(_decode(decode, _request("b"), None))
    assert pulled == computed == fake_tokens(list(PROMPT), 4, 256)
    stats = decode.stats()
    assert (stats.pulled, stats.recomputed) == (("a",), ("b",))
    assert (stats.prompt_tokens_transferred, stats.prompt_tokens_computed, stats.kv_transfers) == (5, 5, 1)


def test_decode_recomputes_a_handoff_from_an_engine_it_cannot_pull_from():
    prefill = _worker("prefill_workers.deployment.PrefillWorker", "kv_producer")
    decode = _worker("decode_workers.deployment.DecodeWorker", "kv_consumer", engine=EngineConfig(block_size=32))
    handoff = asyncio.run(prefill.prefill(_request())).handoff
    asyncio.run(_decode(decode, _request(), handoff))
    assert decode.stats().recomputed == ("r",) and decode.stats().kv_transfers == 0


def test_a_first_token_that_ends_the_answer_hands_nothing_over():
    prefill = _worker("prefill_workers.deployment.PrefillWorker", "kv_producer")
    result = asyncio.run(prefill.prefill(_request(max_tokens=1), first_token=True))
    assert result.first.finished and result.handoff is None
    going_on = asyncio.run(prefill.prefill(_request(max_tokens=3), first_token=True))
    assert not going_on.first.finished and going_on.handoff is not None
    assert list(going_on.first.token_ids) == fake_tokens(list(PROMPT), 1, 256)


def test_knobs_per_request_fail_the_prefill_or_the_pull():
    prefill = _worker("prefill_workers.deployment.PrefillWorker", "kv_producer")
    decode = _worker("decode_workers.deployment.DecodeWorker", "kv_consumer")
    with pytest.raises(RuntimeError, match="fail_prefill"):
        asyncio.run(prefill.prefill(_request(fake_fail_prefill=1)))
    handoff = asyncio.run(prefill.prefill(_request())).handoff
    asyncio.run(_decode(decode, _request(fake_fail_pull=1), handoff))
    stats = decode.stats()
    assert (stats.kv_failed_transfers, stats.kv_transfers, stats.recomputed) == (1, 0, ("r",))


def test_an_abort_ends_the_stream_and_is_recorded():
    decode = _worker("decode_workers.deployment.DecodeWorker", "kv_consumer", FakeKnobs(token_s=0.05))

    async def run():
        got = []
        async for out in decode.generate(_request(max_tokens=1000), None):
            got.append(out)
            if len(got) == 2:
                assert decode.stats().requests_running == 1
                await decode.abort("r")
        return got

    assert len(asyncio.run(run())) == 2
    stats = decode.stats()
    assert stats.aborted == ("r",) and stats.requests_running == 0 and stats.cancelled == ()

    async def leave_early():
        stream = decode.generate(_request("c", max_tokens=1000), None)
        await stream.__anext__()
        await stream.aclose()  # the caller went away: no abort, the stream closed

    asyncio.run(leave_early())
    assert decode.stats().cancelled == ("c",) and decode.stats().requests_running == 0


def test_the_replica_hooks_read_the_fake_engines_counters():
    decode = _worker("decode_workers.deployment.DecodeWorker", "kv_consumer")
    asyncio.run(_decode(decode, _request(max_tokens=5), None))
    routing = decode.routing_stats()
    assert routing["worker_id"] == "w-kv_consumer" and routing["block_size"] == 16 and routing["step_n"] == 4
    signals = decode.signals.sample()
    assert signals["ttft_count"] == 0  # the first sample is the baseline
    asyncio.run(_decode(decode, _request("s", max_tokens=2), None))
    assert decode.signals.sample()["ttft_count"] == 1
    decode.check_health()
    decode.engine.shutdown()
    decode.engine.shutdown()  # idempotent
    with pytest.raises(RuntimeError, match="dead"):
        decode.check_health()
    assert dataclasses.is_dataclass(decode.stats())


@pytest.mark.parametrize("salt", [None, "tenant-a"])
def test_kv_events_of_a_fake_engine_are_what_the_router_hashes(salt):
    """With kv_events_host set, FakeEngine publishes in vLLM's ZMQ protocol; the router's
    subscriber (router/kv_events.py), joining after the blocks were stored, catches up from
    the replay into a prefix index, and the blocks held are the ones the router computes for
    the prompt: full blocks only, once each."""
    import time

    from cluster.hashing import BlockHasher
    from router.kv_events import KVEventSubscriber
    from router.prefix_index.memory import MemoryPrefixIndex

    engine = FakeEngine(_spec("kv_producer", kv_events_host="127.0.0.1"))
    info = engine.start()
    assert info.kv_events is not None and info.kv_events.endpoint.startswith("tcp://127.0.0.1:")
    index = MemoryPrefixIndex()
    seen: list[str] = []
    sub = KVEventSubscriber("w-p", info.kv_events.endpoint, info.kv_events.replay_endpoint, index, seen.append)
    prompt = tuple(range(5, 5 + 40))  # 2 full blocks of 16 and 8 tokens never cached
    hasher = BlockHasher(info.cache.block_size, info.cache.hash_seed)
    hashes = hasher.hashes(prompt, salt)
    request = dataclasses.replace(_request("kv", max_tokens=1), prompt_token_ids=prompt, cache_salt=salt)
    try:
        # Published before the subscriber joined: it catches up from the publisher's replay.
        asyncio.run(engine.prefill(request))
        sub.start()
        deadline = time.monotonic() + 10
        while index.match(hashes) != {"w-p": 2} and time.monotonic() < deadline:
            time.sleep(0.05)
        assert index.match(hashes) == {"w-p": 2}
        asyncio.run(engine.prefill(request))
        assert index.match(hasher.hashes(prompt, "other-tenant" if salt is None else None)) == {}
        assert index.num_blocks() == 2  # prefilling the same prompt again stores nothing new
    finally:
        sub.stop()
        engine.shutdown()
        engine.shutdown()  # idempotent


def test_across_ray_a_fake_output_is_a_vllm_request_output_and_a_request_keeps_its_sampling():
    """What pickling (Ray's hop) makes of the wire objects: the gateway reads vLLM's own
    RequestOutput; the replica reads the request's length and xargs, and its full
    SamplingParams only where an engine unpickles them."""
    import pickle

    from vllm.outputs import RequestOutput

    from cluster.engine.fake import FakeOutput
    from cluster.protocol import ReceivedSampling, sampling_params

    decode = _worker("decode_workers.deployment.DecodeWorker", "kv_consumer")
    merged = decode.engine.merge_outputs([FakeOutput("r", (7,)), FakeOutput("r", (8, 9), "length")])
    assert merged == FakeOutput("r", (7, 8, 9), "length")
    out = pickle.loads(pickle.dumps(merged))
    assert isinstance(out, RequestOutput) and out.finished and out.request_id == "r"
    assert (list(out.outputs[0].token_ids), out.outputs[0].text, out.outputs[0].finish_reason) == ([7, 8, 9], "7 8 9 ", "length")

    request = _request(max_tokens=3, fake_token_s=0.5)
    received = pickle.loads(pickle.dumps(request))
    assert isinstance(received.sampling, ReceivedSampling)
    assert (received.sampling.max_tokens, received.sampling.extra_args) == (3, {"fake_token_s": 0.5})
    assert sampling_params(received) == request.sampling and sampling_params(request) is request.sampling
    assert pickle.loads(pickle.dumps(received)).sampling.params() == request.sampling  # sent on again


def test_a_replica_process_with_a_fake_engine_never_imports_vllm(tmp_path):
    """The point of FakeEngine in tests/serve: its replicas skip vLLM's import (~8 s of CPU
    each). A fresh process does what a decode replica does with a request from the gateway
    (pickled here, with vLLM): decode it, stream the answer, publish KV events, pickle the
    outputs back."""
    import pickle
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    (tmp_path / "request.pkl").write_bytes(pickle.dumps(_request(max_tokens=3)))
    script = textwrap.dedent(f"""
        import asyncio, pickle, sys
        from pathlib import Path
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
        from tests.unit.test_fake_engine import _worker
        decode = _worker("decode_workers.deployment.DecodeWorker", "kv_consumer", kv_events_host="127.0.0.1")
        request = pickle.loads(Path({str(tmp_path / "request.pkl")!r}).read_bytes())

        async def run():
            return [pickle.dumps(out) async for out in decode.generate(request, None)]

        assert asyncio.run(run())
        decode.engine.shutdown()
        print(sorted(m for m in sys.modules if m == "vllm" or m.startswith(("vllm.", "torch"))))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]"
