"""Reading Prometheus' text exposition format, for every reader in the repo that scrapes a
/metrics page (the benchmarks, the integration tests). Pure: tested without a server."""

from __future__ import annotations

import re

_SAMPLE = r"^{name}(?:{{(.*)}})? ([0-9.e+-]+|NaN|[+-]Inf)$"
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def metric_sum(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of `name` (exact, e.g. `ray_tandem_route_total`) whose labels include
    `labels`; NaN and infinite samples are left out, 0.0 when none matches."""
    total = 0.0
    for m in re.finditer(_SAMPLE.format(name=re.escape(name)), text, re.M):
        found = dict(_LABEL.findall(m.group(1) or ""))
        if all(found.get(k) == v for k, v in labels.items()) and m.group(2) not in ("NaN", "+Inf", "-Inf"):
            total += float(m.group(2))
    return total


def metric_by(text: str, name: str, label: str, **labels: str) -> dict[str, float]:
    """metric_sum per value of `label` (e.g. per `replica`), over the samples that carry it."""
    values: set[str] = set()
    for m in re.finditer(_SAMPLE.format(name=re.escape(name)), text, re.M):
        found = dict(_LABEL.findall(m.group(1) or ""))
        if label in found and all(found.get(k) == v for k, v in labels.items()):
            values.add(found[label])
    return {value: metric_sum(text, name, **labels, **{label: value}) for value in sorted(values)}
