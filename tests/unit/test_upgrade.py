"""A rolling upgrade's settings (cluster/app.py): which deployments surge (new replicas before
the old ones drain), how long a removed gateway drains its HTTP streams and that Serve's force
kill comes after it; and `tandem redeploy`'s choice of cluster. The upgrade itself under load:
tests/serve/test_redeploy.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from cluster import cli
from cluster.app import GATEWAY_SHUTDOWN_MARGIN_S, _pool_options, gateway_drain_s, gateway_options, surge_percent
from cluster.config import AdmissionConfig, ClusterConfig, PoolConfig, SLOConfig


def test_a_pool_surges_by_default_only_where_a_new_replica_always_fits():
    assert surge_percent(PoolConfig(num_cpus=0)) == 100
    # A replacement waiting for the CPU, GPU or resource an old replica holds would wait forever.
    assert surge_percent(PoolConfig(num_cpus=1)) == 0
    assert surge_percent(PoolConfig(num_cpus=0, num_gpus=1)) == 0
    assert surge_percent(PoolConfig(num_cpus=0, placement={"resources": {"big_node": 1}})) == 0
    assert surge_percent(PoolConfig(num_cpus=1, max_surge_percent=50)) == 50  # the operator knows there is room
    options = _pool_options(PoolConfig(num_cpus=0), "decode", SLOConfig(), AdmissionConfig(), 2048)
    assert options["max_surge_percent"] == 100


def test_the_gateway_surges_and_drains_its_streams_as_long_as_the_longest_pool_drain():
    cfg = ClusterConfig.model_validate({"model": {"path": "m", "max_model_len": 4096}, "tiers": {
        "interactive": {"slo": {"itl_s": 0.05}},  # decode: 4096 tokens at 50 ms
        "batch": {"decode": {"drain_timeout_s": 300}, "prefill": {"drain_timeout_s": 30}}}})
    assert gateway_drain_s(cfg) == 300
    options = gateway_options(cfg)
    assert options["max_surge_percent"] == 100
    # Serve force-kills past graceful_shutdown_timeout_s: after its own drain loop and ours.
    assert options["graceful_shutdown_timeout_s"] == 300 + GATEWAY_SHUTDOWN_MARGIN_S


def test_serve_takes_the_options_the_upgrade_sets():
    """Serve 2.60's public deployment options (a rename fails here, not at the first redeploy)."""
    from ray import serve

    @serve.deployment
    class Probe:
        pass

    cfg = ClusterConfig.model_validate({"model": {"path": "m"}})
    config = Probe.options(**gateway_options(cfg))._deployment_config
    assert config.max_surge_percent == 100 and config.graceful_shutdown_timeout_s == gateway_options(cfg)["graceful_shutdown_timeout_s"]


@pytest.fixture
def redeployed(tmp_path, monkeypatch):
    """`tandem redeploy` up to the cluster: the config it would deploy, and where."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m").mkdir()
    (tmp_path / "c.yaml").write_text(f"model: {{path: {tmp_path / 'm'}}}\n")
    seen = {}

    class Cluster:
        def __init__(self, cfg, **_):
            seen["cfg"] = cfg

        def redeploy(self, timeout_s):
            seen["timeout_s"] = timeout_s
            return 1.0

    monkeypatch.setattr("cluster.local.LocalCluster", Cluster)
    monkeypatch.setattr("cluster.engine.engine_args.check", lambda cfg, source: None)
    return SimpleNamespace(seen=seen, config=str(tmp_path / "c.yaml"), state=tmp_path / ".tandem")


def test_redeploy_goes_to_the_running_tandem_runs_cluster_or_the_one_named(redeployed, capsys):
    assert cli.main(["redeploy", "--config", redeployed.config]) == 2
    assert "no running cluster" in capsys.readouterr().err
    redeployed.state.mkdir()
    (redeployed.state / "ray_address").write_text("127.0.0.1:6123\n")  # what `tandem run` records
    assert cli.main(["redeploy", "--config", redeployed.config, "--timeout", "30"]) == 0
    assert redeployed.seen["cfg"].ray.address == "127.0.0.1:6123" and redeployed.seen["timeout_s"] == 30
    assert cli.main(["redeploy", "--config", redeployed.config, "--address", "10.0.0.5:6379"]) == 0
    assert redeployed.seen["cfg"].ray.address == "10.0.0.5:6379"
