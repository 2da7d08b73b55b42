"""loadtest/measure/prom.py: sums of a metric's samples from Prometheus' text format."""

from __future__ import annotations

from loadtest.bench.tandem_run import TandemRun
from loadtest.measure.prom import metric_by, metric_sum

PAGE = """# HELP ray_tandem_migrations_total Streams continued.
# TYPE ray_tandem_migrations_total counter
ray_tandem_migrations_total{reason="replica_died",result="continued",tier="interactive"} 3.0
ray_tandem_migrations_total{reason="replica_died",result="refused",tier="interactive"} 1.0
ray_tandem_migrations_total{reason="stream_broke",result="continued",tier="batch"} 2.0
ray_tandem_migrations_total_created{reason="replica_died",result="continued"} 1.7e+09
ray_tandem_up 1
ray_tandem_gap{le="+Inf"} NaN
ray_tandem_label_with_quote{path="a\\"b,c"} 4.5
"""


def test_it_sums_the_samples_whose_labels_match_and_only_that_metric() -> None:
    assert metric_sum(PAGE, "ray_tandem_migrations_total") == 6.0
    assert metric_sum(PAGE, "ray_tandem_migrations_total", result="continued") == 5.0
    assert metric_sum(PAGE, "ray_tandem_migrations_total", result="continued", tier="batch") == 2.0
    assert metric_sum(PAGE, "ray_tandem_up") == 1.0  # no labels
    assert metric_sum(PAGE, "ray_tandem_label_with_quote", path='a\\"b,c') == 4.5


def test_nan_a_missing_metric_and_unmatched_labels_count_zero() -> None:
    assert metric_sum(PAGE, "ray_tandem_gap") == 0.0
    assert metric_sum(PAGE, "ray_tandem_absent") == 0.0
    assert metric_sum(PAGE, "ray_tandem_migrations_total", result="nope") == 0.0
    assert metric_sum(PAGE, "ray_tandem_migrations") == 0.0  # a prefix of a name is not the name


def test_a_tandem_run_reads_its_address_model_and_metrics_port_from_the_config(tmp_path) -> None:
    cfg = {"model": {"path": "/m/SmolLM2"}, "gateway": {"host": "127.0.0.1", "port": 8123},
           "ray": {"metrics_export_port": 18081}}
    run = TandemRun(tmp_path / "c.yaml", cfg, tmp_path)
    assert (run.url, run.model, run.metrics_url) == ("http://127.0.0.1:8123", "SmolLM2", "http://127.0.0.1:18081/metrics")
    named = TandemRun(tmp_path / "c.yaml", {"model": {"path": "/m/x", "name": "served"}}, tmp_path)
    assert (named.url, named.model, named.metrics_url) == ("http://127.0.0.1:8000", "served", None)


def test_it_splits_a_metric_by_one_label() -> None:
    assert metric_by(PAGE, "ray_tandem_migrations_total", "tier") == {"batch": 2.0, "interactive": 4.0}
    assert metric_by(PAGE, "ray_tandem_migrations_total", "tier", result="refused") == {"interactive": 1.0}
    assert metric_by(PAGE, "ray_tandem_up", "tier") == {}
