"""Plain vLLM OpenAI api_servers for side-by-side baselines, started as child processes.

Each server is pinned like a tandem engine: on CPU its OpenMP threads are bound to the
given cores (VLLM_CPU_OMP_THREADS_BIND, with the EngineCore in its own process, which is
when vLLM applies the binding); on a GPU machine the same string selects GPUs instead
(CUDA_VISIBLE_DEVICES) and the engine spans them with tensor parallelism.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import httpx


@dataclass(frozen=True)
class DirectEngineSpec:
    model_path: Path
    served_name: str
    dtype: str
    max_model_len: int
    kv_cache_bytes: int
    port: int
    devices: str  # CPU cores ("0", "0-1") or, with on_gpu, GPU ids ("0", "0,1")
    on_gpu: bool = False
    max_num_seqs: Optional[int] = None
    max_num_batched_tokens: Optional[int] = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model_path),
               "--served-model-name", self.served_name, "--dtype", self.dtype,
               "--max-model-len", str(self.max_model_len), "--kv-cache-memory-bytes", str(self.kv_cache_bytes),
               "--host", "127.0.0.1", "--port", str(self.port), "--enforce-eager"]
        if self.max_num_seqs is not None:
            cmd += ["--max-num-seqs", str(self.max_num_seqs)]
        if self.max_num_batched_tokens is not None:
            cmd += ["--max-num-batched-tokens", str(self.max_num_batched_tokens)]
        if self.on_gpu and "," in self.devices:
            cmd += ["--tensor-parallel-size", str(len(self.devices.split(",")))]
        return cmd

    def environment(self) -> dict[str, str]:
        env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="1", VLLM_LOGGING_LEVEL="WARNING")
        if self.on_gpu:
            env["CUDA_VISIBLE_DEVICES"] = self.devices
        else:
            env["VLLM_CPU_OMP_THREADS_BIND"] = self.devices
        return env


class DirectEngines:
    """Start several api_servers at once and stop them all: `with DirectEngines(specs) as e:`."""

    def __init__(self, specs: list[DirectEngineSpec], progress: Callable[[str], None] = print,
                 ready_timeout_s: float = 600):
        self.specs = specs
        self.progress = progress
        self.ready_timeout_s = ready_timeout_s
        self.procs: list[subprocess.Popen] = []
        self.cold_start_s: Optional[float] = None

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.specs]

    def __enter__(self) -> "DirectEngines":
        t0 = time.monotonic()
        for spec in self.specs:
            self.progress(f"[bench] starting vLLM api_server on {'GPU' if spec.on_gpu else 'cores'} "
                          f"{spec.devices}, port {spec.port}")
            self.procs.append(subprocess.Popen(spec.command(), env=spec.environment(),
                                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        try:
            for spec, proc in zip(self.specs, self.procs):
                self._wait_healthy(spec, proc, t0 + self.ready_timeout_s)
        except BaseException:
            self.stop()
            raise
        self.cold_start_s = time.monotonic() - t0
        self.progress(f"[bench] {len(self.specs)} vLLM api_server(s) ready in {self.cold_start_s:.0f} s")
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    @staticmethod
    def _wait_healthy(spec: DirectEngineSpec, proc: subprocess.Popen, deadline: float) -> None:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"vLLM api_server on port {spec.port} exited with {proc.returncode}; "
                                   f"run `{' '.join(spec.command())}` by hand to see why")
            try:
                if httpx.get(f"{spec.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise TimeoutError(f"vLLM api_server on port {spec.port} not healthy in time")

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        self.procs = []
