"""The chart's Grafana dashboards (deploy/helm/tandem/dashboards): well-formed, built from
deploy/helm/build_dashboards.py, querying only metrics tandem exports, and every query is
PromQL that Prometheus accepts (`promtool check rules` on the queries as recording rules)."""

from __future__ import annotations

import ast
import functools
import importlib.util
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from cluster.observability import queries
from tests.conftest import REPO

CHART = REPO / "deploy" / "helm" / "tandem"
DASHBOARDS = sorted((CHART / "dashboards").glob("*.json"))
EXPECTED = {"tandem-slo.json", "tandem-pools.json", "tandem-kv-transfer.json", "tandem-router.json"}

# The metric catalogue: what tandem's code declares (cluster/metrics.py Counter, Gauge, Histogram;
# Ray exports them as ray_<name>), each engine's vLLM metrics as vLLM's source declares them
# (Prometheus holds them as vllm:<name>, cluster/observability.py VLLM_RELABEL), and the one Serve
# metric the dashboards use.
CODE = [REPO / d for d in ("cluster", "router", "kv_transfer", "prefill_workers", "decode_workers")]
SUFFIXES = {"Counter": ("_total",), "Gauge": ("",), "Histogram": ("_bucket", "_sum", "_count"),
            "counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}
# Declared by tandem, on no dashboard, and why.
INTERNAL = {
    "tandem_health_probes": "the cost of the gateway's readiness probing (one probe of every engine per "
                            "health interval): for debugging /health, not for operating",
    "tandem_ready_wait_seconds": "how long requests waited for readiness: a series only once one waited "
                                 "(a cold start, a stop-first redeploy); the dashboard counts them by result",
}


def declared_tandem_metrics() -> dict[str, str]:
    """name → Counter | Gauge | Histogram, for every metric tandem's code declares."""
    from cluster.engine import metrics as engine_metrics

    declared = {name: "Counter" for name in engine_metrics.COUNTERS}  # declared in a loop over these
    for path in (p for d in CODE for p in d.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in SUFFIXES
                    and node.func.id[0].isupper() and node.args):
                continue
            name = node.args[0]
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                declared[name.value] = node.func.id
            else:
                assert path.name == "metrics.py" and path.parent.name == "engine", \
                    f"{path}: a metric whose name is not a literal; list it here like engine_metrics.COUNTERS"
    return declared


def vllm_families() -> dict[str, str]:
    """vLLM's metric families (name → gauge | counter | histogram), read from vLLM's source."""
    import vllm

    families = {}
    for path in Path(vllm.__file__).parent.rglob("*.py"):
        text = path.read_text()
        if "vllm:" in text:
            families.update({name: kind for kind, name in re.findall(
                r"_(gauge|counter|histogram)_cls\(\s*name=\"(vllm:[^\"]+)\"", text)})
    return families


@functools.cache
def catalogue() -> set[str]:
    tandem = {f"ray_{name}{s}" for name, kind in declared_tandem_metrics().items() for s in SUFFIXES[kind]}
    vllm = {f"{name}{s}" for name, kind in vllm_families().items() for s in SUFFIXES[kind]}
    return tandem | vllm | {"ray_serve_deployment_replica_healthy"}


METRIC = re.compile(r"\b(?:ray_[a-zA-Z0-9_]+|vllm:[a-zA-Z0-9_]+)")


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def _targets(board: dict) -> list[dict]:
    return [t for panel in board["panels"] for t in panel.get("targets", [])]


def test_the_four_dashboards_are_there():
    assert {p.name for p in DASHBOARDS} == EXPECTED


def test_committed_json_is_what_the_generator_writes():
    spec = importlib.util.spec_from_file_location("build_dashboards", REPO / "deploy" / "helm" / "build_dashboards.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rendered = module.render()
    assert set(rendered) == EXPECTED
    for path in DASHBOARDS:
        assert path.read_text() == rendered[path.name], \
            f"{path.name} differs from its generator: run `python deploy/helm/build_dashboards.py`"


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_is_well_formed(path):
    board = _load(path)
    assert board["uid"] == path.stem and board["title"].startswith("tandem / ")
    assert 36 <= board["schemaVersion"] <= 41
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids)), f"duplicate panel ids in {path.name}"
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert variables["tier"]["query"]["query"] == "label_values(ray_tandem_requests_total, tier)"
    for panel in board["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], f"{panel['title']} has no query"
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]
        for t in panel["targets"]:
            assert t.get("expr", "").strip(), f"{path.name}: {panel['title']} has a target without expr"


