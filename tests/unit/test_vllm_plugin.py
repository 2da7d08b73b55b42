"""The exit-with-parent watchdog that keeps vLLM children from outliving a killed replica."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import psutil

GRANDCHILD = (
    "import os, time; from cluster.vllm_plugin import watch_parent; watch_parent(); "
    "print(os.getpid(), flush=True); time.sleep(120)"
)
MIDDLE = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {GRANDCHILD!r}]); time.sleep(120)"


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_child_exits_when_its_parent_is_sigkilled():
    middle = subprocess.Popen([sys.executable, "-c", MIDDLE], stdout=subprocess.PIPE, text=True)
    try:
        grandchild = int(middle.stdout.readline())
        assert not _gone(grandchild)
        middle.send_signal(signal.SIGKILL)
        middle.wait()
        deadline = time.monotonic() + 30  # a bound, not a timing assertion: it polls every 1 s
        while not _gone(grandchild) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _gone(grandchild), "the orphaned child outlived its parent"
    finally:
        middle.kill()


def test_watchdog_starts_once_per_process(monkeypatch):
    from cluster import vllm_plugin

    started = []
    monkeypatch.setattr(vllm_plugin, "_watching", False)
    monkeypatch.setattr(vllm_plugin.threading, "Thread", lambda **kw: started.append(kw) or _NoThread())
    vllm_plugin.watch_parent()
    vllm_plugin.watch_parent()
    assert len(started) == 1 and started[0]["daemon"] is True


class _NoThread:
    def start(self) -> None:
        pass


def test_engine_children_run_niced_and_the_replica_process_keeps_its_priority(tmp_path):
    """vLLM's EngineCore/worker are multiprocessing children of the replica: only they are niced."""
    probe = ("import multiprocessing as mp, os\n"
             "def child(q):\n"
             "    from cluster.vllm_plugin import register; register(); q.put(os.getpriority(os.PRIO_PROCESS, 0))\n"
             "if __name__ == '__main__':\n"
             "    from cluster.vllm_plugin import register; register()\n"
             "    q = mp.get_context('spawn').Queue(); p = mp.get_context('spawn').Process(target=child, args=(q,))\n"
             "    p.start(); print(os.getpriority(os.PRIO_PROCESS, 0), q.get()); p.join()\n")
    import os
    from pathlib import Path

    script = tmp_path / "nice_probe.py"
    script.write_text(probe)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "TANDEM_ENGINE_NICE": "7", "PYTHONPATH": str(Path(__file__).parents[2])})
    assert out.returncode == 0, out.stderr
    replica, child = map(int, out.stdout.split())
    assert child == max(7, replica) and replica == os.getpriority(os.PRIO_PROCESS, 0)
