"""What the chart's dashboards and Prometheus rules query, read from the files themselves.

The observability integration test checks that every metric name found here is really
exported by a running cluster, so a renamed metric cannot silently blank a panel or an alert.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterator

import yaml

# Every metric tandem exports is a Ray metric, so every name a query uses starts with `ray_`;
# recording rules (`tandem:...`) are derived names, not exported ones.
_METRIC = re.compile(r"\bray_[a-zA-Z0-9_]+")


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
    """Exported metric names (`ray_...`, with _bucket/_sum/_count/_total as queried)."""
    return {name for exprs in queries(chart_dir).values() for expr in exprs for name in _METRIC.findall(expr)}
