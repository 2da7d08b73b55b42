"""One real cluster for the whole integration session: Ray, Ray Serve, two vLLM engines on
CPU (prefill producer, decode consumer), NIXL between them, the tiny float32 model.

Ray runs as two nodes on this machine, a head and a worker started with `ray start`, each
with one CPU and its own custom resource: prefill is placed on the head, decode on the
worker (pool placement), so every request's KV crosses between Ray nodes.

Order: tests that damage the shared cluster ask for a fixture that says so
(`replaces_replicas`, then `removes_prefill`) and run after the others, in that order; every
test in this folder is marked `integration` here, not per file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import TEST_STATE
from tests.support.direct_vllm import direct_vllm_url  # noqa: F401  (vLLM reference server, issue 15)
from tests.support.integration_cluster import (NODE_RESOURCES, METRICS_PORTS, OTLP_PORT, RAY_PORT, RAY_TOKEN,
                                               DASHBOARD_AGENT_PORT_WORKER, integration_config,
                                               make_lora_adapters, ray_cli)
from tests.support.otlp_receiver import OtlpReceiver

HERE = Path(__file__).resolve().parent
# The cluster survives the first (Serve replaces the killed replicas); the second leaves the
# prefill pool gone, so it is last of all.
DISRUPTIVE = ("replaces_replicas", "removes_prefill")


def _in_this_folder(item) -> bool:
    return HERE in Path(str(item.fspath)).resolve().parents


def pytest_collection_modifyitems(config, items):
    def rank(item) -> int:
        names = item.fixturenames if _in_this_folder(item) else ()
        return next((i for i, name in enumerate(DISRUPTIVE, 1) if name in names), 0)

    for item in items:
        if _in_this_folder(item):
            item.add_marker(pytest.mark.integration)
    items.sort(key=rank)


@pytest.fixture(scope="session")
def ray_address():
    """A two-node Ray cluster (`ray start` head + worker on this machine, both on 127.0.0.1,
    token auth on); stopped at the end."""
    address = f"127.0.0.1:{RAY_PORT}"
    common = ["--node-ip-address=127.0.0.1", "--num-cpus=1", "--object-store-memory=200000000",
              "--disable-usage-stats"]
    try:
        ray_cli("start", "--head", f"--port={RAY_PORT}", "--include-dashboard=false",
                f"--metrics-export-port={METRICS_PORTS['head']}",
                f"--resources={json.dumps(NODE_RESOURCES['head'])}", *common)
        # Both nodes share 127.0.0.1: the worker's dashboard agent needs a port of its own.
        ray_cli("start", f"--address={address}", f"--metrics-export-port={METRICS_PORTS['worker']}",
                f"--dashboard-agent-listen-port={DASHBOARD_AGENT_PORT_WORKER}",
                f"--resources={json.dumps(NODE_RESOURCES['worker'])}", *common, worker_node=True)
        yield address
    finally:
        ray_cli("stop", "--force")


@pytest.fixture(scope="session")
def otlp_receiver():
    """Where the cluster's processes and engines send their spans; up before the cluster starts."""
    receiver = OtlpReceiver(OTLP_PORT).start()
    yield receiver
    receiver.stop()


@pytest.fixture(scope="session")
def cluster(tiny_model_dir, ray_address, otlp_receiver):
    from cluster.local import LocalCluster

    make_lora_adapters(tiny_model_dir)
    local = LocalCluster(integration_config(tiny_model_dir, ray_address), cache_dir=TEST_STATE / "cache",
                         ray_token=RAY_TOKEN)
    local.start(ready_timeout_s=600)
    yield local
    local.stop()


@pytest.fixture(scope="session")
def base_url(cluster) -> str:
    return cluster.url


@pytest.fixture
def replaces_replicas() -> None:
    """Used by a test that kills engine replicas (Serve replaces them): it runs after the others."""


@pytest.fixture
def removes_prefill() -> None:
    """Used by a test that takes the interactive prefill pool away for a while: it runs last."""
