"""One vocabulary for a request's path (router/routing/types.py): the decider's verdict, the
RouteDecision and tandem_pd_decisions say Path (remote | local | whole); the route counters say
RouteLabel, mapped from Path in one place (ROUTE_LABELS). Every `path="..."` that a dashboard,
an alert rule or a rule test reads from those metrics is one of these values, so a renamed
label cannot leave a reader silently at zero."""

from __future__ import annotations

import re
from typing import get_args

from router.routing.types import ROUTE_LABELS, Path, RouteLabel
from tests.conftest import REPO

ROUTE_METRICS = ("ray_tandem_route_total", "ray_tandem_routing_decisions_total", "ray_tandem_decode_first_token_seconds")
SELECTOR = re.compile(r"(ray_tandem_[a-z_]+)\{([^}]*)\}")
PATH_LABEL = re.compile(r'path=\\?"([a-z_]+)\\?"')


def _readers() -> list:
    files = [*(REPO / "deploy").rglob("*.yaml"), *(REPO / "deploy").rglob("*.json"), *(REPO / "deploy").rglob("*.py"),
             *(REPO / "tests" / "prometheus").rglob("*.yaml")]
    return [f for f in files if "ray_tandem_" in f.read_text(errors="replace")]


def _paths_read() -> dict[str, set[str]]:
    """metric family → the `path` values its readers select."""
    seen: dict[str, set[str]] = {}
    for f in _readers():
        for metric, labels in SELECTOR.findall(f.read_text(errors="replace")):
            for value in PATH_LABEL.findall(labels):
                seen.setdefault(metric, set()).add(value)
    return seen


def test_every_path_maps_to_one_route_label():
    assert set(ROUTE_LABELS) == set(get_args(Path))
    assert len(set(ROUTE_LABELS.values())) == len(ROUTE_LABELS)
    assert set(ROUTE_LABELS.values()) <= set(get_args(RouteLabel))


def test_dashboards_and_rules_read_only_known_path_labels():
    seen = _paths_read()
    assert seen.get("ray_tandem_route_total"), "the scan found no reader of tandem_route"  # the scan works
    for metric, values in seen.items():
        if metric.startswith(ROUTE_METRICS):
            assert values <= set(get_args(RouteLabel)), (metric, values)
        elif metric.startswith("ray_tandem_pd_decisions"):
            assert values <= set(get_args(Path)), (metric, values)


def test_the_dashboard_builder_selects_a_known_label():
    from deploy.helm import build_dashboards

    assert PATH_LABEL.fullmatch(build_dashboards.RECOMPUTE).group(1) in get_args(RouteLabel)
