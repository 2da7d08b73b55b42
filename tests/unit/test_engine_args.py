"""A pool's `engine:` takes vLLM's engine arguments by vLLM's names, read by vLLM's own parser
(cluster/engine/engine_args.py): `tandem check-config` accepts a config written with them,
refuses a name vLLM does not know naming the closest one and a value vLLM refuses naming the
pool and key, and what it checked is what the engine's AsyncEngineArgs get."""

from __future__ import annotations

import json

import pytest
import yaml
from pydantic import ValidationError

from cluster import cli
from cluster.config import ClusterConfig, ConfigError, EngineConfig, KVTransferConfig
from cluster.engine.base import EngineSpec
from cluster.engine.engine_args import _parser, cli_args, parse
from cluster.engine.vllm import engine_args

# Written as a `vllm serve` user would: vLLM's names and sizes, configs as mappings.
VLLM_NAMED = {
    "model": {"path": "/m", "max_model_len": 1024},
    "tiers": {"interactive": {
        "prefill": {"engine": {"kv_cache_memory_bytes": "512M", "max_num_seqs": 8, "disable_cascade_attn": True,
                               "max_logprobs": 2, "max_num_batched_tokens": "2k", "kv_cache_dtype": "auto"}},
        "decode": {"engine": {"kv_cache_memory_bytes": None, "gpu_memory_utilization": 0.5, "disable_cascade_attn": True,
                              "speculative_config": {"method": "ngram", "num_speculative_tokens": 3,
                                                     "prompt_lookup_max": 3},
                              "structured_outputs_config": {"backend": "xgrammar", "disable_any_whitespace": True},
                              "compilation_config": {"mode": 0}, "enforce_eager": False, "cpu_niceness": 0}},
    }},
}


def _check_config(tmp_path, config: dict, capsys) -> tuple[int, str, str]:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    code = cli.main(["check-config", str(path)])
    out, err = capsys.readouterr()
    return code, out, err


def _with_engine(role: str, **engine) -> dict:
    return {"model": {"path": "/m"}, "tiers": {"interactive": {role: {"engine": engine}}}}


def test_check_config_accepts_vllm_names(tmp_path, capsys):
    code, out, err = _check_config(tmp_path, VLLM_NAMED, capsys)
    assert code == 0, err
    engines = json.loads(out)["tiers"]["interactive"]
    assert engines["prefill"]["engine"]["kv_cache_memory_bytes"] == 512 << 20
    assert engines["prefill"]["engine"]["disable_cascade_attn"] is True
    assert engines["decode"]["engine"]["gpu_memory_utilization"] == 0.5


@pytest.mark.parametrize("typo, suggestion", [
    ("max_num_seq", "max_num_seqs"), ("gpu_memory_utilisation", "gpu_memory_utilization"),
    ("disable-cascade-attn", "disable_cascade_attn"), ("cpu_nicenes", "cpu_niceness"), ("kv_cache_bytes", "kv_cache_memory_bytes"),
])
def test_a_typo_is_refused_naming_the_closest_name(tmp_path, capsys, typo, suggestion):
    code, _, err = _check_config(tmp_path, _with_engine("decode", **{typo: 1}), capsys)
    assert code == 2
    assert f"tiers.interactive.decode.engine.{typo}: not a vLLM engine argument" in err
    assert f"did you mean {suggestion}?" in err


@pytest.mark.parametrize("key, value, says", [
    ("kv_cache_dtype", "int3", "invalid choice"),
    ("max_logprobs", "many", "invalid int value"),
    ("structured_outputs_config", {"backend": "bogus"}, "backend"),
    ("structured_outputs_config", {"disable_any_whitespace": True}, "only supported for xgrammar and guidance"),
])
def test_vllm_refuses_a_bad_value_naming_pool_and_key(tmp_path, capsys, key, value, says):
    code, _, err = _check_config(tmp_path, _with_engine("prefill", **{key: value}), capsys)
    assert code == 2
    assert f"tiers.interactive.prefill.engine.{key}: vLLM refuses" in err and says in err


