"""The Helm chart's secrets and network (deploy/helm/tandem), offline: Redis (required by the
redis backend, its password from a Secret, generated for the built-in one, bounded memory),
Ray's token auth, secrets only on the head where the gateway runs, NetworkPolicies keeping Ray
and Redis private. The chart's rendering and schemas: test_helm.py."""

from __future__ import annotations

import base64
import copy

import pytest
import yaml

helm = pytest.importorskip("helm_python", reason="helm-python-sdk is in the test extra")

from tests.unit.test_helm import ALL, CHART, by_kind, preset_values, render, serve_config  # noqa: E402


@pytest.fixture(scope="module")
def chart():
    return helm.Chart.load(CHART)


def test_redis_backend_needs_a_redis(chart):
    values = {"cluster": {"routing": {"index": {"backend": "redis"}}}}
    with pytest.raises(helm.HelmError, match="redis.builtin=true or redis.url"):
        render(chart, values)
    external = {**values, "redis": {"url": "redis://redis.infra:6379/1"}}
    docs = render(chart, external)
    assert serve_config(docs)["applications"][0]["args"]["cluster"]["routing"]["index"]["redis_url"] \
        == "redis://redis.infra:6379/1"
    assert not by_kind(docs, "Deployment")  # no built-in Redis


def _ray_pods(docs: list[dict]) -> tuple[dict, list[dict]]:
    """The head's and the worker groups' pod specs of the RayService."""
    [rayservice] = by_kind(docs, "RayService")
    cluster_spec = rayservice["spec"]["rayClusterConfig"]
    return (cluster_spec["headGroupSpec"]["template"]["spec"],
            [g["template"]["spec"] for g in cluster_spec["workerGroupSpecs"]])


def _secret_refs(pod: dict) -> set[str]:
    """Names of the environment variables a pod's containers take from Secrets."""
    return {e["name"] for c in pod["containers"] for e in c.get("env", []) if "secretKeyRef" in e.get("valueFrom", {})}


def test_redis_password_comes_from_a_secret(chart):
    values = {"cluster": {"routing": {"index": {"backend": "redis"}}},
              "redis": {"builtin": True, "passwordSecret": {"name": "redis-auth", "key": "pw"}}}
    docs = render(chart, values)
    index = serve_config(docs)["applications"][0]["args"]["cluster"]["routing"]["index"]
    assert index["redis_password_env"] == "TANDEM_REDIS_PASSWORD" and "redis_password" not in index
    from_secret = {"secretKeyRef": {"name": "redis-auth", "key": "pw"}}
    head, workers = _ray_pods(docs)
    assert {"name": "TANDEM_REDIS_PASSWORD", "valueFrom": from_secret} in head["containers"][0]["env"]
    assert all("TANDEM_REDIS_PASSWORD" not in _secret_refs(w) for w in workers)  # engines never use Redis
    [redis] = by_kind(docs, "Deployment")
    [server] = redis["spec"]["template"]["spec"]["containers"]
    assert server["args"][-2:] == ["--requirepass", "$(REDIS_PASSWORD)"]
    assert server["env"] == [{"name": "REDIS_PASSWORD", "valueFrom": from_secret}]
    assert "pw" not in str(by_kind(docs, "RayService")[0]["spec"]["serveConfigV2"])
    assert [s["metadata"]["name"] for s in by_kind(docs, "Secret")] == ["tandem-ray-auth"]  # the user's Redis Secret


@pytest.mark.parametrize("preset", ["gpu-multinode", "everything"])
def test_builtin_redis_gets_a_generated_password_and_bounded_memory(chart, preset):
    values = copy.deepcopy(preset_values(preset))
    values.setdefault("cluster", {}).setdefault("routing", {"index": {"backend": "redis"}})
    docs = render(chart, values)
    [secret] = [s for s in by_kind(docs, "Secret") if s["metadata"]["name"] == "tandem-redis"]
    password = base64.b64decode(secret["data"]["redis-password"]).decode()
    assert len(password) == 48 and password.isalnum()
    assert password not in str(render(chart, values))  # random: another render, another password
    from_secret = {"secretKeyRef": {"name": "tandem-redis", "key": "redis-password"}}
    [server] = by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]["containers"]
    assert server["env"] == [{"name": "REDIS_PASSWORD", "valueFrom": from_secret}]
    args = server["args"]
    assert args[args.index("--requirepass") + 1] == "$(REDIS_PASSWORD)"
    assert args[args.index("--maxmemory") + 1] == "768mb"
    assert args[args.index("--maxmemory-policy") + 1] == "allkeys-lru"
    head, _workers = _ray_pods(docs)
    assert {"name": "TANDEM_REDIS_PASSWORD", "valueFrom": from_secret} in head["containers"][0]["env"]
    index = serve_config(docs)["applications"][0]["args"]["cluster"]["routing"]["index"]
    assert index["redis_password_env"] == "TANDEM_REDIS_PASSWORD"
    assert load_index_ttl(index) == 3600  # index keys expire (cluster.routing.index.key_ttl_s)


def load_index_ttl(index: dict) -> int:
    from cluster.config import RoutingIndexConfig

    return RoutingIndexConfig.model_validate(index).key_ttl_s


def test_external_redis_without_a_secret_has_no_password(chart):
    docs = render(chart, {"cluster": {"routing": {"index": {"backend": "redis"}}},
                          "redis": {"url": "redis://redis.infra:6379/0"}})
    assert "redis_password_env" not in serve_config(docs)["applications"][0]["args"]["cluster"]["routing"]["index"]
    assert [s["metadata"]["name"] for s in by_kind(docs, "Secret")] == ["tandem-ray-auth"]


