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
