"""The gateway's HTTP app: vLLM's own OpenAI server app over tandem's engine client.

Why vLLM's serving classes (its `build_app` + `init_app_state`, the code behind `vllm serve`)
rather than its renderer and derenderer alone: the serving classes are where vLLM answers
everything a client may send — chat templates and content formats, tool-argument
normalisation, tool and reasoning parsers (streamed), n, echo, prompt logprobs, the model's
generation_config defaults, /v1/responses, /tokenize, /detokenize, /version, /docs — and they
consume exactly what an EngineClient yields. Implementing that one interface over the P/D
path (router/openai/engine_client.py) gives tandem vLLM's behaviour by construction, for every
route vLLM adds later too. tandem keeps what is its own in one middleware in front
(router/openai/edge.py): probes, readiness, API keys and tiers, body bounds, refusals.

Settings where tandem must differ from `vllm serve` are documented in router/README.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from router.openai.context import Caller
from router.openai.edge import TandemEdge
from router.openai.health import HealthCache
from router.openai.hosts import HostAllowList


def vllm_server_args(*, model_path: Path, served_name: str, dtype: str, max_model_len: int,
                     tool_parser: Optional[str] = None, reasoning_parser: Optional[str] = None,
                     structured_outputs: Optional[Mapping[str, Any]] = None,
                     lora_adapters: Mapping[str, str] = {}, max_loras: Optional[int] = None,
                     max_lora_rank: Optional[int] = None) -> Any:
    """The argparse Namespace `vllm serve` would build for this model (vLLM's own parser, so
    every default is vLLM's). With `lora_adapters` (name → path) vLLM's serving code lists them
    on /v1/models and resolves a request's `model` to one (`--enable-lora --lora-modules`)."""
    import json

    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    argv = ["--model", str(model_path), "--served-model-name", served_name, "--dtype", dtype,
            "--max-model-len", str(max_model_len), "--disable-log-stats", "--disable-uvicorn-access-log"]
    if tool_parser:
        argv += ["--tool-call-parser", tool_parser, "--enable-auto-tool-choice"]
    if reasoning_parser:
        argv += ["--reasoning-parser", reasoning_parser]
    if structured_outputs:
        argv += ["--structured-outputs-config", json.dumps(dict(structured_outputs))]
    if lora_adapters:
        argv += ["--enable-lora", "--lora-modules", *(f"{name}={path}" for name, path in lora_adapters.items())]
        argv += ["--max-loras", str(max_loras)] if max_loras is not None else []
        argv += ["--max-lora-rank", str(max_lora_rank)] if max_lora_rank is not None else []
    return make_arg_parser(FlexibleArgumentParser()).parse_args(argv)


def vllm_config_of(args: Any) -> Any:
    """The VllmConfig the engines run with, built without an engine (config and tokenizer)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext

    return AsyncEngineArgs.from_cli_args(args).create_engine_config(UsageContext.OPENAI_API_SERVER)


async def build_openai_app(
    engine_client: Any,
    args: Any,
    *,
    authenticate: Callable[[Mapping[str, str]], Caller],
    health_probe: Callable[[], Any],
    max_body_bytes: int = 4 * 1024 * 1024,
    body_read_timeout_s: float = 10.0,
    health_interval_s: float = 1.0,
    allowed_hosts: Optional[Sequence[str]] = None,
    ready_wait_s: float = 0.0,
    max_ready_waiters: int = 0,
) -> Any:
    """vLLM's FastAPI app for `args`, its state bound to `engine_client`, behind tandem's edge.
    `authenticate`: headers → Caller (raises OpenAIError to refuse); `health_probe`: async () →
    {"ready": bool, ...}; `allowed_hosts`: the Host values answered (None: no check);
    `ready_wait_s`, `max_ready_waiters`: requests before readiness wait (0: 503 at once)."""
    from vllm.entrypoints.launchers.api_server.app_state import init_app_state
    from vllm.entrypoints.launchers.app import build_app

    tasks = ("generate",)
    app = build_app(args, tasks, engine_client.model_config)
    await init_app_state(engine_client, app.state, args, tasks)
    # Wrapped, not add_middleware: vLLM's app has built its middleware stack already.
    edge: Any = TandemEdge(app, authenticate=authenticate,
                           health=HealthCache(health_probe, health_interval_s), max_body_bytes=max_body_bytes,
                           body_read_timeout_s=body_read_timeout_s, ready_wait_s=ready_wait_s,
                           max_ready_waiters=max_ready_waiters)
    if allowed_hosts is not None:
        edge = HostAllowList(edge, allowed=tuple(allowed_hosts))
    return edge
