"""The Helm chart (deploy/helm/tandem), offline: it renders with the defaults and each preset,
lints clean, its values validate against values.schema.json, every manifest validates against
the Kubernetes schemas (1.30 and the newest known), the custom resources against their CRDs
(deploy/helm/crd-schemas), and the Serve config inside the RayService is accepted by Ray Serve
and by the project's own ClusterConfig. Secrets, Redis and network policies: test_helm_secrets.py.

helm-python-sdk bundles the Helm library (no helm binary); kubernetes-validate carries the
Kubernetes schemas. Both are in the `test` extra."""

from __future__ import annotations

import copy
import shutil

import pytest
import yaml

from tests.conftest import REPO

helm = pytest.importorskip("helm_python", reason="helm-python-sdk is in the test extra")
kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is in the test extra")

CHART = REPO / "deploy" / "helm" / "tandem"
CRDS = REPO / "deploy" / "helm" / "crd-schemas"
PRESETS = {"defaults": None, "cpu-dev": "values-cpu-dev.yaml", "gpu-multinode": "values-gpu-multinode.yaml"}
# Everything optional switched on, so each template renders at least once.
EVERYTHING = {
    "ingress": {"enabled": True, "className": "nginx", "tls": [{"secretName": "t", "hosts": ["tandem.example.com"]}]},
    "redis": {"builtin": True},
    "monitoring": {"podMonitor": {"enabled": True},
                   "prometheusRule": {"enabled": True}},
    "kvTransfer": {"hostNetwork": True, "rdma": {"resources": {"rdma/ib": 1}}, "env": {"UCX_IB_GID_INDEX": "3"}},
}
KUBE_VERSIONS = ["1.30.0", kubernetes_validate.latest_version()]
CRD_FILES = {
    "RayService": "ray.io_rayservices.yaml",
    "PodMonitor": "monitoring.coreos.com_podmonitors.yaml",
    "PrometheusRule": "monitoring.coreos.com_prometheusrules.yaml",
}


def preset_values(preset: str) -> dict:
    name = PRESETS.get(preset)
    if preset == "everything":
        return copy.deepcopy(EVERYTHING)
    return yaml.safe_load((CHART / name).read_text()) if name else {}


@pytest.fixture(scope="module")
def chart():
    return helm.Chart.load(CHART)


def render(chart, values: dict | None, name: str = "tandem") -> list[dict]:
    out = chart.render(values, name=name, namespace="llm", is_install=True)
    return [doc for text in out.values() for doc in yaml.safe_load_all(text) if doc]


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def serve_config(docs: list[dict]) -> dict:
    [rayservice] = by_kind(docs, "RayService")
    return yaml.safe_load(rayservice["spec"]["serveConfigV2"])


ALL = [*PRESETS, "everything"]


@pytest.mark.parametrize("preset", ALL)
def test_lints_clean(preset):
    report = helm.lint(CHART, preset_values(preset), strict=True, kube_version="v1.30.0")
    problems = [m for m in report["messages"] if m["severity"] >= 2]  # 1 is "info" (e.g. icon)
    assert report["errors"] == [] and problems == [], report


@pytest.mark.parametrize("preset", ALL)
def test_values_validate_against_schema(chart, preset):
    chart.validate_schema(preset_values(preset))


@pytest.mark.parametrize("values, where", [
    ({"workers": {"defaults": {"gpus": -1}}}, "/workers/defaults/gpus"),
    ({"redis": {"bultin": True}}, "bultin"),
    ({"workers": {"pools": {"interactive-prefil": {"nodes": 1}}}}, "interactive-prefil"),
    ({"cluster": {"model": {"path": "models/relative/path"}}}, "/cluster/model/path"),
])
def test_schema_rejects_bad_values(chart, values, where):
    with pytest.raises(helm.HelmValuesError, match=where):
        chart.validate_schema(values)


