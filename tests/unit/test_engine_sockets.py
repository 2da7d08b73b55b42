"""Engine and local Ray sockets stay on the node's own address (issue 16): the KV-event
publisher binds the cluster address (vLLM's real ZmqEventPublisher, read back from the OS),
the engine's environment says which address, a wildcard is refused, and a local Ray cluster
gets token auth from a 0600 file."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from types import SimpleNamespace

import psutil
import pytest

from cluster.config import EngineConfig, KVTransferConfig
from cluster.engine.base import EngineSpec
from cluster.engine.vllm import _kv_events_config, bound_kv_events, engine_environment
from cluster.local import ensure_ray_token, is_loopback_address, ray_auth_env
from cluster.engine.replica import node_address
from kv_transfer.nixl import NixlEndpoint


def _spec(**kw) -> EngineSpec:
    base = dict(model_path="/m", served_name="m", dtype="float32", max_model_len=64, engine=EngineConfig(),
                kv_role="kv_producer", kv=KVTransferConfig(), nixl=NixlEndpoint("127.0.0.1", 5000),
                cpu_binding=None, on_gpu=False, worker_id="w")
    return EngineSpec(**{**base, **kw})


def _listening_here() -> set[tuple[str, int]]:
    return {(c.laddr.ip, c.laddr.port) for c in psutil.Process().net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN}


def test_the_publisher_binds_the_node_address_only(monkeypatch):
    """What the engine configures, run through vLLM's own publisher: both sockets bound on
    VLLM_HOST_IP (not 0.0.0.0), ports from the OS, reported back, and events flow."""
    import msgspec
    import zmq
    from vllm.distributed.kv_events import BlockStored, KVEventBatch, ZmqEventPublisher

    monkeypatch.setenv("VLLM_HOST_IP", "127.0.0.1")
    cfg = _kv_events_config("127.0.0.1")
    assert (cfg.endpoint, cfg.replay_endpoint) == ("tcp://*:0", "tcp://*:0")
    pub = ZmqEventPublisher(0, endpoint=cfg.endpoint, replay_endpoint=cfg.replay_endpoint)
    try:
        bound = bound_kv_events({0: pub.get_publisher_config()}, "127.0.0.1")
        ports = {int(e.rsplit(":", 1)[1]) for e in (bound.endpoint, bound.replay_endpoint)}
        mine = {port: ip for ip, port in _listening_here()}
        assert {mine[p] for p in ports} == {"127.0.0.1"}, mine
        sub = zmq.Context.instance().socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(bound.endpoint)
        event = BlockStored(block_hashes=[1], parent_block_hash=None, token_ids=[1, 2], block_size=2,
                            lora_id=None, medium="GPU", lora_name=None)
        for _ in range(50):  # PUB drops what it sends before the subscription arrives
            pub.publish(KVEventBatch(ts=0.0, events=[event]))
            if sub.poll(100):
                break
        _topic, _seq, payload = sub.recv_multipart()
        assert msgspec.msgpack.decode(payload)[1][0]["type"] == "BlockStored"
        sub.close(linger=0)
    finally:
        pub.shutdown()


def test_kv_events_are_off_without_a_host():
    assert _kv_events_config(None) is None


def test_engine_environment_names_the_bind_address():
    assert engine_environment(_spec(kv_events_host="10.1.2.3"))["VLLM_HOST_IP"] == "10.1.2.3"
    assert "VLLM_HOST_IP" not in engine_environment(_spec())
    assert engine_environment(_spec(kv_events_host="127.0.0.1"))["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "127.0.0.1"


@pytest.mark.parametrize("endpoint, replay", [
    ("tcp://0.0.0.0:5557", "tcp://127.0.0.1:5558"),  # all interfaces
    ("tcp://127.0.0.1:5557", None),                   # no replay socket
    ("tcp://127.0.0.1:0", "tcp://127.0.0.1:5558"),   # never bound
    ("tcp://10.0.0.9:5557", "tcp://10.0.0.9:5558"),  # another address
])
def test_bound_endpoints_off_the_node_address_are_refused(endpoint, replay):
    with pytest.raises(RuntimeError, match="not bound on 127.0.0.1"):
        bound_kv_events({0: SimpleNamespace(endpoint=endpoint, replay_endpoint=replay)}, "127.0.0.1")


def test_bound_endpoints_accept_ipv6_and_need_a_publisher():
    v6 = SimpleNamespace(endpoint="tcp://[fd00::1]:5557", replay_endpoint="tcp://[fd00::1]:5558")
    assert bound_kv_events({0: v6}, "fd00::1").replay_endpoint == "tcp://[fd00::1]:5558"
    with pytest.raises(RuntimeError, match="no KV-event publisher"):
        bound_kv_events({}, "127.0.0.1")


def test_node_address_is_the_configured_one_or_rays_and_never_a_wildcard():
    assert node_address("127.0.0.1", lambda: "unused") == "127.0.0.1"
    assert node_address("auto", lambda: "10.4.0.7") == "10.4.0.7"
    for wildcard in ("0.0.0.0", "::", "*", ""):
        with pytest.raises(ValueError, match="one address"):
            node_address(wildcard, lambda: "unused")
    with pytest.raises(ValueError):
        node_address("auto", lambda: "0.0.0.0")


@pytest.mark.parametrize("address, loopback", [
    (None, True), ("127.0.0.1:6391", True), ("localhost:6379", True), ("[::1]:6379", True),
    ("ray://127.0.0.1:10001", True), ("10.0.0.5:6379", False), ("ray-head.svc:6379", False),
    ("auto", False),
])
def test_loopback_ray_addresses(address, loopback):
    assert is_loopback_address(address) is loopback


def test_the_local_ray_token_is_made_once_and_private(tmp_path):
    path = tmp_path / "state" / "ray_auth_token"
    made = ensure_ray_token(path)
    token = made.read_text()
    assert len(token) == 64 and int(token, 16) >= 0  # 256 bits, hex, like `ray get-auth-token --generate`
    assert stat.S_IMODE(made.stat().st_mode) == 0o600
    assert ensure_ray_token(path).read_text() == token  # kept across runs: drivers keep working
    path.write_text("")
    assert len(ensure_ray_token(path).read_text()) == 64  # an empty file is not a token
    path.chmod(0o644)
    assert stat.S_IMODE(ensure_ray_token(path).stat().st_mode) == 0o600
    assert ray_auth_env(made) == {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(made)}


def test_ray_settings_set_after_ray_was_imported_take_effect():
    """A benchmark imports ray before LocalCluster sets its variables: the driver must still
    keep 127.0.0.1 and use token auth (in a fresh interpreter: Ray reads them at import)."""
    code = """