@pytest.mark.parametrize("preset", ALL)
def test_ray_token_auth_is_on_with_the_token_from_a_secret(chart, preset):
    docs = render(chart, preset_values(preset))
    [rayservice] = by_kind(docs, "RayService")
    assert rayservice["spec"]["rayClusterConfig"]["authOptions"] == {"mode": "token", "secretName": "tandem-ray-auth"}
    [secret] = [s for s in by_kind(docs, "Secret") if s["metadata"]["name"] == "tandem-ray-auth"]
    token = base64.b64decode(secret["data"]["auth_token"]).decode()
    assert len(token) == 64 and token.isalnum()
    head, workers = _ray_pods(docs)
    for pod in [head, *workers]:  # every Ray container, whatever the operator adds
        env = pod["containers"][0]["env"]
        assert {"name": "RAY_AUTH_MODE", "value": "token"} in env
        assert {"name": "RAY_AUTH_TOKEN", "valueFrom": {"secretKeyRef": {"name": "tandem-ray-auth", "key": "auth_token"}}} in env


def test_an_existing_ray_token_secret_is_used_and_none_is_made(chart):
    docs = render(chart, {"rayAuth": {"existingSecret": "my-ray-token"}})
    assert not [s for s in by_kind(docs, "Secret") if s["metadata"]["name"] == "tandem-ray-auth"]
    [rayservice] = by_kind(docs, "RayService")
    assert rayservice["spec"]["rayClusterConfig"]["authOptions"]["secretName"] == "my-ray-token"
    head, workers = _ray_pods(docs)
    for pod in [head, *workers]:
        [token] = [e for e in pod["containers"][0]["env"] if e["name"] == "RAY_AUTH_TOKEN"]
        assert token["valueFrom"]["secretKeyRef"] == {"name": "my-ray-token", "key": "auth_token"}


@pytest.mark.parametrize("preset", ALL)
def test_secrets_reach_only_the_head_where_the_gateway_is_pinned(chart, preset):
    from router.gateway import Gateway

    values = copy.deepcopy(preset_values(preset))
    values.setdefault("apiKeys", {"secretName": "keys"})
    values.setdefault("cluster", {}).setdefault("auth", {"tenants": {"t": {"tier": "interactive"}}, "keys": [{"tenant": "t", "env": "KEY_T"}]})
    docs = render(chart, values)
    head, workers = _ray_pods(docs)
    for worker in workers:  # engines: only Ray's own token
        assert _secret_refs(worker) == {"RAY_AUTH_TOKEN"}, preset
    key_envs = {k["env"] for k in values["cluster"]["auth"]["keys"]}
    assert key_envs <= _secret_refs(head)
    [app] = serve_config(docs)["applications"]
    [override] = app["deployments"]
    assert override["name"] == Gateway.name
    assert override["ray_actor_options"] == {**Gateway.ray_actor_options, "resources": {"tandem-gateway": 1}}
    [rayservice] = by_kind(docs, "RayService")
    cluster_spec = rayservice["spec"]["rayClusterConfig"]
    head_offers = yaml.safe_load(yaml.safe_load(cluster_spec["headGroupSpec"]["rayStartParams"]["resources"]))
    assert head_offers == {"tandem-gateway": 1000}
    for group in cluster_spec["workerGroupSpecs"]:
        assert "tandem-gateway" not in group["rayStartParams"]["resources"]


def test_network_policies_keep_ray_and_redis_private(chart):
    docs = render(chart, preset_values("everything"))
    policies = {p["metadata"]["name"]: p["spec"] for p in by_kind(docs, "NetworkPolicy")}
    instance = {"app.kubernetes.io/name": "tandem", "app.kubernetes.io/instance": "tandem"}
    ray_pods = [{"podSelector": {"matchLabels": instance, "matchExpressions": [
        {"key": "app.kubernetes.io/component", "operator": "In", "values": ["ray-head", "ray-worker"]}]}}]
    operator = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "default"}},
                 "podSelector": {"matchLabels": {"app.kubernetes.io/name": "kuberay-operator"}}}]
    workers = policies["tandem-ray-workers"]
    # Every port (Ray's, NIXL's, the KV events') only from this release's Ray pods, not Redis.
    assert workers["ingress"][0] == {"from": ray_pods}
    assert workers["ingress"][1] == {"ports": [{"port": 8080, "protocol": "TCP"}]}  # metrics
    assert workers["ingress"][2] == {"ports": [{"port": 52365, "protocol": "TCP"}], "from": operator}
    assert len(workers["ingress"]) == 3
    head = policies["tandem-ray-head"]
    assert head["ingress"][0] == {"from": ray_pods}
    assert {"ports": [{"port": 8000, "protocol": "TCP"}]} in head["ingress"]  # the gateway: anyone
    assert {"ports": [{"port": 8265, "protocol": "TCP"}, {"port": 52365, "protocol": "TCP"}], "from": operator} \
        in head["ingress"]  # the dashboard and its job API: the operator only
    assert len(head["ingress"]) == 4
    redis = policies["tandem-redis"]
    assert [p["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for p in redis["ingress"][0]["from"]] \
        == ["ray-head"]  # the gateway's pod; engines never use Redis
    assert redis["ingress"][0]["ports"] == [{"port": 6379, "protocol": "TCP"}]