@pytest.mark.parametrize("preset", ALL)
def test_manifests_validate_against_kubernetes(chart, preset):
    docs = render(chart, preset_values(preset))
    builtin = [d for d in docs if d["kind"] not in CRD_FILES]
    assert builtin, "nothing but custom resources rendered"
    for version in KUBE_VERSIONS:
        for doc in builtin:
            kubernetes_validate.validate(doc, version, strict=True)


def _closed(schema):
    """A CRD schema that also rejects unknown fields: the API server silently prunes them,
    so a misspelt field would otherwise vanish without an error."""
    if isinstance(schema, dict):
        schema = {k: _closed(v) for k, v in schema.items()}
        if ("properties" in schema and "additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [_closed(v) for v in schema]
    return schema


@pytest.fixture(scope="module")
def crd_validators():
    import jsonschema

    validators = {}
    for kind, filename in CRD_FILES.items():
        crd = yaml.load((CRDS / filename).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        [version] = [v for v in crd["spec"]["versions"] if v.get("storage")]
        group = crd["spec"]["group"]
        schema = _closed(version["schema"]["openAPIV3Schema"])
        validators[kind] = (f"{group}/{version['name']}", jsonschema.Draft7Validator(schema))
    return validators


@pytest.mark.parametrize("preset", ALL)
def test_custom_resources_validate_against_crds(chart, crd_validators, preset):
    docs = render(chart, preset_values(preset))
    custom = [d for d in docs if d["kind"] in CRD_FILES]
    assert by_kind(custom, "RayService")
    for doc in custom:
        api_version, validator = crd_validators[doc["kind"]]
        assert doc["apiVersion"] == api_version
        errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]
        assert errors == [], f"{doc['kind']} {doc['metadata']['name']}: {errors}"


def test_every_monitoring_resource_renders(chart):
    docs = render(chart, preset_values("everything"))
    for kind in ("PodMonitor", "PrometheusRule", "Ingress", "Deployment", "NetworkPolicy"):
        assert by_kind(docs, kind), kind
    [rule] = by_kind(docs, "PrometheusRule")
    assert rule["spec"]["groups"][0]["rules"]


def test_the_podmonitor_gives_vllms_metrics_vllms_names(chart):
    """The rule the observability test's Prometheus applies, in the PodMonitor's spelling:
    without it the dashboards' and users' `vllm:` queries find nothing."""
    from cluster.observability import VLLM_RELABEL

    [monitor] = by_kind(render(chart, preset_values("everything")), "PodMonitor")
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    camel = {"source_labels": "sourceLabels", "target_label": "targetLabel"}
    assert endpoint["metricRelabelings"] == [{camel.get(k, k): v for k, v in VLLM_RELABEL.items()}]


@pytest.mark.parametrize("preset", ALL)
def test_serve_config_is_accepted_by_ray_serve_and_cluster_config(chart, preset):
    from ray.serve.schema import ServeDeploySchema

    from cluster.config import ClusterConfig
    from cluster.serve_entry import load_config

    config = serve_config(render(chart, preset_values(preset)))
    ServeDeploySchema.model_validate(config)
    [app] = config["applications"]
    assert app["import_path"] == "cluster.serve_entry:build"
    cfg = load_config(app["args"])
    assert isinstance(cfg, ClusterConfig)
    assert cfg.default_tier in cfg.tiers
    assert cfg.kv_transfer.side_channel_host == "auto"  # engines on other nodes must reach it
    assert (cfg.gateway.host, cfg.gateway.port) == ("0.0.0.0", config["http_options"]["port"])


@pytest.mark.parametrize("preset", ALL)
def test_every_pool_has_its_own_worker_group_with_room(chart, preset):
    """Each pool's replicas ask for the custom resource only its worker group advertises,
    and the group has the GPUs the pool's replicas need."""
    from cluster.serve_entry import load_config

    docs = render(chart, preset_values(preset))
    cfg = load_config(serve_config(docs)["applications"][0]["args"])
    [rayservice] = by_kind(docs, "RayService")
    cluster = rayservice["spec"]["rayClusterConfig"]
    assert cluster["headGroupSpec"]["rayStartParams"]["num-gpus"] == "0"
    head = cluster["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in head["resources"].get("limits", {})
    groups = {g["groupName"]: g for g in cluster["workerGroupSpecs"]}
    assert set(groups) == {f"{tier}-{role}" for tier in cfg.tiers for role in ("prefill", "decode")}
    for tier, tier_cfg in cfg.tiers.items():
        for role, pool in tier_cfg.pools().items():
            group = groups[f"{tier}-{role}"]
            advertised = yaml.safe_load(yaml.safe_load(group["rayStartParams"]["resources"]))
            assert set(pool.placement.resources) <= set(advertised), (tier, role)
            gpus = int(group["rayStartParams"]["num-gpus"])
            limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
            assert int(limits.get("nvidia.com/gpu", 0)) == gpus
            assert pool.replicas * pool.num_gpus <= gpus * group["replicas"], (tier, role)


def test_gpu_preset_is_two_nodes_of_eight_gpus_with_tensor_parallel(chart):
    docs = render(chart, preset_values("gpu-multinode"))
    from cluster.serve_entry import load_config

    cfg = load_config(serve_config(docs)["applications"][0]["args"])
    [rayservice] = by_kind(docs, "RayService")
    groups = rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    assert sum(g["replicas"] for g in groups) == 2
    assert all(g["rayStartParams"]["num-gpus"] == "8" for g in groups)
    tier = cfg.tiers["interactive"]
    assert tier.prefill.engine.tensor_parallel_size == 4 and tier.decode.engine.tensor_parallel_size == 8
    assert cfg.routing.index.redis_url == "redis://tandem-redis:6379/0"
    worker = groups[0]["template"]["spec"]
    assert worker["containers"][0]["resources"]["limits"]["rdma/ib"] == "1"
    assert "IPC_LOCK" in worker["containers"][0]["securityContext"]["capabilities"]["add"]
    key_env = {"name": "TANDEM_KEY_ACME", "valueFrom": {"secretKeyRef": {"name": "tandem-api-keys", "key": "TANDEM_KEY_ACME"}}}
    head = rayservice["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]
    assert key_env in head["containers"][0]["env"]  # the gateway's, on the head only
    assert key_env not in worker["containers"][0]["env"]
    [dshm] = [v for v in worker["volumes"] if v["name"] == "dshm"]
    assert dshm["emptyDir"] == {"medium": "Memory", "sizeLimit": "64Gi"}


def test_user_placement_is_kept(chart):
    values = {"cluster": {"tiers": {"interactive": {"decode": {"placement": {"node_labels": {"zone": "a"}}}}}}}
    from cluster.serve_entry import load_config

    cfg = load_config(serve_config(render(chart, values))["applications"][0]["args"])
    assert cfg.tiers["interactive"].decode.placement.node_labels == {"zone": "a"}
    assert cfg.tiers["interactive"].decode.placement.resources == {}
    assert cfg.tiers["interactive"].prefill.placement.resources == {"tandem-pool-interactive-prefill": 1}


def test_dashboards_configmap_from_files(chart, tmp_path):
    if not list(CHART.glob("dashboards/*.json")):  # none yet: no ConfigMap, no error
        assert not by_kind(render(chart, {}), "ConfigMap")
    copy_dir = tmp_path / "tandem"
    shutil.copytree(CHART, copy_dir)
    dashboards = copy_dir / "dashboards"
    dashboards.mkdir(exist_ok=True)
    (dashboards / "tandem-overview.json").write_text('{"title": "tandem overview", "panels": []}')
    docs = render(helm.Chart.load(copy_dir), {})
    [configmap] = by_kind(docs, "ConfigMap")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["data"]["tandem-overview.json"] == '{"title": "tandem overview", "panels": []}'


def test_release_name_is_used_for_every_resource(chart):
    docs = render(chart, preset_values("everything"), name="prod")
    assert all(d["metadata"]["name"].startswith("prod-tandem") for d in docs)
