"""One real Ray Serve graph for the whole folder: the gateway (vLLM's OpenAI app over the
tiny model's tokenizer), the KV-aware router and both pools, built by cluster/app.py
build_app exactly as `tandem run` builds it, with FakeEngine (cluster/engine/fake.py) as
every replica's engine. No vLLM engine, no NIXL: seconds per test.

Ports: the gateway and Ray's metrics export get free ports; Ray's own (GCS, raylet, agents)
are Ray's choice for a new local cluster. Nothing here uses tests/integration's fixed ports.

Order: this folder's tests run first in a session. Its Ray instance must be gone before
tests/integration starts its own cluster (one driver connects to one Ray cluster), and the
integration cluster lives until the session ends; so the fixture is package-scoped (torn
down after this folder's last test) and `pytest_collection_modifyitems` puts the folder's
tests ahead of the others (a stable sort: the others keep their order). `make test` runs
each folder in its own pytest process (unit, serve, integration); the sort is for a bare
`pytest`. Within the folder, the test that scales the prefill pool (`scales_prefill`) and the
one that starts its own Ray (`own_ray`) run last, in that order; every test here is marked
`serve` here, not per file. The test that kills decode replicas (`replaces_decode`), the one
that scales decode down and back (`drains_decode`) and the one that redeploys the graph with a
changed config, replacing every replica (`redeploys`), run before both, in that order.

Start-up, on 2 cores (most of this folder's time): `serve_session` imports the app's modules
(vLLM's OpenAI server, ~9 s of CPU) in a thread while Ray and Serve start (mostly waiting on
their own processes), then deploys the graph from that thread; tests that need only Serve
(test_deploy_bound.py, first by name) run meanwhile, and `graph` waits for the deploy.
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import TEST_STATE
from tests.support.serve_graph import AUTOSCALING_LOG, ServeGraph, free_port, serve_config

HERE = Path(__file__).resolve().parent
# The other tests count on one prefill replica; the benchmark's Ray should overlap this folder's least.
LAST = ("replaces_decode", "drains_decode", "redeploys", "scales_prefill", "own_ray")


def pytest_collection_modifyitems(config, items):
    def here(item) -> bool:
        return Path(str(item.fspath)).resolve().parent == HERE

    def rank(item) -> tuple[bool, int]:
        names = item.fixturenames if here(item) else ()
        return not here(item), next((i for i, name in enumerate(LAST, 1) if name in names), 0)

    for item in items:
        if here(item):
            item.add_marker(pytest.mark.serve)
    items.sort(key=rank)


@pytest.fixture(scope="package")
def serve_session(tiny_model_dir):
    """Ray and Serve started, the graph deploying: yields the deploy's Future (its ServeGraph
    once the gateway answers /health, or its error)."""
    from cluster.local import LOCAL_RAY_ENV, _reload_ray_settings, ensure_ray_token, ray_auth_env, run_app, wait_until_ready

    env = {**LOCAL_RAY_ENV, "VLLM_CACHE_ROOT": str(TEST_STATE / "cache" / "vllm")}
    os.environ.update(env)
    os.environ.update(ray_auth_env(ensure_ray_token(TEST_STATE / "ray_auth_token")))

    import ray
    from ray import serve

    from cluster.app import build_app, proxy_location
    from cluster.types import APP_NAME
    from cluster.engine.fake import FakeEngine

    if ray.is_initialized():  # a driver connects to one Ray cluster; ours is a new one
        ray.shutdown()
    _reload_ray_settings()
    cfg = serve_config(tiny_model_dir, free_port(), free_port())
    url = f"http://127.0.0.1:{cfg.gateway.port}"
    vocab = json.loads((Path(tiny_model_dir) / "config.json").read_text())["vocab_size"]
    AUTOSCALING_LOG.parent.mkdir(parents=True, exist_ok=True)
    AUTOSCALING_LOG.unlink(missing_ok=True)
    started = time.monotonic()

    def deploy(building: Future) -> ServeGraph:
        # The external scaler: test_drain.py sets the decode pool's replica count.
        run_app(building.result(), APP_NAME, started + 240, t0=started, external_scaler=True)
        wait_until_ready(url, started + 240, poll_s=0.25)
        print(f"\n[tests/serve] Serve graph with FakeEngine ready in {time.monotonic() - started:.1f} s")
        return ServeGraph(url=url, cfg=cfg, vocab_size=vocab)

    # One thread, in order: build_app (it imports the deployments' modules) while Ray and Serve
    # start here, then the deploy, while this folder's first tests run.
    pool = ThreadPoolExecutor(1, thread_name_prefix="tests-serve")
    building = pool.submit(build_app, cfg, engine_cls=FakeEngine)
    try:
        # No runtime_env: `env` reaches every Ray process from os.environ (set above, before Ray
        # starts); with one, each worker starts through Ray's setup_worker.py first (~0.7 s of CPU).
        # address="local": a new instance, never the one a `ray start` left in /tmp/ray/ray_current_cluster
        # (tests/integration's, or another run's on this machine: seen in CI).
        ray.init(address="local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
                 _metrics_export_port=cfg.ray.metrics_export_port, logging_level="warning")
        serve.start(proxy_location=proxy_location(cfg), http_options={"host": "127.0.0.1", "port": cfg.gateway.port},
                    logging_config={"log_level": "WARNING"})
        yield pool.submit(deploy, building)
    finally:
        # The deploy ends by its own deadline; let it, so nothing polls a Ray that is gone.
        pool.shutdown()
        _end_ray()


def _end_ray() -> None:
    """Ray down with every replica in it. Not serve.shutdown() first: it stops each replica
    gracefully (Serve's 2 s drain loop and more: ~5 s here) for a cluster about to go. What it
    also does in this process is done here: the cached deployment handles stop, and Serve's
    client is dropped (the next cluster's first driver job has the same id, so Serve would take
    the stale client for current and talk to a dead controller: tests/integration starts next)."""
    import ray
    from ray.serve import context

    try:
        if context._global_client is not None:
            context._global_client.shutdown_cached_handles()
    finally:
        ray.shutdown()
        context._disconnect()


@pytest.fixture(scope="package")
def graph(serve_session) -> ServeGraph:
    """The graph, ready: every replica started and the gateway answering."""
    return serve_session.result()



@pytest.fixture
def replaces_decode() -> None:
    """Used by a test that kills decode replicas (Serve replaces them): after the tests counting on both."""


@pytest.fixture
def drains_decode() -> None:
    """Used by a test that scales the decode pool down (and back): after the tests counting on both."""


@pytest.fixture
def redeploys() -> None:
    """Used by a test that redeploys the graph (every replica replaced; the config it leaves
    differs in a field no test reads): after the tests above, before the prefill scaling one."""


@pytest.fixture
def scales_prefill() -> None:
    """Used by a test that scales the prefill pool: it runs after those counting on one replica."""


@pytest.fixture
def own_ray() -> None:
    """For a test that starts a Ray instance of its own beside this folder's."""
