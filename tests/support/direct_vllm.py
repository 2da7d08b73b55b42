"""One plain vLLM OpenAI server (`python -m vllm.entrypoints.openai.api_server`) on the tiny
float32 test model, for the differential test (issue 15): what vLLM's own server answers is
the reference tandem is held to.

It is started the way the integration cluster's engines are configured
(tests/integration/conftest.py, integration_config): same served name, dtype, context length,
KV cache size, batch size, eager mode, xgrammar without free JSON whitespace, and the hermes
tool parser. Register it with `pytest_plugins = ["tests.support.direct_vllm"]`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster.config import EngineConfig
from cluster.engine.engine_args import cli_args
from cluster.vllm_plugin import ENGINE_NICE
from loadtest.bench.engines import wait_healthy
from tests.conftest import TEST_STATE

DIRECT_VLLM_PORT = 8791  # clear of the test cluster's 8765-8767 and the GPU suite's 8795-8796
READY_TIMEOUT_S = 300
STATE = TEST_STATE / "direct-vllm"
LOG_TAIL_CHARS = 4000


def direct_vllm_command(model_dir: Path, port: int = DIRECT_VLLM_PORT) -> list[str]:
    """The api_server command line, built from what integration_config gives the test
    cluster's decode engines, so the two cannot drift apart."""
    # Imported here: tests/integration/conftest.py may import this module's fixture.
    from tests.support.integration_cluster import integration_config

    cfg = integration_config(model_dir)
    model, engine = cfg.model, cfg.tiers[cfg.default_tier].decode.engine
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir), "--served-model-name", model.served_name, "--dtype", model.dtype,
        "--max-model-len", str(model.max_model_len), "--host", "127.0.0.1", "--port", str(port),
        # Every vLLM engine argument of the pool, written as the engines' parser reads them.
        *cli_args(engine.vllm_args()),
    ]
    if model.tool_parser:
        cmd += ["--tool-call-parser", model.tool_parser, "--enable-auto-tool-choice"]
    if model.lora_adapters:  # what tandem's gateway and engines serve (model.lora_adapters)
        cmd += ["--enable-lora", "--max-loras", str(model.max_loras), "--max-lora-rank", str(model.max_lora_rank),
                "--lora-modules", *(f"{name}={path}" for name, path in model.lora_adapters.items())]
    return cmd


def direct_vllm_environment() -> dict[str, str]:
    """Scheduling only, never the answers: one core (every vLLM instance takes core 0
    otherwise, DESIGN.md), its cache under the test folder, and tandem's vLLM plugin flags that
    its own engines run with: no spinning, a lower priority, children that die with the server.
    One exception, a fix: vLLM 0.32's CPU LoRA ops give a base-model request batched beside
    adapter requests an adapter's delta (cluster/lora_cpu_patch.py, vLLM PR #48421), so plain
    vLLM's base answers would depend on what else it runs; the reference runs with tandem's fix."""
    return dict(
        os.environ,
        VLLM_CPU_OMP_THREADS_BIND="0",
        VLLM_ENABLE_V1_MULTIPROCESSING="1",
        VLLM_CACHE_ROOT=str(STATE / "vllm-cache"),
        TANDEM_NO_SPIN="1",
        TANDEM_EXIT_WITH_PARENT="1",
        TANDEM_LORA_CPU_PATCH="1",
        **{ENGINE_NICE: str(EngineConfig().cpu_niceness)},  # as the cluster's engines
    )


def _log_tail(log_path: Path) -> str:
    try:
        return log_path.read_text(errors="replace")[-LOG_TAIL_CHARS:]
    except OSError:
        return "(no log)"


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the server's process group (its EngineCore and worker too), SIGKILL after
    30 s; then SIGKILL to whatever of the group outlived its leader."""
    _signal_group(proc, signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        _signal_group(proc, signal.SIGKILL)
        proc.wait(10)
    _signal_group(proc, signal.SIGKILL)


def _start(model_dir: Path, log_path: Path) -> subprocess.Popen:
    from tests.support.integration_cluster import make_lora_adapters

    make_lora_adapters(model_dir)  # it serves the cluster's adapters
    with open(log_path, "wb") as log:
        # Its own process group, so stopping it reaches the children it spawns.
        return subprocess.Popen(direct_vllm_command(model_dir), env=direct_vllm_environment(),
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


@pytest.fixture(scope="session")
def direct_vllm_url(tiny_model_dir) -> str:
    """The URL of one plain vLLM OpenAI server on the tiny model; stopped at session end.

    Started a second time if its first start fails: once, on a machine loaded by other work, its
    worker process died silently while starting (vLLM: "WorkerProc initialization failed") and the
    server never turned healthy. This server is the yardstick, not the product under test; the
    first start's log is kept next to the second's."""
    STATE.mkdir(parents=True, exist_ok=True)
    log_path = STATE / "api_server.log"
    url = f"http://127.0.0.1:{DIRECT_VLLM_PORT}"
    why = lambda: f"log tail:\n{_log_tail(log_path)}"  # noqa: E731
    proc = _start(tiny_model_dir, log_path)
    try:
        try:
            wait_healthy(url, proc, time.monotonic() + READY_TIMEOUT_S, why)
        except (RuntimeError, TimeoutError) as first:
            _stop(proc)
            log_path.replace(STATE / "api_server.first-start.log")
            print(f"direct vLLM server: the first start failed, starting again ({str(first)[:200]})")
            proc = _start(tiny_model_dir, log_path)
            wait_healthy(url, proc, time.monotonic() + READY_TIMEOUT_S, why)
        yield url
    finally:
        _stop(proc)