def test_dashboards_query_only_catalogued_metrics():
    used = {name for file, exprs in queries(CHART).items() if file.endswith(".json")
            for expr in exprs for name in METRIC.findall(expr)}
    assert used, "no metric found in the dashboards"
    assert used - catalogue() == set(), f"not in the metric catalogue: {sorted(used - catalogue())}"
    # The panels the issues ask for read these; a missing one means a panel went blank.
    for name in ("ray_tandem_ttft_seconds_bucket", "ray_tandem_itl_seconds_bucket", "ray_tandem_e2e_seconds_bucket",
                 "vllm:kv_cache_usage_perc", "ray_tandem_engine_kv_transfer_bytes_total",
                 "ray_tandem_routing_predicted_hit_tokens_total", "vllm:prefix_cache_hits_total",
                 "ray_serve_deployment_replica_healthy", "ray_tandem_autoscaling_target_replicas",
                 "ray_tandem_route_total", "ray_tandem_pd_decisions_total", "ray_tandem_first_token_total"):
        assert name in used, name


def test_every_metric_tandem_declares_is_on_a_dashboard_or_listed_internal():
    used = {name for file, exprs in queries(CHART).items() if file.endswith(".json")
            for expr in exprs for name in METRIC.findall(expr)}
    declared = declared_tandem_metrics()
    assert len(declared) >= 30, sorted(declared)  # the scan found the declarations
    shown = {name for name, kind in declared.items() if any(f"ray_{name}{s}" in used for s in SUFFIXES[kind])}
    missing = sorted(set(declared) - shown - set(INTERNAL))
    assert missing == [], f"on no dashboard: add a panel (deploy/helm/build_dashboards.py) or list it in INTERNAL: {missing}"
    assert set(INTERNAL) <= set(declared) - shown, "INTERNAL lists a metric that is gone or on a dashboard"


def test_every_query_aggregates_away_rays_per_process_labels():
    """Ray adds WorkerId, NodeAddress, ... to every series: an unaggregated query draws one
    line per process, and a ratio of two of them matches nothing."""
    for path in DASHBOARDS:
        for t in _targets(_load(path)):
            assert re.match(r"\s*(histogram_quantile\(|sum|max)", t["expr"]), f"{path.name}: {t['expr']}"


def _as_prometheus(expr: str) -> str:
    """Grafana's variables as Prometheus would see them after substitution."""
    return expr.replace("$__rate_interval", "5m").replace("$tier", ".*")


@pytest.mark.skipif(shutil.which("promtool") is None,
                    reason="promtool missing: `make test` installs Debian's prometheus package")
def test_every_query_is_valid_promql(tmp_path):
    groups = []
    for path in DASHBOARDS:
        exprs = [_as_prometheus(t["expr"]) for t in _targets(_load(path))]
        assert not any("$" in e for e in exprs), f"{path.name}: a Grafana variable left unsubstituted"
        groups.append({"name": path.stem,
                       "rules": [{"record": f"dashboard:query_{i}", "expr": e} for i, e in enumerate(exprs)]})
    rules = tmp_path / "dashboards.rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    done = subprocess.run(["promtool", "check", "rules", "--lint=none", str(rules)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    checked = sum(len(g["rules"]) for g in groups)
    assert f"SUCCESS: {checked} rules found" in done.stdout, done.stdout


def test_promtool_would_catch_a_broken_query(tmp_path):
    """The check above really parses: a query with a typo fails it."""
    if shutil.which("promtool") is None:
        pytest.skip("promtool missing: `make test` installs Debian's prometheus package")
    rules = tmp_path / "bad.rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": [{"name": "bad", "rules": [
        {"record": "bad:query", "expr": _as_prometheus("sum by (tier) (rate(ray_tandem_requests_total[$__rate_interval])")}]}]}))
    done = subprocess.run(["promtool", "check", "rules", "--lint=none", str(rules)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode != 0 and "unclosed left parenthesis" in (done.stdout + done.stderr)


def test_chart_ships_every_dashboard_in_one_small_configmap():
    helm = pytest.importorskip("helm_python", reason="helm-python-sdk is in the test extra")
    out = helm.Chart.load(CHART).render({}, name="tandem", namespace="llm", is_install=True)
    docs = [d for text in out.values() for d in yaml.safe_load_all(text) if d]
    [configmap] = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboards")]
    assert set(configmap["data"]) == EXPECTED
    for name, text in configmap["data"].items():
        assert json.loads(text) == _load(CHART / "dashboards" / name)
    # Kubernetes refuses a ConfigMap over 1 MiB.
    assert sum(len(text.encode()) for text in configmap["data"].values()) < 1024 * 1024 // 2
