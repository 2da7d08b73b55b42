"""The handoff contract and per-replica NIXL wiring (no vLLM, no NIXL needed)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from cluster.config import KVTransferConfig
from kv_transfer.handoff import HANDOFF_VERSION, EngineIdentity, Handoff, HandoffMismatch, prefill_request_params
from kv_transfer.nixl import NixlEndpoint, claim_side_channel, kv_transfer_config, nixl_env

ROOT = Path(__file__).resolve().parents[2]

PARAMS = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "e1",
          "remote_block_ids": [1, 2], "remote_host": "127.0.0.1", "remote_port": 5601}
M = EngineIdentity(model="m", dtype="float32", kv_cache_dtype="auto", block_size=16)


def test_prefill_asks_to_keep_kv_for_remote_decode():
    assert prefill_request_params() == {"do_remote_decode": True, "do_remote_prefill": False}


def test_handoff_round_trip_returns_vllm_params_unchanged():
    handoff = Handoff.from_prefill(M, PARAMS, producer_id="p1")
    assert (handoff.version, handoff.producer, handoff.producer_id) == (HANDOFF_VERSION, M, "p1")
    assert handoff.decode_params(M) == PARAMS


@pytest.mark.parametrize("field, other", [("model", "other"), ("dtype", "bfloat16"), ("kv_cache_dtype", "fp8"),
                                          ("block_size", 32)])
def test_handoff_refuses_a_consumer_that_cannot_pull_the_producers_blocks(field, other):
    """The producer's identity (stamped by the prefill replica) against the consumer's own."""
    handoff = Handoff.from_prefill(M, PARAMS)
    consumer = dataclasses.replace(M, **{field: other})
    with pytest.raises(HandoffMismatch, match=f"{field} {getattr(M, field)!r}, this worker has {other!r}"):
        handoff.decode_params(consumer)


def test_handoff_refuses_another_version():
    stale = Handoff(version=HANDOFF_VERSION + 1, producer=M, params=PARAMS)
    with pytest.raises(HandoffMismatch, match="version"):
        stale.decode_params(M)


@pytest.mark.parametrize("params", [None, {}, {"do_remote_prefill": False}])
def test_handoff_needs_remote_prefill_params(params):
    with pytest.raises(HandoffMismatch, match="kv_producer"):
        Handoff.from_prefill(M, params)


def test_kv_transfer_config_per_role_and_device():
    cfg = KVTransferConfig()
    cpu = kv_transfer_config(cfg, "kv_producer", on_gpu=False)
    assert cpu["kv_connector"] == "NixlConnector" and cpu["kv_role"] == "kv_producer"
    assert cpu["kv_buffer_device"] == "cpu" and cpu["kv_load_failure_policy"] == "recompute"
    gpu = kv_transfer_config(cfg, "kv_consumer", on_gpu=True)
    assert gpu["kv_buffer_device"] == "cuda" and gpu["kv_role"] == "kv_consumer"
    assert kv_transfer_config(KVTransferConfig(buffer_device="cpu"), "kv_consumer", on_gpu=True)["kv_buffer_device"] == "cpu"


def test_nixl_env_is_per_replica_and_patch_is_cpu_only():
    cfg = KVTransferConfig()
    env = nixl_env(cfg, NixlEndpoint("127.0.0.1", 5123), on_gpu=False)
    assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5123"
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "127.0.0.1"
    assert env["UCX_TLS"] == "tcp,self,sm" and env["UCX_NET_DEVICES"] == "lo"
    assert env["TANDEM_NIXL_CPU_PATCH"] == "1"
    assert "TANDEM_NIXL_CPU_PATCH" not in nixl_env(cfg, NixlEndpoint("h", 1), on_gpu=True)
    assert "TANDEM_NIXL_CPU_PATCH" not in nixl_env(KVTransferConfig(cpu_patch=False), NixlEndpoint("h", 1), on_gpu=False)


def _listen(port: int, reuse: bool = False):
    import socket

    sock = socket.socket()
    if reuse:  # as ZMQ, and so vLLM's side-channel listener, binds
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen()
    return sock


def test_a_claimed_side_channel_port_is_in_range_and_the_engine_can_bind_it():
    endpoint = claim_side_channel("127.0.0.1", (20000, 32767))
    assert 20000 <= endpoint.port <= 32767 and endpoint.host == "127.0.0.1"
    _listen(endpoint.port, reuse=True).close()  # the claim does not stand in vLLM's way


def test_two_engines_never_claim_one_port_and_a_listened_port_is_skipped():
    first = claim_side_channel("127.0.0.1", (20000, 32767))
    low = first.port - 1 if first.port > 20000 else first.port + 1  # a two-port range with `first` in it
    span = (min(low, first.port), max(low, first.port))
    second = claim_side_channel("127.0.0.1", span)
    assert second.port == low
    with pytest.raises(RuntimeError, match="widen kv_transfer.side_channel_ports"):
        claim_side_channel("127.0.0.1", span)
    first.claim.close()  # the claim ends with its holder (its process, in a replica)
    assert claim_side_channel("127.0.0.1", span).port == first.port
    second.claim.close()
    listener = _listen(second.port)
    try:
        assert claim_side_channel("127.0.0.1", span).port == first.port  # something listens on second
    finally:
        listener.close()


def test_side_channel_ports_must_be_a_range_of_unprivileged_ports():
    for bad in ((32767, 20000), (80, 1000), (60000, 70000)):
        with pytest.raises(ValueError, match="side_channel_ports"):
            KVTransferConfig(side_channel_ports=bad)


def test_a_handoff_past_its_lease_is_refused():
    from kv_transfer.handoff import KV_LEASE_S, LEASE_MARGIN_S, HandoffExpired, lease_deadline

    deadline = lease_deadline(now=1000.0)
    assert deadline == 1000.0 + KV_LEASE_S - LEASE_MARGIN_S < 1000.0 + KV_LEASE_S
    handoff = Handoff.from_prefill(M, PARAMS, lease_deadline=deadline)
    assert handoff.decode_params(M, now=deadline - 0.1) == {**PARAMS, "tandem_lease_deadline": deadline}
    with pytest.raises(HandoffExpired, match="lease ended"):
        handoff.decode_params(M, now=deadline)
    assert Handoff.from_prefill(M, PARAMS).decode_params(M, now=1e12) == PARAMS  # no deadline: no check


def test_the_engines_lease_is_the_one_the_handoff_assumes():
    from kv_transfer.handoff import KV_LEASE_S

    for role in ("kv_producer", "kv_consumer"):
        assert kv_transfer_config(KVTransferConfig(), role, on_gpu=False)["kv_connector_extra_config"][
            "kv_lease_duration"] == KV_LEASE_S


class _RecordingEngine:
    def __init__(self):
        self.params = []

    def merge_outputs(self, outputs):
        from cluster.protocol import merge_outputs

        return merge_outputs(outputs)

    async def generate(self, request, params):
        from tests.support.fakes import fake_output

        self.params.append(params)
        yield fake_output(request.request_id, "x", [1], "length")

    def shutdown(self):  # the replica shuts its engine down when it is collected
        pass


def _decode_worker():
    from decode_workers.deployment import DecodeWorker

    worker = object.__new__(DecodeWorker.func_or_class)  # the class without Serve or an engine
    worker.tier, worker.engine = "interactive", _RecordingEngine()
    worker.info = SimpleNamespace(identity=M)
    return worker


def test_decode_recomputes_an_expired_handoff_and_counts_it(monkeypatch):
    import asyncio
    import time

    from vllm import SamplingParams

    from cluster.protocol import EngineRequest
    from decode_workers import deployment

    counted = []
    monkeypatch.setattr(deployment.HANDOFFS_EXPIRED, "labels", lambda **kw: type(
        "C", (), {"inc": lambda self, n=1: counted.append(kw)})())
    worker = _decode_worker()
    request = EngineRequest("r", (1, 2, 3), SamplingParams(max_tokens=1), tier="interactive")

    async def run(handoff):
        return [c async for c in worker.generate(request, handoff)]

    asyncio.run(run(Handoff.from_prefill(M, PARAMS, lease_deadline=time.time() - 1)))
    in_time = time.time() + 60
    asyncio.run(run(Handoff.from_prefill(M, PARAMS, lease_deadline=in_time)))
    asyncio.run(run(Handoff.from_prefill(dataclasses.replace(M, block_size=32), PARAMS)))
    # expired: computed locally; in time: pulled (the deadline along, for the engine's own
    # check); from an incompatible producer: computed locally
    assert worker.engine.params == [None, {**PARAMS, "tandem_lease_deadline": in_time}, None]
    assert counted == [{"tier": "interactive"}]


def test_prefill_stamps_the_lease_when_the_prefill_returns():
    import asyncio
    import contextlib
    import time

    from vllm import SamplingParams

    from cluster.protocol import EngineRequest, PrefillResult
    from kv_transfer.handoff import KV_LEASE_S, LEASE_MARGIN_S
    from prefill_workers.deployment import PrefillWorker

    class Engine:
        async def prefill(self, request, first_token=False):
            return PrefillResult(request.request_id, PARAMS, "p", 3)

        def shutdown(self):
            pass

    class Signals:
        def pending_prompt(self, n):
            return contextlib.nullcontext()

    worker = object.__new__(PrefillWorker.func_or_class)
    worker.engine, worker._signals = Engine(), Signals()
    worker.info = SimpleNamespace(identity=M, worker_id="p")
    before = time.time()
    result = asyncio.run(worker.prefill(EngineRequest("r", (1, 2, 3), SamplingParams(max_tokens=1), tier="interactive")))
    handoff = result.handoff  # made and stamped by the prefill replica, with its engine's identity
    assert (handoff.producer, handoff.producer_id, handoff.params) == (M, "p", PARAMS)
    assert before + KV_LEASE_S - LEASE_MARGIN_S <= handoff.lease_deadline <= time.time() + KV_LEASE_S - LEASE_MARGIN_S


def test_the_cpu_patch_gives_nixls_progress_thread_a_poll_timeout():
    """NIXL's Python API builds every agent config with pthrDelay 0 (a progress thread that
    spins a core); the patch sets its timeout on the config before the agent is made, and
    keeps the thread, which a READ over UCX's TCP needs on its target
    (`python -m kv_transfer.bench.progress`)."""
    from nixl._api import nixlBind

    from kv_transfer.cpu_patch import PROGRESS_POLL_ENV, agent_with_progress_delay

    made = []
    config = nixlBind.nixlAgentConfig()
    agent_with_progress_delay(lambda name, cfg: made.append((name, cfg.pthrDelay)), 10_000)("a", config)
    assert made == [("a", 10_000)]
    # The config's value reaches the engine's processes; null turns the thread off.
    endpoint = NixlEndpoint("127.0.0.1", 5123)
    assert nixl_env(KVTransferConfig(), endpoint, on_gpu=False)[PROGRESS_POLL_ENV] == "10000"
    assert nixl_env(KVTransferConfig(nixl_progress_poll_ms=None), endpoint, on_gpu=False)[PROGRESS_POLL_ENV] == "off"


def test_the_cpu_patch_applies_where_vllms_nixl_worker_makes_its_agent():
    """In a fresh process (the patch is process-wide), as vLLM's EngineCore loads it: the agent
    constructor vLLM's NIXL worker reaches is wrapped, its config keeps the progress thread,
    and an agent made the way vLLM makes one (num_threads 4) starts."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import importlib
        from kv_transfer import cpu_patch
        cpu_patch.apply()
        from vllm.distributed.kv_transfer.kv_connector.v1.nixl import base_worker
        bindings = importlib.import_module(base_worker.NixlWrapper.__module__).nixlBind
        assert bindings.nixlAgent.__wrapped__ is not None
        config = base_worker.nixl_agent_config(num_threads=4, capture_telemetry=True)
        assert config.enable_pthread
        agent = base_worker.NixlWrapper("patched", config)
        print("ok", type(agent).__name__)
    """)
    env = {**os.environ, "UCX_TLS": "tcp,self,sm", "UCX_NET_DEVICES": "lo", "TANDEM_NIXL_PROGRESS_POLL_US": "10000"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env,
                          cwd=str(ROOT))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("ok nixl_agent")


def test_the_decode_engine_refuses_a_pull_whose_lease_ended_while_the_request_waited():
    """The second check (kv_transfer/connector.py): the deadline rides in kv_transfer_params to
    the decode engine's scheduler, which takes a request off its queue maybe long after the
    decode replica took it; past the deadline the request is made local (no pull, no notify)."""
    from kv_transfer.handoff import lease_ended, without_remote_prefill

    params = Handoff.from_prefill(M, PARAMS, lease_deadline=1000.0).decode_params(M, now=990.0)
    assert not lease_ended(params, now=999.9)
    assert lease_ended(params, now=1000.0)
    local = without_remote_prefill(params)
    assert local["do_remote_prefill"] is False and not lease_ended(local, now=2000.0)
    assert params["do_remote_prefill"] is True  # a copy: the handoff's own params stay as they were
    assert not lease_ended(PARAMS, now=1e12) and not lease_ended(None) and not lease_ended({})
