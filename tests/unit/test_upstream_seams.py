"""One fast check per upstream seam (UPSTREAM.md): where tandem reaches into vLLM, Ray or NIXL
beyond their public API, this file fails first on an upgrade, and each failure names the tandem
file to update. The register's rows and this file's tests go together: a new seam gets both.

Seams an existing unit test already proves are not checked twice here; UPSTREAM.md names that
test (the block hash: tests/unit/test_prefix_cache_isolation.py, against vLLM's own hasher).

Nothing here starts Ray, an engine or a NIXL agent: signatures, names and a few lines of
upstream source, which is what a silent break changes first."""

from __future__ import annotations

import inspect
import re
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import REPO


def update(tandem_file: str, what: str) -> str:
    """The failure message: what changed upstream and the tandem file that must follow it."""
    return f"{what}: update {tandem_file} and its row in UPSTREAM.md"


def _source_of(module) -> str:
    return inspect.getsource(module)


# -- vLLM ------------------------------------------------------------------------------------

def test_the_no_spin_patch_still_applies_to_vllms_shm_queues():
    from vllm.distributed.device_communicators import shm_broadcast

    from cluster import no_spin

    no_spin.check(shm_broadcast)  # raises, naming the patch and its vLLM version, if it no longer fits
    # Silent break: the busy loop moves elsewhere and the patch, still applied, changes nothing.
    assert "busy_loop_s" in inspect.getsource(shm_broadcast.SpinCondition.wait), \
        update("cluster/no_spin.py", "SpinCondition.wait no longer spins on busy_loop_s")
    with pytest.raises(RuntimeError, match=r"cluster/no_spin\.py.*vLLM 0\.32\.0"):
        no_spin.check(SimpleNamespace())  # the loud path names the file and the version


def test_the_nixl_cpu_patch_still_applies_to_vllms_nixl_worker():
    import importlib

    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import base_worker

    from kv_transfer import cpu_patch

    cpu_patch.check(base_worker)
    # Silent breaks: NIXL's agent no longer builds its agent through nixlBind.nixlAgent (the
    # progress-delay wrapper is never reached), or vLLM's worker no longer re-pins the thread.
    api = importlib.import_module(base_worker.NixlWrapper.__module__)
    assert "nixlBind.nixlAgent(" in inspect.getsource(api.nixl_agent.__init__), \
        update("kv_transfer/cpu_patch.py", "NIXL's nixl_agent no longer makes its agent with nixlBind.nixlAgent")
    assert "sched_setaffinity" in inspect.getsource(base_worker.NixlBaseConnectorWorker.__init__), \
        update("kv_transfer/cpu_patch.py", "vLLM's NIXL worker no longer sets the thread's affinity (retire part 2?)")
    with pytest.raises(RuntimeError, match=r"kv_transfer/cpu_patch\.py.*vLLM 0\.32\.0"):
        cpu_patch.check(SimpleNamespace())


def test_vllm_loads_general_plugins_from_the_group_tandem_registers_in():
    from vllm import plugins

    groups = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]
    assert plugins.DEFAULT_PLUGINS_GROUP in groups, \
        update("pyproject.toml and cluster/vllm_plugin.py", f"vLLM loads plugins from {plugins.DEFAULT_PLUGINS_GROUP!r}")
    assert groups[plugins.DEFAULT_PLUGINS_GROUP] == {"tandem": "cluster.vllm_plugin:register"}, \
        update("pyproject.toml", "tandem's vLLM plugin entry point moved")


def test_the_nixl_connector_methods_tandem_overrides_exist():
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import pull_scheduler
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector import NixlConnector

    from kv_transfer.connector import NixlConnector as Ours

    assert list(inspect.signature(NixlConnector.get_num_new_matched_tokens).parameters) == \
        ["self", "request", "num_computed_tokens"], \
        update("kv_transfer/connector.py", "NixlConnector.get_num_new_matched_tokens changed its parameters")
    assert issubclass(Ours, NixlConnector)
    assert Ours.get_num_new_matched_tokens.__qualname__.startswith("NixlConnector."), "our override is the one called"
    # The cap reads remote_num_tokens, which vLLM's prefill side puts in every handoff; a
    # renamed key makes kv_transfer/first_token.py tokens_to_load fall back to no cap, silently.
    scheduler = _source_of(pull_scheduler)
    assert "remote_num_tokens=" in scheduler, \
        update("kv_transfer/first_token.py", "vLLM's handoff no longer carries remote_num_tokens")


