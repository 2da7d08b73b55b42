"""With the prefill pool gone, requests still complete: decode recomputes the prompt, and
the path is counted. Runs last in the session: it kills the prefill replica."""

from __future__ import annotations

import time

import httpx
import psutil
import pytest

from tests.integration.test_tracing import traced_headers
from tests.support.integration_cluster import MODEL_NAME, metric, wait_for_metric

pytestmark = pytest.mark.timeout(1500)

BODY = {"model": MODEL_NAME, "prompt": "After the outage the cluster", "max_tokens": 8, "temperature": 0}


def _route_count(path: str) -> float:
    return metric("ray_tandem_route_total", path=path)


def _kill_prefill_replicas() -> int:
    import ray

    killed = 0
    for actor in ray.util.list_named_actors(all_namespaces=True):
        if "#interactive-prefill#" in actor["name"]:
            ray.kill(ray.get_actor(actor["name"], namespace=actor["namespace"]), no_restart=True)
            killed += 1
    return killed


def _prefill_engine_processes() -> list[psutil.Process]:
    """vLLM's EngineCore and worker processes under the interactive prefill replicas."""
    children = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if cmd.startswith("ray::") and "interactive-prefill" in cmd:
            children += proc.children(recursive=True)
    return children


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.usefixtures("removes_prefill")
def test_requests_complete_while_prefill_is_down_and_after_it_returns(base_url, otlp_receiver):
    baseline = httpx.post(f"{base_url}/v1/completions", json=BODY, timeout=120)
    assert baseline.status_code == 200
    expected = baseline.json()["choices"][0]["text"]
    fallbacks_before = _route_count("fallback_recompute")

    engine_processes = _prefill_engine_processes()
    assert engine_processes, "expected vLLM child processes under the prefill replicas"
    assert _kill_prefill_replicas() == 2  # both interactive prefill replicas (conftest)
    trace_id, _, traced = traced_headers()  # the last of the three: a fallback-recompute's trace
    for i in range(3):
        resp = httpx.post(f"{base_url}/v1/completions", json=BODY, timeout=120, headers=traced if i == 2 else None)
        assert resp.status_code == 200, resp.text
        assert resp.json()["choices"][0]["text"] == expected  # recomputed, same greedy output
    wait_for_metric("ray_tandem_route_total", fallbacks_before + 3, path="fallback_recompute")
    # Its trace: the prefill hop failed, decode computed the prompt, vLLM's span under decode's.
    spans = otlp_receiver.trace(trace_id, {"tandem.prefill_hop": 1, "tandem.decode_hop": 1, "tandem.decode": 1,
                                           "llm_request": 1})
    assert spans["tandem.prefill_hop"][0].attributes["tandem.prefill.failed"], spans
    assert spans["tandem.decode_hop"][0].attributes["tandem.route"] == "fallback_recompute"
    decode = spans["tandem.decode"][0]
    assert decode.attributes["tandem.kv.pull"] is False and decode.attributes["tandem.kv.recompute"] == "no_handoff"
    assert [span.parent_id for span in spans["llm_request"]] == [decode.span_id]
    assert "tandem.prefill" not in spans  # no prefill replica was reached

    # A SIGKILLed replica cannot shut its engine down; its vLLM children must not outlive it.
    deadline = time.monotonic() + 60
    while any(_alive(p) for p in engine_processes) and time.monotonic() < deadline:
        time.sleep(1)
    assert not [p.pid for p in engine_processes if _alive(p)], "orphaned vLLM processes"

    # Serve replaces the replica; once healthy, requests take the disaggregated path again.
    deadline = time.monotonic() + 600  # replica starts took 300 s on a slow VM
    while time.monotonic() < deadline:
        if httpx.get(f"{base_url}/health", timeout=30).status_code == 200:
            break
        time.sleep(2)
    else:
        pytest.fail("prefill pool did not come back within 600 s")
    time.sleep(2)  # earlier requests' metrics reach the export port (1 s report interval)
    disaggregated_before = _route_count("disaggregated")
    resp = httpx.post(f"{base_url}/v1/completions", json=BODY, timeout=120)
    assert resp.status_code == 200
    assert resp.json()["choices"][0]["text"] == expected
    assert wait_for_metric("ray_tandem_route_total", disaggregated_before + 1, path="disaggregated") \
        == disaggregated_before + 1
