"""The systems benchmarks start as child processes: plain vLLM OpenAI api_servers for
side-by-side baselines, and tandem itself as a user starts it (`tandem run`).

Each server is pinned like a tandem engine: on CPU its OpenMP threads are bound to the
given cores (VLLM_CPU_OMP_THREADS_BIND, with the EngineCore in its own process, which is
when vLLM applies the binding); on a GPU machine the same string selects GPUs instead
(CUDA_VISIBLE_DEVICES) and the engine spans them with tensor parallelism.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

import httpx

if TYPE_CHECKING:
    from cluster.config import ClusterConfig

ROOT = Path(__file__).resolve().parents[2]
READY = re.compile(r"\[tandem\] ready in (\d+(?:\.\d+)?) s")


def wait_healthy(url: str, proc: subprocess.Popen, deadline: float, why: Callable[[], str]) -> None:
    """Poll `url`/health until it answers 200 (a vLLM api_server is ready); raise, with
    `why()` (where to look), if the process exits first or `deadline` (monotonic) passes."""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM api_server at {url} exited with {proc.returncode}; {why()}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise TimeoutError(f"vLLM api_server at {url} not healthy in time; {why()}")


@dataclass(frozen=True)
class DirectEngineSpec:
    model_path: Path
    served_name: str
    dtype: str
    max_model_len: int
    kv_cache_memory_bytes: int
    port: int
    devices: str  # CPU cores ("0", "0-1") or, with on_gpu, GPU ids ("0", "0,1")
    on_gpu: bool = False
    max_num_seqs: Optional[int] = None
    max_num_batched_tokens: Optional[int] = None
    # model.lora_adapters, served as `--enable-lora --lora-modules` (name, path) with its limits.
    lora_modules: tuple[tuple[str, str], ...] = ()
    max_loras: int = 1
    max_lora_rank: int = 16

    @classmethod
    def like_tandem(cls, cfg: "ClusterConfig", port: int) -> "DirectEngineSpec":
        """One plain vLLM server shaped as the default tier's prefill engine: the same model,
        dtype (decided for this host as tandem decides it), KV bytes and batch limits, on the
        prefill engine's cores (or GPU 0 for a GPU config)."""
        from cluster.hardware import cpu_flags, engine_dtype

        tier = cfg.tiers[cfg.default_tier]
        gpu = tier.prefill.num_gpus > 0
        return cls(model_path=cfg.model.path, served_name=cfg.model.served_name,
                   dtype=engine_dtype(cfg.model.dtype, gpu, cpu_flags()), max_model_len=cfg.model.max_model_len,
                   kv_cache_memory_bytes=tier.prefill.engine.kv_cache_memory_bytes, port=port, on_gpu=gpu,
                   devices="0" if gpu else (tier.prefill.cpu_binding or ("0",))[0],
                   max_num_seqs=tier.prefill.engine.max_num_seqs,
                   max_num_batched_tokens=tier.prefill.engine.max_num_batched_tokens,
                   lora_modules=tuple(cfg.model.lora_adapters.items()), max_loras=cfg.model.max_loras,
                   max_lora_rank=cfg.model.max_lora_rank)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model_path),
               "--served-model-name", self.served_name, "--dtype", self.dtype,
               "--max-model-len", str(self.max_model_len), "--kv-cache-memory-bytes", str(self.kv_cache_memory_bytes),
               "--host", "127.0.0.1", "--port", str(self.port), "--enforce-eager"]
        if self.max_num_seqs is not None:
            cmd += ["--max-num-seqs", str(self.max_num_seqs)]
        if self.max_num_batched_tokens is not None:
            cmd += ["--max-num-batched-tokens", str(self.max_num_batched_tokens)]
        if self.on_gpu and "," in self.devices:
            cmd += ["--tensor-parallel-size", str(len(self.devices.split(",")))]
        if self.lora_modules:
            cmd += ["--enable-lora", "--max-loras", str(self.max_loras), "--max-lora-rank", str(self.max_lora_rank),
                    "--lora-modules", *(f"{name}={path}" for name, path in self.lora_modules)]
        return cmd

    def environment(self) -> dict[str, str]:
        env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="1", VLLM_LOGGING_LEVEL="WARNING")
        if self.on_gpu:
            env["CUDA_VISIBLE_DEVICES"] = self.devices
        else:
            env["VLLM_CPU_OMP_THREADS_BIND"] = self.devices
            if self.lora_modules:  # as tandem's CPU engines: vLLM's CPU LoRA ops fixed (cluster/lora_cpu_patch.py)
                env["TANDEM_LORA_CPU_PATCH"] = "1"
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
                wait_healthy(spec.url, proc, t0 + self.ready_timeout_s,
                             lambda: f"run `{' '.join(spec.command())}` by hand to see why")
        except BaseException:
            self.stop()
            raise
        self.cold_start_s = time.monotonic() - t0
        self.progress(f"[bench] {len(self.specs)} vLLM api_server(s) ready in {self.cold_start_s:.0f} s")
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

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


class TandemRun:
    """`tandem run --config FILE` as a child process: started, awaited until its ready line,
    stopped with SIGINT (its own clean shutdown), killed with its process group if that hangs."""

    def __init__(self, config: Path, log_path: Path, progress: Callable[[str], None], ready_timeout_s: float = 600):
        self.config, self.log_path, self.progress, self.ready_timeout_s = config, log_path, progress, ready_timeout_s
        self.proc: Optional[subprocess.Popen] = None
        self.ready = threading.Event()
        self.ready_line_s: Optional[float] = None
        self.spawn_to_ready_s: Optional[float] = None

    def __enter__(self) -> "TandemRun":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        self.progress(f"[stream] starting `tandem run --config {self.config}` (log: {self.log_path})")
        self.proc = subprocess.Popen([sys.executable, "-u", "-m", "cluster.cli", "run", "--config", str(self.config)],
                                     cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=dict(os.environ, PYTHONUNBUFFERED="1"), start_new_session=True)
        threading.Thread(target=self._pump, args=(t0,), daemon=True).start()
        try:
            deadline = t0 + self.ready_timeout_s
            while not self.ready.wait(1):
                if self.proc.poll() is not None:
                    raise RuntimeError(f"tandem run exited with {self.proc.returncode} before ready; see {self.log_path}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"tandem not ready in {self.ready_timeout_s:.0f} s; see {self.log_path}")
        except BaseException:
            self.stop()
            raise
        return self

    def _pump(self, t0: float) -> None:
        with open(self.log_path, "w") as out:
            for line in self.proc.stdout:
                out.write(line)
                out.flush()
                if line.startswith("[tandem]") and not self.ready.is_set():
                    self.progress("  " + line.rstrip())
                match = READY.search(line)
                if match and not self.ready.is_set():
                    self.spawn_to_ready_s = round(time.monotonic() - t0, 1)
                    self.ready_line_s = float(match.group(1))
                    self.ready.set()

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.progress("[stream] stopping tandem (SIGINT, as Ctrl-C)")
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.progress("[stream] tandem did not stop in 120 s: killing its process group")
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