def test_the_nixl_extra_config_keys_tandem_sets_are_read_by_vllm():
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import base_scheduler, base_worker

    from kv_transfer.nixl import kv_transfer_config

    ours = kv_transfer_config(SimpleNamespace(buffer_device="cpu", failure_policy="recompute"), "kv_producer", on_gpu=False)
    read = _source_of(base_worker) + _source_of(base_scheduler)
    for key in ours["kv_connector_extra_config"]:  # an unknown extra key is ignored, not refused
        assert re.search(rf'get_from_extra_config\(\s*"{key}"', read), \
            update("kv_transfer/nixl.py", f"vLLM's NIXL connector no longer reads extra config {key!r}")
    fields = set(KVTransferConfig.__dataclass_fields__)
    assert set(ours) - {"kv_connector_extra_config"} <= fields, \
        update("kv_transfer/nixl.py", f"KVTransferConfig lacks {set(ours) - fields}")


def test_tandems_block_hash_seed_and_int_form_are_vllms():
    """The hash itself is proven against vLLM's hasher in
    tests/unit/test_prefix_cache_isolation.py::test_router_hashes_equal_vllms_with_and_without_a_salt;
    here the defaults that test inherits from its environment."""
    from vllm.config import CacheConfig
    from vllm.v1.core import kv_cache_utils

    from cluster.hashing import DEFAULT_SEED, BlockHasher, external_hash

    assert kv_cache_utils.DEFAULT_NONE_HASH_SEED == DEFAULT_SEED, \
        update("cluster/hashing.py", "vLLM's NONE_HASH seed without PYTHONHASHSEED changed")
    assert CacheConfig.__dataclass_fields__["prefix_caching_hash_algo"].default == "sha256", \
        update("cluster/hashing.py", "vLLM's default prefix-cache hash is no longer sha256")
    raw = BlockHasher(4).raw_hashes(list(range(8)))
    assert [kv_cache_utils.maybe_convert_block_hash(h) for h in raw] == [external_hash(h) for h in raw], \
        update("cluster/hashing.py", "KV events carry block hashes in another integer form")


def test_vllms_kv_event_wire_format_is_what_the_router_decodes():
    import msgspec
    from vllm.distributed import kv_events

    from cluster.engine.fake_kv_events import block_stored
    from router.kv_events import decode_batch
    from router.prefix_index import AllBlocksCleared, BlockRemoved, BlockStored

    batch = kv_events.KVEventBatch(ts=0.0, events=[
        kv_events.BlockStored(block_hashes=[1, 2], parent_block_hash=None, token_ids=[1, 2], block_size=1,
                              lora_id=None, medium="CPU", lora_name=None),
        kv_events.BlockRemoved(block_hashes=[2], medium=None),
        kv_events.AllBlocksCleared(),
    ])
    payload = msgspec.msgpack.Encoder().encode(batch)  # as vLLM's ZmqEventPublisher encodes
    assert decode_batch("w", payload) == [BlockStored("w", (1, 2)), BlockRemoved("w", (2,)), AllBlocksCleared("w")], \
        update("router/kv_events.py", "vLLM's KV-event batch decodes differently")
    # FakeEngine speaks the same format: vLLM's own type takes what it publishes.
    msgspec.convert(block_stored([5], None, [1, 2], 2), kv_events.BlockStored)
    assert "self._pack = msgspec.msgpack.Encoder()" in inspect.getsource(kv_events.ZmqEventPublisher), \
        update("router/kv_events.py and cluster/engine/fake_kv_events.py", "vLLM's publisher encodes differently")


