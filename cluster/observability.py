"""What the chart's dashboards and Prometheus rules query, read from the files themselves, and
the one relabelling rule that gives the engines' vLLM metrics vLLM's own names in Prometheus.

The observability integration test checks that every metric name found here is really
exported by a running cluster, so a renamed metric cannot silently blank a panel or an alert.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterator

import yaml

# Every metric tandem exports is a Ray metric on Ray's export port, named `ray_<name>`: tandem's
# own (`ray_tandem_...`) and each engine's vLLM metrics, which vLLM's Ray stat logger records as
# `vllm_<name>` (a Ray name allows no ':', cluster/engine/vllm_ray_metrics.py). Prometheus renames
# those back to vLLM's `vllm:<name>` as it scrapes (VLLM_RELABEL), so dashboards query that.
# Recording rules (`tandem:...`) are derived names, not exported ones.
_METRIC = re.compile(r"\b(?:ray_[a-zA-Z0-9_]+|vllm:[a-zA-Z0-9_]+)")
RAY_VLLM_PREFIX = "ray_vllm_"

# A Prometheus metric_relabel_config: `ray_vllm_<name>` → `vllm:<name>`. The chart's PodMonitor
# (templates/podmonitor.yaml, as metricRelabelings) and the observability test's Prometheus
# apply it; a Prometheus of your own scraping Ray's port needs it too (README, Observability).
VLLM_RELABEL = {"source_labels": ["__name__"], "regex": f"{RAY_VLLM_PREFIX}(.+)", "target_label": "__name__",
                "replacement": "vllm:${1}", "action": "replace"}


def on_ray_port(name: str) -> str:
    """The name a queried metric has on Ray's export port: `vllm:x` is `ray_vllm_x` there."""
    return RAY_VLLM_PREFIX + name[len("vllm:"):] if name.startswith("vllm:") else name


def _dashboard_exprs(path: Path) -> Iterator[str]:
    def walk(node):
        if isinstance(node, dict):
            if isinstance(node.get("expr"), str):
                yield node["expr"]
            if isinstance(node.get("query"), str):  # template variables
                yield node["query"]
            for value in node.values():
                yield from walk(value)
        elif isinstance(node, list):
            for value in node:
                yield from walk(value)

    yield from walk(json.loads(path.read_text()))


def _rule_exprs(path: Path) -> Iterator[str]:
    for group in (yaml.safe_load(path.read_text()) or {}).get("groups", []):
        for rule in group.get("rules", []):
            yield rule["expr"]


def queries(chart_dir: Path) -> dict[str, list[str]]:
    """file name → the PromQL expressions it holds (dashboards/*.json, rules/*.yaml)."""
    out: dict[str, list[str]] = {}
    for path in sorted((chart_dir / "dashboards").glob("*.json")):
        out[path.name] = list(_dashboard_exprs(path))
    for path in sorted((chart_dir / "rules").glob("*.yaml")):
        out[path.name] = list(_rule_exprs(path))
    return out


def metric_names_used(chart_dir: Path) -> set[str]:
    """Metric names queried (`ray_...` and `vllm:...`, with _bucket/_sum/_count/_total as queried)."""
    return {name for exprs in queries(chart_dir).values() for expr in exprs for name in _METRIC.findall(expr)}
