"""The Helm chart with a Hugging Face model (deploy/helm/tandem), offline: the default model is a
Hub id served under that id, a gated model's token comes from the user's Secret into every Ray
pod, and every Ray pod's Hugging Face cache (HF_HOME) is the volume the user gives (shared: one
download for the cluster) or an emptyDir. The chart's defaults follow cluster/configs/gpu.yaml.
Rendering, schemas and presets: test_helm.py."""

from __future__ import annotations

import pytest

helm = pytest.importorskip("helm_python", reason="helm-python-sdk is in the test extra")

from tests.unit.test_helm import CHART, by_kind, render, serve_config  # noqa: E402

HF_HOME = "/cache/huggingface"
SHARED_CACHE = {"persistentVolumeClaim": {"claimName": "hf-cache"}}


@pytest.fixture(scope="module")
def chart():
    return helm.Chart.load(CHART)


def _cluster_config(docs):
    from cluster.serve_entry import load_config

    return load_config(serve_config(docs)["applications"][0]["args"])


def _ray_pods(docs: list[dict]) -> list[dict]:
    """The head's and every worker group's pod spec."""
    [rayservice] = by_kind(docs, "RayService")
    spec = rayservice["spec"]["rayClusterConfig"]
    return [spec["headGroupSpec"]["template"]["spec"], *(g["template"]["spec"] for g in spec["workerGroupSpecs"])]


def _env(pod: dict) -> dict[str, dict]:
    [container] = pod["containers"]
    return {e["name"]: e for e in container["env"]}


def test_the_default_model_is_a_hub_id_served_under_that_id(chart):
    cfg = _cluster_config(render(chart, {}))
    assert cfg.model.hub_id == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert cfg.model.served_name == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_another_hub_id_is_its_own_served_name(chart):
    """`--set cluster.model.path=org/name` alone: no default `name` is left to mislabel it."""
    cfg = _cluster_config(render(chart, {"cluster": {"model": {"path": "meta-llama/Llama-3.1-8B-Instruct"}}}))
    assert cfg.model.served_name == "meta-llama/Llama-3.1-8B-Instruct"
    named = _cluster_config(render(chart, {"cluster": {"model": {"path": "/models/llama", "name": "llama"}}}))
    assert named.model.served_name == "llama"


def test_the_defaults_are_the_gpu_default_of_a_local_run(chart):
    from cluster.config import ClusterConfig
    from cluster.gpu_default import GPU_CONFIG

    cfg, local = _cluster_config(render(chart, {})), ClusterConfig.load_checked(GPU_CONFIG)
    for role, pool in cfg.tiers["interactive"].pools().items():
        assert pool.engine == local.tiers["interactive"].pools()[role].engine, role
        assert pool.num_gpus == 1
    assert cfg.tiers["interactive"].admission == local.tiers["interactive"].admission
    assert (cfg.kv_transfer.ucx_tls, cfg.kv_transfer.ucx_net_devices) == ("all", "all")


def test_a_sized_kv_cache_stays_sized_and_the_cpu_preset_as_it_was(chart):
    """Only an engine without kv_cache_memory_bytes gets the null (Helm drops a written one)."""
    from tests.unit.test_helm import preset_values

    multinode = _cluster_config(render(chart, preset_values("gpu-multinode"))).tiers["interactive"]
    assert multinode.decode.engine.kv_cache_memory_bytes == 40 << 30
    assert multinode.decode.engine.model_extra["gpu_memory_utilization"] == 0.9  # the free share vLLM wants at start
    cpu = _cluster_config(render(chart, preset_values("cpu-dev"))).tiers["interactive"]
    for pool in cpu.pools().values():
        assert pool.engine.kv_cache_memory_bytes == 256 << 20 and "gpu_memory_utilization" not in pool.engine.model_extra
    assert cpu.admission == type(cpu.admission)()  # tandem's defaults, not the chart's GPU bounds


def test_the_hf_token_comes_from_the_users_secret_on_every_ray_pod(chart):
    docs = render(chart, {"model": {"hfToken": {"secretName": "hf-token"}}})
    for pod in _ray_pods(docs):
        assert _env(pod)["HF_TOKEN"] == {"name": "HF_TOKEN",
                                         "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}
    other_key = render(chart, {"model": {"hfToken": {"secretName": "hf", "key": "hub"}}})
    assert _env(_ray_pods(other_key)[0])["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hf", "key": "hub"}
    assert not [s for s in by_kind(docs, "Secret") if "hf" in s["metadata"]["name"]]  # the user's, never the chart's


def test_no_token_without_a_secret(chart):
    assert all("HF_TOKEN" not in _env(pod) for pod in _ray_pods(render(chart, {})))


def test_every_ray_pod_mounts_the_shared_model_cache_as_hf_home(chart):
    docs = render(chart, {"model": {"cache": {"volume": SHARED_CACHE}}})
    for pod in _ray_pods(docs):
        assert {"name": "hf-cache", **SHARED_CACHE} in pod["volumes"]
        [container] = pod["containers"]
        assert {"name": "hf-cache", "mountPath": HF_HOME} in container["volumeMounts"]  # writable: downloads
        assert _env(pod)["HF_HOME"] == {"name": "HF_HOME", "value": HF_HOME}


def test_without_a_cache_volume_each_pod_has_its_own(chart):
    for pod in _ray_pods(render(chart, {})):
        assert {"name": "hf-cache", "emptyDir": {}} in pod["volumes"]


@pytest.mark.parametrize("values, where", [
    ({"model": {"hfToken": {"secret": "hf"}}}, "secret"),
    ({"model": {"cache": {"volume": "pvc"}}}, "/model/cache/volume"),
])
def test_schema_rejects_bad_hub_values(chart, values, where):
    with pytest.raises(helm.HelmValuesError, match=where):
        chart.validate_schema(values)