def test_vllm_metric_names_tandem_reads_are_defined_by_vllm():
    import vllm
    from vllm.v1.metrics.stats import PromptTokenStats

    from cluster import vllm_metrics as vm

    root = Path(vllm.__file__).parent
    kinds: dict[str, str] = {}  # family → gauge | counter | histogram, as vLLM constructs it
    for path in set(vm.FAMILIES.values()):
        text = (root / path).read_text()
        for kind, name in re.findall(r"self\._(gauge|counter|histogram)_cls\(\s*name=\"(vllm:[^\"]+)\"", text):
            kinds[name] = kind
    for family in vm.FAMILIES:
        assert family in kinds, update("cluster/vllm_metrics.py", f"vLLM no longer defines {family} in {vm.FAMILIES[family]}")
    suffixes = {"gauge": ("",), "counter": ("_total",), "histogram": ("_sum", "_count")}
    for name, source in vm.SAMPLES:
        family = next((f for f in vm.FAMILIES if name.startswith(f)), None)
        assert family is not None and name[len(family):] in suffixes[kinds[family]], \
            update("cluster/vllm_metrics.py", f"{name} is not a sample of a {kinds.get(family, 'known')} family")
        assert source is None or source in PromptTokenStats.ALL_SOURCES, \
            update("cluster/vllm_metrics.py", f"vLLM has no prompt-token source {source!r}")


def test_vllms_ray_stat_logger_is_what_vllm_ray_metrics_extends():
    from ray._private.telemetry import open_telemetry_metric_recorder as otel
    from vllm.v1.metrics import loggers, ray_wrappers

    from cluster.engine import vllm_ray_metrics as ours

    here = "cluster/engine/vllm_ray_metrics.py"
    for attr in ("_gauge_cls", "_counter_cls", "_histogram_cls", "_kv_connector_cls", "_spec_decoding_cls",
                 "_perf_metrics_cls"):
        assert hasattr(ray_wrappers.RayPrometheusStatLogger, attr), update(here, f"vLLM's Ray logger has no {attr}")
    base = ray_wrappers.RayPrometheusMetric
    assert list(inspect.signature(base._get_tag_keys).parameters) == ["labelnames"], \
        update(here, "vLLM's RayPrometheusMetric._get_tag_keys changed")
    assert "ReplicaId" in inspect.getsource(base._build_tags) and "*labels, **labelskwargs" in \
        inspect.getsource(base._build_tags), update(here, "vLLM's RayPrometheusMetric._build_tags changed")
    assert base._get_sanitized_opentelemetry_name("vllm:a_b") == "vllm_a_b", \
        update(f"{here} and cluster/observability.py VLLM_RELABEL", "vLLM names its Ray metrics differently")
    assert otel.NAMESPACE == "ray", \
        update("cluster/observability.py VLLM_RELABEL", "Ray's agent no longer prefixes metric names with ray_")
    # The in-process logger tandem reads must be made last (ours.stat_loggers), and is then the only one.
    assert "unregister_vllm_metrics()" in inspect.getsource(loggers.PrometheusStatLogger.__init__), \
        update(here, "vLLM's PrometheusStatLogger no longer unregisters on construction: the order may be free")
    assert "if not custom_prometheus_logger:" in inspect.getsource(loggers.StatLoggerManager.__init__), \
        update(here, "vLLM adds its default Prometheus logger differently")
    assert ours.stat_loggers("t", "decode", "r")[-1] is loggers.PrometheusStatLogger


def test_the_gateways_engine_client_implements_vllms_interface():
    from vllm.engine.protocol import EngineClient
    from vllm.v1.engine.input_processor import InputProcessor

    from router.openai.engine_client import PDEngineClient

    assert not PDEngineClient.__abstractmethods__, \
        update("router/openai/engine_client.py", f"EngineClient added {sorted(PDEngineClient.__abstractmethods__)}")
    missing = [m for m in EngineClient.__abstractmethods__ if m not in PDEngineClient.__dict__]
    assert not missing, update("router/openai/engine_client.py", f"EngineClient methods left to vLLM's defaults: {missing}")
    assert list(inspect.signature(InputProcessor.__init__).parameters)[:3] == ["self", "vllm_config", "renderer"], \
        update("router/openai/engine_client.py", "InputProcessor's constructor changed")
    process = inspect.signature(InputProcessor.process_inputs).parameters
    assert list(process)[:4] == ["self", "request_id", "prompt", "params"] and "supported_tasks" in process, \
        update("router/openai/engine_client.py", "InputProcessor.process_inputs changed its parameters")