def test_every_problem_in_one_message(tmp_path, capsys):
    config = {"model": {"path": "/m"}, "tiers": {"interactive": {"prefill": {"engine": {"max_num_seq": 1}},
                                                                   "decode": {"engine": {"max_logprobs": "x"}}}}}
    code, _, err = _check_config(tmp_path, config, capsys)
    assert code == 2 and "(2 problems)" in err


@pytest.mark.parametrize("engine, says", [
    ({"dtype": "float16"}, "set model.dtype instead"),
    ({"max_model_len": 4096}, "set model.max_model_len instead"),
    ({"kv_transfer_config": {}}, "set kv_transfer"),
    ({"gpu_memory_utilization": 0.9}, "set kv_cache_memory_bytes: null"),
])
def test_what_tandem_sets_is_refused_at_load_saying_where_it_goes(engine, says):
    with pytest.raises(ValidationError, match=says):
        ClusterConfig.model_validate(_with_engine("decode", **engine))


def test_speculative_decoding_belongs_on_decode():
    with pytest.raises(ValidationError, match=r"tiers\.interactive\.prefill\.engine\.speculative_config"):
        ClusterConfig.model_validate(_with_engine("prefill", speculative_config={"method": "ngram"}))


def _spec(engine: dict, **kw) -> EngineSpec:
    base = dict(model_path="/m", served_name="m", dtype="float32", max_model_len=1024,
                engine=EngineConfig.model_validate(engine), kv_role=None, kv=KVTransferConfig(), nixl=None,
                cpu_binding="0", on_gpu=False, worker_id="w", config_key="tiers.interactive.decode.engine")
    return EngineSpec(**{**base, **kw})


def test_pass_through_reaches_the_engine_args_the_engine_is_built_with():
    cfg = ClusterConfig.model_validate(VLLM_NAMED)
    prefill = engine_args(_spec(cfg.tiers["interactive"].prefill.engine.model_dump(), reasoning_parser="qwen3"))
    assert (prefill.model, prefill.served_model_name, prefill.dtype, prefill.max_model_len) == ("/m", ["m"], "float32",
                                                                                                  1024)
    assert prefill.kv_cache_memory_bytes == 512 << 20 and prefill.max_num_batched_tokens == 2000
    assert (prefill.disable_cascade_attn, prefill.max_logprobs, prefill.max_num_seqs) == (True, 2, 8)
    assert prefill.reasoning_parser == "qwen3"
    # tandem's defaults where it differs from vLLM, and vLLM's own for what is unset.
    assert prefill.enforce_eager is True and prefill.enable_prefix_caching is True
    assert prefill.gpu_memory_utilization == 0.92 and prefill.speculative_config is None

    decode = engine_args(_spec(cfg.tiers["interactive"].decode.engine.model_dump()))
    assert decode.kv_cache_memory_bytes is None and decode.gpu_memory_utilization == 0.5
    assert decode.speculative_config == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
    assert decode.structured_outputs_config.backend == "xgrammar"
    assert decode.structured_outputs_config.disable_any_whitespace is True
    assert decode.compilation_config.mode == 0 and decode.enforce_eager is False
    assert not hasattr(decode, "cpu_niceness")  # tandem's own key stays tandem's


def test_engine_start_names_the_pool_of_a_bad_key():
    with pytest.raises(ConfigError, match=r"tiers\.interactive\.decode\.engine\.max_num_seq: .*max_num_seqs"):
        engine_args(_spec({"max_num_seq": 4}))