import os, ray
from ray._private import ray_constants
from ray._raylet import AuthenticationMode, get_authentication_mode
os.environ.update({"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "token"})
before = (ray_constants.ENABLE_RAY_CLUSTER, get_authentication_mode() == AuthenticationMode.TOKEN)
from cluster.local import _reload_ray_settings
_reload_ray_settings()
print(before, (ray_constants.ENABLE_RAY_CLUSTER, get_authentication_mode() == AuthenticationMode.TOKEN))
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "RAY_ENABLE"))}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[-2] == "(True, False) (False, True)"


def test_serve_replica_grpc_is_narrowed_to_a_loopback_node_address_only(monkeypatch):
    from ray.serve._private import replica

    from cluster.serve_patch import bind_replica_grpc_on_node_address

    calls = []
    monkeypatch.setattr(replica, "add_port_to_grpc_server", lambda server, address: calls.append(address) or 1)
    assert bind_replica_grpc_on_node_address(lambda: "10.2.3.4") is False  # Kubernetes: Serve's choice
    replica.add_port_to_grpc_server(None, "[::]:0")
    assert bind_replica_grpc_on_node_address(lambda: "127.0.0.1") is True
    assert bind_replica_grpc_on_node_address(lambda: "127.0.0.1") is True  # idempotent: wrapped once
    replica.add_port_to_grpc_server(None, "[::]:0")
    replica.add_port_to_grpc_server(None, "127.0.0.1:7000")
    assert calls == ["[::]:0", "127.0.0.1:0", "127.0.0.1:7000"]
    # The call Serve 2.60 makes when a replica starts: the one this narrows.
    import inspect

    assert 'add_port_to_grpc_server(self._server, "[::]:0")' in inspect.getsource(replica.Replica._on_initialized)


def test_the_pools_niceness_reaches_the_engine_on_cpu_only():
    assert engine_environment(_spec(engine=EngineConfig(cpu_niceness=3)))["TANDEM_ENGINE_NICE"] == "3"
    assert "TANDEM_ENGINE_NICE" not in engine_environment(_spec(on_gpu=True))