def test_vllms_server_app_builders_take_what_the_gateway_passes():
    from vllm.entrypoints.launchers.api_server.app_state import init_app_state
    from vllm.entrypoints.launchers.app import build_app
    from vllm.entrypoints.launchers.cli_args import make_arg_parser

    assert list(inspect.signature(build_app).parameters)[:3] == ["args", "supported_tasks", "model_config"], \
        update("router/openai/app.py", "vLLM's build_app changed its parameters")
    assert list(inspect.signature(init_app_state).parameters)[:4] == ["engine_client", "state", "args", "supported_tasks"], \
        update("router/openai/app.py", "vLLM's init_app_state changed its parameters")
    assert list(inspect.signature(make_arg_parser).parameters) == ["parser"], \
        update("router/openai/app.py", "vLLM's make_arg_parser changed its parameters")


def test_the_engine_wrappers_vllm_calls_exist():
    """cluster/engine/vllm.py: the KV-event sockets the EngineCore bound, and the engine input
    that replaces the raw TokensPrompt vLLM 0.32 warns about (UPSTREAM.md)."""
    from vllm.inputs.engine import tokens_input
    from vllm.v1.engine.async_llm import AsyncLLM

    assert callable(getattr(AsyncLLM, "get_kv_event_sources", None)), \
        update("cluster/engine/vllm.py", "AsyncLLM.get_kv_event_sources is gone")
    assert tokens_input([1, 2], cache_salt="s") == {"type": "token", "prompt_token_ids": [1, 2], "cache_salt": "s"}, \
        update("cluster/engine/vllm.py", "vLLM's tokens_input changed (the engine input _prompt should build)")


