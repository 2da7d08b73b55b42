"""The systems the control-plane benchmark loads, each a child process tree started afresh
and stopped after its sweep, and one cell of the sweep against a running system.

- tandem (and each variant): control_plane_serve.py in its own process group, with the
  variant's Ray environment; its log goes to the state folder.
- vllm: vLLM's OpenAI api_server on the same tiny model (loadtest/bench/engines.py), float32,
  its EngineCore pinned to core 0, KV cache sized for every stream's whole answer.

A cell runs control_plane_client.py as a child, giving it the system's processes (procs.py
finds and classifies them) to read their CPU at its window's edges.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from loadtest.bench import procs
from loadtest.bench.control_plane_config import MODEL_NAME
from loadtest.bench.control_plane_serve import READY
from loadtest.bench.control_plane_stats import TANDEM_KINDS, VLLM_KINDS, bench_kind, cell_figures, cpu_by_kind
from loadtest.bench.engines import ROOT, DirectEngines, DirectEngineSpec

Progress = Callable[[str], None]


@dataclass
class Running:
    """A system under load: where it answers, the root of its process tree, its kinds."""

    name: str
    url: str
    root_pid: int
    kinds: tuple[str, ...]
    pace_s: Optional[float]  # FakeEngine's token gap; None: a real engine's own
    facts: dict = field(default_factory=dict)  # what the JSON records of how it ran


RAY_SLOW_START = "timed out during startup"  # ray.init's error when the raylet gave up


class TandemGraph:
    """`with TandemGraph(...) as running:` control_plane_serve.py started until READY, then
    stopped (SIGTERM: Ray down; its process group killed if that hangs). A start that failed
    only because Ray's node was slow to come up is tried again, in a fresh process."""

    START_ATTEMPTS = 3

    def __init__(self, name: str, cfg: dict, ray_env: dict[str, str], pace_s: float, state_dir: Path,
                 progress: Progress, ready_timeout_s: float = 300):
        self.name, self.cfg, self.ray_env, self.pace_s = name, cfg, ray_env, pace_s
        self.state_dir, self.progress, self.ready_timeout_s = state_dir, progress, ready_timeout_s
        self.proc: Optional[subprocess.Popen] = None
        self.ready = threading.Event()
        self.ready_line = ""

    def __enter__(self) -> Running:
        slug = self.name.replace("@", "-")
        cfg_path = self.state_dir / f"{slug}.config.json"
        cfg_path.write_text(json.dumps(self.cfg, indent=1))
        log_path = self.state_dir / f"{slug}.log"
        t0 = time.monotonic()
        for attempt in range(1, self.START_ATTEMPTS + 1):
            try:
                self._start(cfg_path, log_path)
                break
            except RuntimeError:
                slow_raylet = RAY_SLOW_START in log_path.read_text(errors="replace")
                if not slow_raylet or attempt == self.START_ATTEMPTS:
                    raise
                self.progress(f"[control_plane] {self.name}: Ray's node did not start in time (its dashboard "
                              f"agent was slower than the raylet's fixed 15 s, ray-project/ray#65983); "
                              f"again ({attempt + 1}/{self.START_ATTEMPTS})")
        url = self.ready_line.split()[2]
        facts = {"kind": "tandem", "pace_ms": self.pace_s * 1000, "ray_env": self.ray_env, "config": self.cfg,
                 "spawn_to_ready_s": round(time.monotonic() - t0, 1), "log": str(log_path)}
        return Running(self.name, url, self.proc.pid, TANDEM_KINDS, self.pace_s, facts)

    def _start(self, cfg_path: Path, log_path: Path) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("RAY_ADDRESS", None)  # a new local Ray, never one found in the environment
        cmd = [sys.executable, "-m", "loadtest.bench.control_plane_serve", "--config-json", str(cfg_path),
               "--pace-s", str(self.pace_s), "--state-dir", str(self.state_dir),
               "--ready-timeout-s", str(self.ready_timeout_s),
               *(f"--ray-env={k}={v}" for k, v in self.ray_env.items())]
        self.progress(f"[control_plane] {self.name}: starting Ray + Serve + the graph (log: {log_path})")
        t0 = time.monotonic()
        self.ready.clear()
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True)
        pump = threading.Thread(target=self._pump, args=(log_path,), daemon=True)
        pump.start()
        try:
            while not self.ready.wait(1):
                if self.proc.poll() is not None:
                    pump.join(10)  # the log complete before the caller reads it
                    raise RuntimeError(f"{self.name}: the graph's process exited with {self.proc.returncode} "
                                       f"before READY; see {log_path}")
                if time.monotonic() - t0 > self.ready_timeout_s + 30:
                    raise TimeoutError(f"{self.name}: not ready in {self.ready_timeout_s:.0f} s; see {log_path}")
        except BaseException:
            self.stop()
            raise

    def _pump(self, log_path: Path) -> None:
        with open(log_path, "w") as out:
            for line in self.proc.stdout:
                out.write(line)
                out.flush()
                if line.startswith(READY):
                    self.ready_line = line.strip()
                    self.progress(f"  {line.rstrip()}")
                    self.ready.set()
                elif line.startswith("[tandem]") and not self.ready.is_set():
                    self.progress(f"  {line.rstrip()}")

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.progress(f"[control_plane] {self.name}: stopping")
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.progress(f"[control_plane] {self.name}: not stopped in 60 s; killing its process group")
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def kv_cache_bytes(model_dir: Path, seqs: int, tokens_per_seq: int, block_size: int = 16) -> int:
    """KV bytes for `seqs` sequences of `tokens_per_seq` tokens each (whole blocks), float32:
    K and V of every layer, for every KV head. 16 MiB at least (tandem's floor)."""
    c = json.loads((model_dir / "config.json").read_text())
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    per_token = 2 * c["num_hidden_layers"] * c.get("num_key_value_heads", c["num_attention_heads"]) * head_dim * 4
    blocks = seqs * -(-tokens_per_seq // block_size)
    return max(16 << 20, int(blocks * block_size * per_token * 1.1))


class VllmServer:
    """`with VllmServer(...) as running:` one direct api_server (engines.py) on core 0."""

    def __init__(self, model_dir: Path, max_model_len: int, max_streams: int, tokens_per_seq: int,
                 port: int, progress: Progress):
        self.spec = DirectEngineSpec(
            model_path=model_dir, served_name=MODEL_NAME, dtype="float32", max_model_len=max_model_len,
            kv_cache_memory_bytes=kv_cache_bytes(model_dir, max_streams, tokens_per_seq), port=port, devices="0",
            max_num_seqs=max_streams, max_num_batched_tokens=max(max_model_len, max_streams))
        self.engines = DirectEngines([self.spec], progress=progress)

    def __enter__(self) -> Running:
        self.engines.__enter__()
        spec = self.spec
        facts = {"kind": "vllm", "command": " ".join(spec.command()), "engine_cores": spec.devices,
                 "kv_cache_bytes": spec.kv_cache_memory_bytes, "max_num_seqs": spec.max_num_seqs,
                 "spawn_to_ready_s": round(self.engines.cold_start_s, 1)}
        return Running("vllm", spec.url, self.engines.procs[0].pid, VLLM_KINDS, None, facts)

    def __exit__(self, *exc) -> None:
        self.engines.stop()


@dataclass(frozen=True)
class CellSpec:
    streams: int
    warmup_s: float
    duration_s: float
    max_tokens: int
    request_timeout_s: float = 600


def process_counts(running: Running, reaper: procs.Reaper) -> dict[str, int]:
    """How many processes of each kind the system has (and noted for the reaper)."""
    table = procs.snapshot()
    pids = procs.descendants(running.root_pid, table)
    reaper.note(table, pids)
    counts: dict[str, int] = {}
    for pid in pids:
        kind = bench_kind(*procs.label(pid, table))
        counts[kind] = counts.get(kind, 0) + 1
    return counts


def run_cell(running: Running, cell: CellSpec, reaper: procs.Reaper, progress: Progress) -> dict:
    """One cell: the client as a child process, watching the CPU of the system's processes
    (listed now); a process born during the cell (none expected) counts with all its CPU."""
    before = procs.snapshot()
    pids = procs.descendants(running.root_pid, before)
    reaper.note(before, pids)
    kind_of = {pid: bench_kind(*procs.label(pid, before)) for pid in pids}
    cmd = [sys.executable, "-m", "loadtest.bench.control_plane_client", "--url", running.url, "--model", MODEL_NAME,
           "--streams", str(cell.streams), "--warmup-s", str(cell.warmup_s), "--duration-s", str(cell.duration_s),
           "--max-tokens", str(cell.max_tokens), "--request-timeout-s", str(cell.request_timeout_s),
           "--cpu-pids", ",".join(str(p) for p in sorted(pids))]
    client = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    label = f"[control_plane] {running.name} {cell.streams:4d} streams:"
    result = None
    # A client that does not end (a bug, a wedged machine) must not hold the run forever.
    budget_s = cell.warmup_s + cell.duration_s + 120
    watchdog = threading.Timer(budget_s, client.kill)
    watchdog.daemon = True
    watchdog.start()
    try:
        for line in client.stdout:
            line = line.rstrip("\n")
            if line == "WINDOW start":
                progress(f"{label} measuring {cell.duration_s:g} s")
            elif line.startswith("PROGRESS "):
                progress(f"{label} {line[9:]}")
            elif line.startswith("RESULT "):
                result = json.loads(line[7:])
        client.wait(60)
    finally:
        watchdog.cancel()
        if client.poll() is None:
            client.kill()
            client.wait(10)
    if client.returncode != 0 or result is None:
        raise RuntimeError(f"{label} the load client failed (exit {client.returncode}; killed if it ran past "
                           f"{budget_s:.0f} s); its stderr is above")
    cpu_s = {int(pid): s for pid, s in result["cpu_s_by_pid"].items()}
    after = procs.snapshot()
    born = procs.descendants(running.root_pid, after) - pids
    reaper.note(after, born)
    for pid in born:
        cpu_s[pid] = after[pid].cpu_s
        kind_of[pid] = bench_kind(*procs.label(pid, after))
    figures = cell_figures(cell.streams, running.pace_s, result, cpu_by_kind(cpu_s, kind_of), running.kinds)
    return {**figures, "processes_born_during_cell": len(born)}
