"""The chart's RayService upgrade (deploy/helm/tandem): a change of rayClusterConfig makes KubeRay
start a new Ray cluster (upgradeStrategy NewCluster, set explicitly) and delete the old one
rayClusterDeletionDelaySeconds after the switch. The chart computes that delay in Helm
(_helpers.tpl tandem.oldClusterDeletionDelayS), a twin of cluster/app.py gateway_drain_s: these
tests render it for each preset and for variants that move each input, and compare it with
tandem's own Python, so a change on either side fails here, naming the case.
Rendering, schemas and presets: test_helm.py."""

from __future__ import annotations

import math

import pytest

helm = pytest.importorskip("helm_python", reason="helm-python-sdk is in the test extra")

from tests.unit.test_helm import CHART, PRESETS, by_kind, preset_values, render, serve_config  # noqa: E402

OLD_CLUSTER_MARGIN_S = 30  # the chart's tandem.oldClusterMarginS (_helpers.tpl)

# Each moves one input of the drain (the defaults preset underneath, Helm-merged).
VARIANTS = {
    "decode-drain-set": {"cluster": {"tiers": {"interactive": {"decode": {"drain_timeout_s": 1200}}}}},
    "prefill-drain-set": {"cluster": {"model": {"max_model_len": 256},
                                      "tiers": {"interactive": {"prefill": {"drain_timeout_s": 90.5}}}}},
    "second-tier-slower-itl": {"cluster": {"tiers": {"batch": {"slo": {"itl_s": 0.25}}}}},
    "larger-max-model-len": {"cluster": {"model": {"max_model_len": 32768}}},
    # The decode drain under the prefill's (MIN_DRAIN_S + PREFILL_LEASE_S): the prefill's wins.
    "short-context": {"cluster": {"model": {"max_model_len": 256}}},
    # Both under MIN_DRAIN_S: the decode pool's floor wins.
    "min-drain": {"cluster": {"model": {"max_model_len": 64},
                              "tiers": {"interactive": {"prefill": {"drain_timeout_s": 5}}}}},
    # Helm drops a null: the config has no max_model_len and ClusterConfig's default applies.
    "max-model-len-unset": {"cluster": {"model": {"max_model_len": None}}},
    # 1100 x 0.07 + 30 is 107.00000000000001 in Python's floats, 107 in Sprig's decimal arithmetic.
    "float-product": {"cluster": {"model": {"max_model_len": 1100},
                                  "tiers": {"interactive": {"slo": {"itl_s": 0.07}}}}},
}
CASES = {**{name: preset_values(name) for name in PRESETS}, **VARIANTS}


@pytest.fixture(scope="module")
def chart():
    return helm.Chart.load(CHART)


def _rayservice(docs) -> dict:
    [rayservice] = by_kind(docs, "RayService")
    return rayservice


@pytest.mark.parametrize("case", CASES)
def test_the_old_cluster_outlives_the_gateways_drain(chart, case):
    from cluster.app import gateway_drain_s
    from cluster.serve_entry import load_config

    docs = render(chart, CASES[case])
    cfg = load_config(serve_config(docs)["applications"][0]["args"])
    spec = _rayservice(docs)["spec"]
    # Rounded before ceil: Sprig computes in decimal, Python in binary floats, which can land one
    # ulp above a whole second (see "float-product"); a second's difference is not what this checks.
    wanted = math.ceil(round(gateway_drain_s(cfg) + OLD_CLUSTER_MARGIN_S, 6))
    assert spec["rayClusterDeletionDelaySeconds"] == wanted, (
        f"{case}: the chart's tandem.oldClusterDeletionDelayS ({spec['rayClusterDeletionDelaySeconds']}) differs "
        f"from cluster/app.py gateway_drain_s + {OLD_CLUSTER_MARGIN_S} ({wanted}): change both sides together")
    assert spec["upgradeStrategy"] == {"type": "NewCluster"}


def test_the_presets_delays(chart):
    """The numbers the chart's README quotes."""
    delays = {name: _rayservice(render(chart, preset_values(name)))["spec"]["rayClusterDeletionDelaySeconds"]
              for name in PRESETS}
    # 8192 tokens at 0.1 s (819.2 s) + 30; the CPU preset 2048 tokens (204.8 s) + 30.
    assert delays == {"defaults": 850, "cpu-dev": 235, "gpu-multinode": 850}


@pytest.mark.parametrize("seconds", [0, 3600])
def test_the_value_overrides_the_computed_delay(chart, seconds):
    spec = _rayservice(render(chart, {"upgrade": {"oldClusterDeletionDelaySeconds": seconds}}))["spec"]
    assert spec["rayClusterDeletionDelaySeconds"] == seconds


@pytest.mark.parametrize("bad", [-1, "10m", 1.5, 2**31])
def test_the_schema_refuses_a_delay_kuberay_would_not_take(chart, bad):
    with pytest.raises(helm.HelmValuesError, match="oldClusterDeletionDelaySeconds"):
        chart.validate_schema({"upgrade": {"oldClusterDeletionDelaySeconds": bad}})