def test_vllms_engine_tracing_takes_what_tandem_passes():
    """cluster/engine/vllm.py with observability.tracing.engine_spans: the engine argument and
    the per-request trace headers (UPSTREAM.md row 23)."""
    import dataclasses
    import inspect

    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    assert "otlp_traces_endpoint" in {f.name for f in dataclasses.fields(AsyncEngineArgs)}, \
        update("cluster/engine/vllm.py", "AsyncEngineArgs.otlp_traces_endpoint is gone")
    assert "trace_headers" in inspect.signature(AsyncLLM.generate).parameters, \
        update("cluster/engine/vllm.py", "AsyncLLM.generate takes no trace_headers")
    from vllm.tracing import otel

    # The exporter's protocol comes from the environment only (engine_environment sets it).
    assert "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL" in inspect.getsource(otel.get_span_exporter), \
        update("cluster/engine/vllm.py", "vLLM's get_span_exporter no longer reads OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
    # Its provider keeps the SDK's default sampler (parent-based): UNSAMPLED_PARENT silences a request.
    assert "sampler" not in inspect.getsource(otel.init_otel_tracer), \
        update("cluster/engine/vllm.py", "vLLM's tracer sets its own sampler: check UNSAMPLED_PARENT still drops spans")


def test_vllms_incremental_detokenizer_is_what_answer_text_replays(tiny_model_dir):
    """router/pd/answer_text.py: built from an EngineCoreRequest of the fields it passes, the
    detokenizer the engines run (FastIncrementalDetokenizer for a tokenizers backend), with
    update / get_next_output_text (UPSTREAM.md row 24)."""
    from vllm import SamplingParams
    from vllm.tokenizers import get_tokenizer
    from vllm.v1.engine.detokenizer import FastIncrementalDetokenizer

    from cluster.protocol import EngineRequest
    from router.pd.answer_text import AnswerText

    tokenizer = get_tokenizer(str(tiny_model_dir))
    ids = tokenizer.encode("hello there", add_special_tokens=False)
    text = AnswerText(tokenizer, EngineRequest("r", tuple(ids[:1]), SamplingParams(temperature=0), tier="t"), ids[1:2])
    assert isinstance(text._detok, FastIncrementalDetokenizer), \
        update("router/pd/answer_text.py", "vLLM's engines no longer detokenize with FastIncrementalDetokenizer")
    assert text._detok.output_token_ids == list(ids[1:2]), \
        update("router/pd/answer_text.py", "IncrementalDetokenizer.update no longer records the tokens sent")


# -- Ray ---------------------------------------------------------------------------------------

def test_a_ray_counter_is_made_at_zero_through_record():
    """cluster/metrics.py (`inc(0)`) and cluster/engine/vllm_ray_metrics.py (every labelled vLLM
    counter) create a counter's series at 0 through Ray's private `_record`, as its public `inc`
    refuses 0."""
    from ray.util import metrics as ray_metrics

    here = "cluster/metrics.py _BoundCounter.inc and cluster/engine/vllm_ray_metrics.py _Counter.labels"
    assert list(inspect.signature(ray_metrics.Metric._record).parameters) == ["self", "value", "tags"], \
        update(here, "Ray's Metric._record changed")
    assert "value <= 0" in inspect.getsource(ray_metrics.Counter.inc), \
        update(here, "Ray's Counter.inc may accept 0 now: use it instead of _record")

def test_the_serve_grpc_patch_still_applies():
    from ray.serve._private import replica

    assert callable(getattr(replica, "add_port_to_grpc_server", None)), \
        update("cluster/serve_patch.py", "Serve's replica module has no add_port_to_grpc_server")
    # Silent break: Serve binds another way, and the narrowing changes nothing.
    assert 'add_port_to_grpc_server(self._server, "[::]:0")' in inspect.getsource(replica.Replica._on_initialized), \
        update("cluster/serve_patch.py", "Serve no longer binds its replica gRPC server through add_port_to_grpc_server")


def test_serves_request_router_surface_is_what_kv_aware_routing_uses():
    import ray.serve.request_router as public
    from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

    from router.routing.serve_router import KVAwareRequestRouter

    assert {"PendingRequest", "RequestRouter", "RunningReplica"} <= set(public.__all__)
    for hook in ("initialize_state", "update_replicas", "choose_replicas"):
        theirs, ours = inspect.signature(getattr(RequestRouter, hook)), inspect.signature(getattr(KVAwareRequestRouter, hook))
        assert list(theirs.parameters) == list(ours.parameters), \
            update("router/routing/serve_router.py", f"RequestRouter.{hook} takes {list(theirs.parameters)}")
    init = inspect.getsource(RequestRouter.__init__)
    for private in ("self._deployment_id =", "self._replica_queue_len_cache ="):
        assert private in init, update("router/routing/serve_router.py", f"RequestRouter no longer sets {private[:-2]}")
    fields = PendingRequest.__dataclass_fields__
    assert "args" in fields and "routing_context" in fields, \
        update("router/routing/serve_router.py", "PendingRequest lost args or routing_context")
    from ray.serve._private.request_router.common import RequestRoutingContext  # the type of routing_context

    assert "should_backoff" in RequestRoutingContext.__dataclass_fields__, \
        update("router/routing/serve_router.py", "Serve's routing context has no should_backoff")
    for attr in ("replica_id", "max_ongoing_requests", "routing_stats"):
        assert isinstance(getattr(RunningReplica, attr, None), property), \
            update("router/routing/serve_router.py", f"RunningReplica.{attr} is gone")


def test_serves_request_context_members_tandem_sets_exist():
    import dataclasses

    from ray.serve import context

    for name in ("_get_serve_request_context", "_serve_request_context"):
        assert hasattr(context, name), update("router/pd/serve_calls.py", f"ray.serve.context.{name} is gone")
    fields = {f.name for f in dataclasses.fields(context._get_serve_request_context())}
    assert "_internal_request_id" in fields, update("router/pd/serve_calls.py", "Serve's request context has no _internal_request_id")


def test_rays_settings_reload_hooks_exist():
    from ray._private import ray_constants
    from ray._raylet import AuthenticationTokenLoader, Config

    assert hasattr(ray_constants, "ENABLE_RAY_CLUSTER") and callable(getattr(Config, "initialize", None)), \
        update("cluster/local.py", "Ray's ENABLE_RAY_CLUSTER or Config.initialize is gone (_reload_ray_settings)")
    assert callable(getattr(AuthenticationTokenLoader.instance(), "reset_cache", None)), \
        update("cluster/local.py", "Ray's AuthenticationTokenLoader.reset_cache is gone (_reload_ray_settings)")
    # An environment variable Ray reads but does not document: workers at nice 15 again, silently.
    assert ray_constants.RAY_WORKER_NICENESS == "RAY_worker_niceness", \
        update("cluster/local.py", "Ray renamed RAY_worker_niceness (LOCAL_RAY_ENV)")


def test_serve_awaits_an_async_destructor():
    from ray.serve._private.replica import UserCallableWrapper

    source = inspect.getsource(UserCallableWrapper.call_destructor)
    assert "self._callable.__del__" in source and "await self._call_func_or_gen" in source, \
        update("router/gateway.py", "Serve no longer awaits the deployment's __del__ (the gateway's teardown)")


def test_serves_private_client_the_serve_tests_tear_down_exists():
    from ray.serve import context

    assert hasattr(context, "_global_client") and callable(getattr(context, "_disconnect", None)), \
        update("tests/serve/conftest.py", "ray.serve.context._global_client or _disconnect is gone (_end_ray)")
    from ray.serve._private.common import DeploymentID
    from ray.serve._private.controller import ServeController

    assert "target_num_replicas" in inspect.signature(ServeController.update_deployment_replicas).parameters, \
        update("tests/serve/test_drain.py", "ServeController.update_deployment_replicas changed (the external scaler)")
    assert {"name", "app_name"} <= set(inspect.signature(DeploymentID).parameters), \
        update("tests/serve/test_drain.py", "DeploymentID's fields changed")


# -- NIXL --------------------------------------------------------------------------------------

def test_nixls_python_api_module_has_what_tandem_imports():
    import nixl._api as api

    for name in ("nixl_agent", "nixl_agent_config", "nixlBind"):
        assert hasattr(api, name), \
            update("cluster/doctor.py, kv_transfer/bench/nixl_transfer.py, kv_transfer/bench/progress.py",
                   f"nixl._api.{name} is gone")


def test_vllms_model_config_gives_the_kv_block_size_in_bytes():
    """cluster/engine/vllm.py kv_block_bytes (the decode span's tandem.kv.bytes; UPSTREAM.md row 25)."""
    from vllm.config import ModelConfig
    from vllm.utils import torch_utils

    for name in ("get_total_num_hidden_layers", "get_total_num_kv_heads", "get_head_size", "use_mla", "is_hybrid"):
        assert hasattr(ModelConfig, name), update("cluster/engine/vllm.py", f"vLLM's ModelConfig.{name} is gone")
    assert hasattr(torch_utils, "kv_cache_dtype_str_to_dtype"), \
        update("cluster/engine/vllm.py", "vllm.utils.torch_utils.kv_cache_dtype_str_to_dtype is gone")


def test_vllms_scheduler_stats_carry_the_iteration_details_the_step_log_reads():
    """cluster/engine/step_log.py (a benchmark's engine step timings; UPSTREAM.md row 27)."""
    import dataclasses

    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.metrics.stats import SchedulerIterationDetails, SchedulerStats

    from cluster.engine.step_log import step_row

    assert "enable_logging_iteration_details" in {f.name for f in dataclasses.fields(AsyncEngineArgs)}, \
        update("cluster/engine/vllm.py", "vLLM's engine argument enable_logging_iteration_details is gone")
    assert "iteration_details" in {f.name for f in dataclasses.fields(SchedulerStats)}, \
        update("cluster/engine/step_log.py", "vLLM's SchedulerStats.iteration_details is gone")
    details = SchedulerIterationDetails(iteration_index=1, num_ctx_requests=1, num_ctx_tokens=256,
                                        num_generation_requests=2, num_generation_tokens=2, elapsed_ms=400.0)
    stats = SchedulerStats(num_running_reqs=3, num_waiting_reqs=0, iteration_details=details)
    assert step_row(details, stats, 1.0)["ctx_tokens"] == 256 and not details.is_dummy
