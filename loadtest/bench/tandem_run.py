"""A `tandem run` for the benchmarks that measure a real cluster from outside, as a user runs it
(redeploy.py, decode_kill.py, decode_drain.py): the config written with its model path made
absolute, the CLI started as a subprocess, /health awaited, and `tandem stop` at the end
whatever happened.

    async with TandemRun(config_path, cfg, log_folder, ready_timeout_s=900) as cluster:
        ...  # cluster.url, cluster.model, cluster.metrics(...)
        cluster.connect_driver()  # when the benchmark reads Serve's replica states

Nothing else may use the config's gateway port, Ray or metrics port meanwhile (the benchmarks'
commands take /tmp/tandem-cluster.lock, as the other cluster benchmarks do).
"""

from __future__ import annotations

import asyncio
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Optional

import httpx
import psutil
import yaml

from cluster.hardware import cpu_flags
from loadtest.measure.prom import metric_sum

TANDEM = [sys.executable, "-m", "cluster.cli"]


def resolved_config(config: Path, model_path: str = "") -> dict:
    """The config's YAML with model.path absolute (relative paths are the config folder's), or
    `model_path` where given: the copies written elsewhere must find the model."""
    cfg = yaml.safe_load(config.read_text())
    model = cfg.setdefault("model", {})
    if model_path:
        model["path"] = model_path
    elif model.get("path") and not Path(model["path"]).is_absolute():
        model["path"] = str((config.parent / model["path"]).resolve())
    return cfg


def machine() -> dict[str, Any]:
    """What the figures depend on: cores, memory and the CPU's matrix extensions (AVX2-only and
    AMX machines differ ~3x here)."""
    flags = cpu_flags()
    return {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
            "memory_gib": round(psutil.virtual_memory().total / (1 << 30), 1),
            "amx": "amx_tile" in flags, "avx512f": "avx512f" in flags}


async def wait_ready(url: str, deadline_s: float) -> None:
    """Until the gateway's /health answers 200 (every pool ready), by `deadline_s` (monotonic)."""
    async with httpx.AsyncClient(timeout=10) as client:
        while time.monotonic() < deadline_s:
            try:
                if (await client.get(f"{url}/health")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(2)
    raise TimeoutError(f"{url}/health never answered 200")


class TandemRun:
    """`tandem run --config <config>` for the length of an `async with`; `cfg` is the config as
    written (its gateway address, model name and ray.metrics_export_port are read from it)."""

    def __init__(self, config: Path, cfg: dict, log_folder: Path, *, ready_timeout_s: float = 900.0):
        self.config, self.cfg, self.log_folder, self.ready_timeout_s = config, cfg, log_folder, ready_timeout_s
        gateway = cfg.get("gateway", {})
        self.url = f"http://{gateway.get('host', '127.0.0.1')}:{gateway.get('port', 8000)}"
        self.model = cfg["model"].get("name") or Path(cfg["model"]["path"]).name
        port = cfg.get("ray", {}).get("metrics_export_port")
        self.metrics_url: Optional[str] = f"http://127.0.0.1:{port}/metrics" if port else None
        self.ready_s: Optional[float] = None
        self._process: Optional[asyncio.subprocess.Process] = None

    async def __aenter__(self) -> "TandemRun":
        with open(self.log_folder / "run.log", "wb") as log:
            self._process = await asyncio.create_subprocess_exec(
                *TANDEM, "run", "--config", str(self.config), stdout=log, stderr=asyncio.subprocess.STDOUT)
        t0 = time.monotonic()
        try:
            await wait_ready(self.url, t0 + self.ready_timeout_s)
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        self.ready_s = time.monotonic() - t0
        await asyncio.sleep(2)  # `tandem run` records Ray's address once ready (connect_driver reads it)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        stopper = await asyncio.create_subprocess_exec(*TANDEM, "stop")
        await stopper.wait()
        if self._process is not None:
            await self._process.wait()

    def metric(self, name: str, **labels: str) -> float:
        """The sum of a metric's samples from Ray's metrics port (the gateway's and replicas'
        counters, exported every few seconds), e.g. metric("ray_tandem_migrations_total",
        result="continued")."""
        if self.metrics_url is None:
            raise ValueError("the config sets no ray.metrics_export_port")
        return metric_sum(httpx.get(self.metrics_url, timeout=30).text, name, **labels)

    @staticmethod
    def connect_driver() -> None:
        """This process a driver of the running cluster's Ray (the address and token `tandem run`
        recorded, as `tandem redeploy` connects), to read Serve's replica states."""
        import ray

        from cluster.cli import RAY_ADDRESS_FILE
        from cluster.local import DEFAULT_RAY_TOKEN, LOCAL_RAY_ENV, _reload_ray_settings, ray_auth_env

        os.environ.update({**LOCAL_RAY_ENV, **ray_auth_env(DEFAULT_RAY_TOKEN)})
        _reload_ray_settings()  # Ray read its settings at import; the loopback address needs these
        ray.init(address=RAY_ADDRESS_FILE.read_text().strip(), logging_level="error", log_to_driver=False)


def replica_states(deployment: str) -> dict[str, int]:
    """Serve's replica count per state (RUNNING, STARTING, STOPPING, ...) of one deployment of the
    tandem app; needs `TandemRun.connect_driver()` first. A blocking call: run it in a thread."""
    from ray import serve

    from cluster.types import APP_NAME

    states = serve.status().applications[APP_NAME].deployments[deployment].replica_states
    return {getattr(state, "value", str(state)): n for state, n in states.items()}