@pytest.mark.parametrize("settings", [
    {"disable_cascade_attn": True, "enforce_eager": False, "aggregate_engine_logging": False},
    {"cudagraph_capture_sizes": [1, 2, 4], "max_num_batched_tokens": "8k", "kv_cache_memory_bytes": "1G"},
    {"speculative_config": {"method": "ngram", "num_speculative_tokens": 2}, "gpu_memory_utilization": 0.7},
])
def test_settings_mean_what_vllm_serve_config_makes_of_them(tmp_path, settings):
    """Parsed one key at a time, as vLLM's own --config YAML loader makes a command line of them."""
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump(settings))
    vllm_serve = vars(_parser().parse_args(_parser().load_config_file(str(path))))
    assert parse(settings) == {key: vllm_serve[key] for key in settings}


def test_cli_args_are_vllm_flags():
    assert cli_args({"enforce_eager": False, "max_num_seqs": 4, "speculative_config": {"method": "ngram"}}) == [
        "--no-enforce-eager", "--max-num-seqs", "4", "--speculative-config", '{"method": "ngram"}']


def test_engine_spans_pass_the_otlp_endpoint_to_vllm_unless_the_pool_sets_its_own():
    """observability.tracing.engine_spans (cluster/engine/replica.py engine_tracing)."""
    from cluster.config import TracingConfig
    from cluster.engine.base import EngineTracing
    from cluster.engine.replica import engine_tracing
    from cluster.engine.vllm import engine_environment

    on = TracingConfig(enabled=True, endpoint="http://otel:4318/v1/traces", protocol="http", engine_spans=True)
    assert engine_tracing(on) == EngineTracing("http://otel:4318/v1/traces", "http", "tandem-engine")
    assert engine_tracing(TracingConfig(enabled=True, endpoint="http://otel:4317")) is None  # opt-in
    assert engine_tracing(TracingConfig(endpoint="http://otel:4317", engine_spans=True)) is None  # off
    traced = _spec({}, tracing=engine_tracing(on))
    assert engine_args(traced).otlp_traces_endpoint == "http://otel:4318/v1/traces"
    assert engine_args(_spec({})).otlp_traces_endpoint is None
    # vLLM reads the protocol and the service name from the environment only.
    env = engine_environment(traced)
    assert env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf" and env["OTEL_SERVICE_NAME"] == "tandem-engine"
    assert "OTEL_SERVICE_NAME" not in engine_environment(_spec({}))
    own = engine_args(_spec({"otlp_traces_endpoint": "http://mine:4317"}, tracing=engine_tracing(on)))
    assert own.otlp_traces_endpoint == "http://mine:4317"


@pytest.mark.parametrize("settings, fix", [({"exporter": "file", "file_dir": "/tmp/t"}, "exporter: otlp"),
                                           ({"endpoint": "https://otel:4317", "insecure": False}, "protocol: http")])
def test_engine_spans_that_vllm_cannot_export_are_refused(settings, fix):
    from cluster.config import TracingConfig

    with pytest.raises(ValueError, match=fix):
        TracingConfig(enabled=True, engine_spans=True, **settings)


def test_an_untraced_request_leaves_vllms_tracer_no_span():
    """With engine spans on, a request the gateway does not trace reaches vLLM with an unsampled
    parent (vllm.py UNSAMPLED_PARENT): vLLM's tracer, ParentBased and always on as vLLM builds it,
    records nothing; with no parent at all it would start a trace of its own."""
    from opentelemetry.sdk.trace import TracerProvider
    from vllm.tracing import extract_trace_context

    from cluster.engine.vllm import UNSAMPLED_PARENT

    tracer = TracerProvider().get_tracer("vllm-like")  # vLLM's provider: the SDK's default sampler
    assert not tracer.start_span("llm_request", context=extract_trace_context(UNSAMPLED_PARENT)).is_recording()
    assert tracer.start_span("llm_request", context=extract_trace_context(None)).is_recording()
    sampled = {"traceparent": f"00-{7:032x}-{9:016x}-01"}
    assert tracer.start_span("llm_request", context=extract_trace_context(sampled)).is_recording()
