"""vLLM's metrics through Ray with tandem's labels (cluster/engine/vllm_ray_metrics.py), on the
tiny model's real VllmConfig and vLLM's real stat loggers: which series a step records, with
which tags, and that tandem's in-process reading of vLLM's registry survives beside them.
Outside a Ray worker Ray records nothing, so the recording functions are replaced by lists."""

from __future__ import annotations

import threading
import time

import pytest
from prometheus_client import REGISTRY
from vllm.v1.metrics.stats import IterationStats, SchedulerStats

from cluster import vllm_metrics as vm
from cluster.engine import vllm_ray_metrics
from cluster.engine.metrics import read_vllm_metrics
from cluster.engine.vllm import engine_stat_loggers
from cluster.types import PoolId
from tests.support.openai_helpers import MODEL, vllm_setup

LABELS = {"tier": "interactive", "pool": "decode", "replica": "interactive-decode-r1"}


@pytest.fixture
def recorded(monkeypatch):
    calls: dict[str, list[tuple[str, dict[str, str], float]]] = {"inc": [], "observe": [], "set": []}
    for fn, kind in (("inc_later", "inc"), ("observe_later", "observe"), ("set_kept", "set")):
        def record(metric, tags, value, kind=kind):
            metric._validate_tags(metric._get_final_tags(tags))  # what Ray's record checks first
            calls[kind].append((metric._name, {**metric._default_tags, **tags}, value))
        monkeypatch.setattr(vllm_ray_metrics, fn, record)
    return calls


def _loggers():
    _, config = vllm_setup()
    return [cls(vllm_config=config, engine_indexes=[0]) for cls in vllm_ray_metrics.stat_loggers(**LABELS)]


def _step(ray_logger, running: int = 3) -> None:
    stats = IterationStats()
    stats.num_generation_tokens = running
    stats.inter_token_latencies_iter = [0.02] * running
    stats.time_to_first_tokens_iter = [0.4]
    ray_logger.record(SchedulerStats(num_running_reqs=running, num_waiting_reqs=1, kv_cache_usage=0.25), stats)


def test_a_step_records_vllms_series_under_vllms_names_with_tandems_labels(recorded):
    ray_logger, _ = _loggers()
    _step(ray_logger)
    sets = {name: (tags, value) for name, tags, value in recorded["set"]}
    tags, value = sets["vllm_num_requests_running"]
    assert value == 3 and tags == {**LABELS, "model_name": MODEL, "engine": "0", "ReplicaId": ""}
    assert sets["vllm_kv_cache_usage_perc"][1] == 0.25
    incs = {name: value for name, _, value in recorded["inc"]}
    assert incs["vllm_generation_tokens"] == 3
    observed = [name for name, _, _ in recorded["observe"]]
    assert observed.count("vllm_inter_token_latency_seconds") == 3 and "vllm_time_to_first_token_seconds" in observed
    for kind in recorded.values():
        for name, tags, _ in kind:
            assert name.startswith("vllm_") and LABELS.items() <= tags.items(), (name, tags)


def test_every_vllm_family_tandem_reads_is_one_the_ray_logger_exports(recorded):
    """Prometheus sees `ray_vllm_<name>` renamed `vllm:<name>` (observability.VLLM_RELABEL):
    the families tandem's table names, less NIXL's (no connector here), are all recorded."""
    ray_logger, _ = _loggers()
    _step(ray_logger)
    names = {name for kind in recorded.values() for name, _, _ in kind}
    wanted = {f.replace("vllm:", "vllm_") for f, path in vm.FAMILIES.items() if path != vm.NIXL_STATS}
    quiet = {"vllm_prompt_tokens_by_source"}  # these steps have no prompt tokens: increments of 0 are not recorded
    assert wanted - quiet <= names, sorted(wanted - quiet - names)


def test_tandems_reading_of_vllms_registry_survives_the_ray_logger():
    """Each PrometheusStatLogger's constructor unregisters every vllm: collector; the
    in-process one must come last or tandem reads nothing (EngineStats, autoscaling)."""
    ray_logger, prometheus_logger = _loggers()
    prometheus_logger.record(SchedulerStats(num_running_reqs=2), None)
    assert read_vllm_metrics()[vm.REQUESTS_RUNNING] == 2
    assert any(m.name == "vllm:num_requests_running" for m in REGISTRY.collect())


def test_a_step_makes_no_ray_record_on_the_calling_thread(monkeypatch):
    """vLLM records from the replica's event loop, once per step, one token gap per running
    sequence; one Ray record costs ~15-20 us. The wrappers hand every value to cluster/metrics.py's
    keeper thread instead (measured here: 1.2 ms a step with 256 sequences against 2.1 ms for
    vLLM's own in-process Prometheus logger)."""
    from ray.util import metrics as ray_metrics

    threads = []
    for cls, method in ((ray_metrics.Histogram, "observe"), (ray_metrics.Counter, "inc"), (ray_metrics.Gauge, "set")):
        monkeypatch.setattr(cls, method, lambda self, value, tags=None: threads.append(threading.current_thread()))
    ray_logger, _ = _loggers()
    for _ in range(3):
        _step(ray_logger, 256)
    assert threading.current_thread() not in threads
    deadline = time.monotonic() + 10
    while len(threads) < 3 * 256 and time.monotonic() < deadline:  # the keeper records them within a second
        time.sleep(0.1)
    assert len(threads) >= 3 * 256 and {t.name for t in threads} == {"tandem-gauge-keeper"}


def test_an_engine_outside_a_cluster_keeps_vllms_default_loggers():
    from vllm.v1.metrics.loggers import PrometheusStatLogger
    from vllm.v1.metrics.ray_wrappers import RayPrometheusStatLogger

    from tests.unit.test_engine_args import _spec

    assert engine_stat_loggers(_spec({})) is None
    ray_logger, prometheus_logger = engine_stat_loggers(_spec({}, pool=PoolId("batch", "prefill"), worker_id="w"))
    assert issubclass(ray_logger, RayPrometheusStatLogger) and prometheus_logger is PrometheusStatLogger
    assert ray_logger._gauge_cls.extra == {"tier": "batch", "pool": "prefill", "replica": "w"}


def test_every_counter_is_exported_at_zero_from_the_start(monkeypatch):
    """As vLLM's own registry shows them: an engine that never preempted exports
    vllm:num_preemptions_total 0, and Prometheus' increase() sees its first preemption."""
    from ray.util import metrics as ray_metrics

    zeros = []
    monkeypatch.setattr(ray_metrics.Counter, "_record",
                        lambda self, value, tags=None: zeros.append((self._name, {**self._default_tags, **tags}, value)))
    _loggers()
    names = {name for name, _, _ in zeros}
    assert {"vllm_num_preemptions", "vllm_prefix_cache_hits", "vllm_prompt_tokens", "vllm_request_success"} <= names
    assert all(value == 0.0 and LABELS.items() <= tags.items() for _, tags, value in zeros)
