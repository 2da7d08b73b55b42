"""Start and stop a tandem cluster on Ray: a local one (laptop, CI) or an existing one.

`LocalCluster(cfg).start()` returns once /health says both pools serve, printing progress
while engines load; `stop()` tears the Serve app down (engines shut down in their replicas)
and then Ray. The integration tests use exactly this, so what they prove is what users run.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.request
from pathlib import Path
from typing import Callable, Optional

from cluster.config import ClusterConfig

# Local-only Ray settings, measured on these machines (../shared/DESIGN.md):
LOCAL_RAY_ENV = {
    "RAY_AUTH_MODE": "disabled",  # Ray 2.60 token auth breaks a second local driver
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # keep the 127.0.0.1 node address
    "RAY_worker_niceness": "0",  # workers run at nice 15 otherwise
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_DEDUP_LOGS": "0",
    # Engines and Serve log every request at INFO; keep the console to progress and problems.
    "VLLM_LOGGING_LEVEL": "WARNING",
}


class LocalCluster:
    def __init__(self, cfg: ClusterConfig, *, cache_dir: Optional[Path] = None,
                 progress: Callable[[str], None] = print):
        self.cfg = cfg
        self.cache_dir = cache_dir or Path(".tandem/cache").resolve()
        self.progress = progress
        self._started_ray = False

    @property
    def url(self) -> str:
        return f"http://{self.cfg.gateway.host}:{self.cfg.gateway.port}"

    def start(self, ready_timeout_s: float = 600) -> "LocalCluster":
        import ray
        from ray import serve

        from cluster.app import APP_NAME, build_app

        t0 = time.monotonic()
        env = dict(LOCAL_RAY_ENV)
        env["VLLM_CACHE_ROOT"] = str(self.cache_dir / "vllm")
        os.environ.update(env)
        if not ray.is_initialized():
            self.progress(f"[tandem] starting Ray ({self.cfg.ray.address or 'local'})")
            ray.init(
                address=self.cfg.ray.address,
                num_cpus=self.cfg.ray.num_cpus if self.cfg.ray.address is None else None,
                include_dashboard=False,
                _metrics_export_port=self.cfg.ray.metrics_export_port if self.cfg.ray.address is None else None,
                runtime_env={"env_vars": env},
                logging_level="warning",
            )
            self._started_ray = True
        serve.start(
            # One gateway address: a proxy per node would collide on the port when several Ray
            # nodes share a machine (the two-node integration test), and k8s uses the chart.
            proxy_location="HeadOnly",
            http_options={"host": self.cfg.gateway.host, "port": self.cfg.gateway.port},
            logging_config={"log_level": "WARNING"},
        )
        pools = ", ".join(
            f"{tier}: {t.prefill.replicas} prefill + {t.decode.replicas} decode" for tier, t in self.cfg.tiers.items()
        )
        self.progress(f"[tandem] deploying {self.cfg.model.served_name}: gateway; {pools}")
        done = threading.Event()
        watcher = threading.Thread(target=self._report_progress, args=(done, t0), daemon=True)
        watcher.start()
        try:
            serve.run(build_app(self.cfg), name=APP_NAME, route_prefix="/")
            self._wait_ready(t0 + ready_timeout_s)
        finally:
            done.set()
        self.progress(f"[tandem] ready in {time.monotonic() - t0:.0f} s at {self.url}")
        if self._started_ray and self.cfg.ray.address is None:
            self.progress(f"[tandem] metrics for Prometheus: http://127.0.0.1:{self.cfg.ray.metrics_export_port}/metrics")
        return self

    def _report_progress(self, done: threading.Event, t0: float) -> None:
        from ray import serve

        last = ""
        while not done.wait(5):
            try:
                app = serve.status().applications.get("tandem")
                if app is None:
                    continue
                parts = [
                    f"{name} {status.status.value.lower()}"
                    + (f" ({sum(status.replica_states.values())} replicas)" if status.replica_states else "")
                    for name, status in app.deployments.items()
                ]
                line = ", ".join(parts)
            except Exception as exc:  # status is best-effort progress, never fatal
                line = f"status unavailable: {exc}"
            if line != last:
                self.progress(f"[tandem] {time.monotonic() - t0:5.0f} s  {line}")
                last = line

    def _wait_ready(self, deadline: float) -> None:
        last_error = ""
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=10) as resp:
                    if resp.status == 200:
                        return
            except urllib.error.HTTPError as exc:
                last_error = exc.read().decode(errors="replace")
            except OSError as exc:
                last_error = str(exc)
            time.sleep(1)
        raise TimeoutError(f"cluster not ready in time; last /health answer: {last_error}")

    def health(self) -> dict:
        with urllib.request.urlopen(self.url + "/health", timeout=10) as resp:
            return json.loads(resp.read())

    def stop(self) -> None:
        import ray
        from ray import serve

        self.progress("[tandem] shutting down (engines first, then Ray)")
        try:
            serve.shutdown()
        finally:
            if self._started_ray:
                ray.shutdown()
        self.progress("[tandem] stopped")
