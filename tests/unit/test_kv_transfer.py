"""The handoff contract and per-replica NIXL wiring (no vLLM, no NIXL needed)."""

from __future__ import annotations

import pytest

from cluster.config import KVTransferConfig
from kv_transfer.handoff import HANDOFF_VERSION, Handoff, HandoffMismatch, prefill_request_params
from kv_transfer.nixl import NixlEndpoint, free_port, kv_transfer_config, nixl_env

PARAMS = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "e1",
          "remote_block_ids": [1, 2], "remote_host": "127.0.0.1", "remote_port": 5601}


def test_prefill_asks_to_keep_kv_for_remote_decode():
    assert prefill_request_params() == {"do_remote_decode": True, "do_remote_prefill": False}


def test_handoff_round_trip_returns_vllm_params_unchanged():
    handoff = Handoff.from_prefill("m", PARAMS)
    assert handoff.version == HANDOFF_VERSION
    assert handoff.decode_params("m") == PARAMS


def test_handoff_refuses_other_model_and_version():
    handoff = Handoff.from_prefill("m", PARAMS)
    with pytest.raises(HandoffMismatch, match="model 'm'"):
        handoff.decode_params("other")
    stale = Handoff(version=HANDOFF_VERSION + 1, model="m", params=PARAMS)
    with pytest.raises(HandoffMismatch, match="version"):
        stale.decode_params("m")


@pytest.mark.parametrize("params", [None, {}, {"do_remote_prefill": False}])
def test_handoff_needs_remote_prefill_params(params):
    with pytest.raises(HandoffMismatch, match="kv_producer"):
        Handoff.from_prefill("m", params)


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


def test_free_port_is_bindable():
    import socket

    port = free_port("127.0.0.1")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
