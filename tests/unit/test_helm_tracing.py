"""The chart's tracing value (monitoring.tracing, deploy/helm/tandem): an OTLP endpoint turns
observability.tracing on in the ClusterConfig the RayService runs, unless `cluster:` says
otherwise; empty, the config has no tracing. Rendering, schemas and presets: test_helm.py."""

from __future__ import annotations

import pytest

helm = pytest.importorskip("helm_python", reason="helm-python-sdk is in the test extra")

from tests.unit.test_helm import CHART, render, serve_config  # noqa: E402

ENDPOINT = "http://otel-collector.observability:4317"


@pytest.fixture(scope="module")
def chart():
    return helm.Chart.load(CHART)


def _tracing(docs):
    from cluster.serve_entry import load_config

    return load_config(serve_config(docs)["applications"][0]["args"]).observability.tracing


def test_no_endpoint_no_tracing(chart):
    assert _tracing(render(chart, {})).enabled is False


def test_an_endpoint_turns_tracing_on_to_it(chart):
    tracing = _tracing(render(chart, {"monitoring": {"tracing": {"otlpEndpoint": ENDPOINT}}}))
    assert (tracing.enabled, tracing.endpoint, tracing.protocol, tracing.sampling_ratio) == (True, ENDPOINT, "grpc", 1.0)
    http = _tracing(render(chart, {"monitoring": {"tracing": {"otlpEndpoint": "http://c:4318/v1/traces",
                                                             "protocol": "http"}}}))
    assert http.protocol == "http"


def test_the_cluster_config_keeps_what_it_sets(chart):
    values = {"monitoring": {"tracing": {"otlpEndpoint": ENDPOINT}},
              "cluster": {"observability": {"tracing": {"enabled": False, "sampling_ratio": 0.01}}}}
    tracing = _tracing(render(chart, values))
    assert (tracing.enabled, tracing.endpoint, tracing.sampling_ratio) == (False, ENDPOINT, 0.01)


def test_the_schema_refuses_an_endpoint_without_a_scheme(chart):
    with pytest.raises(Exception, match="otlpEndpoint|pattern"):
        render(chart, {"monitoring": {"tracing": {"otlpEndpoint": "otel-collector:4317"}}})
