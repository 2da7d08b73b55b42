"""tandem's vLLM general plugin: runs in every vLLM process (the replica, its EngineCore
child and the model worker), loaded by vLLM through the entry point in pyproject.toml.

What it does, each only where the engine wrapper asked for it in the environment:
- TANDEM_EXIT_WITH_PARENT=1: a vLLM child exits when its parent dies. A replica killed with
  SIGKILL (a crash, the OOM killer, `ray.kill`) cannot shut its engine down, and vLLM's
  EngineCore and worker would otherwise live on as orphans, holding memory and the NIXL port.
- TANDEM_NIXL_CPU_PATCH=1: the NIXL CPU-host patch (kv_transfer/cpu_patch.py).
- TANDEM_NO_SPIN=1: shared-memory queue readers wait instead of spinning (cluster/no_spin.py).
- TANDEM_LORA_CPU_PATCH=1: vLLM's CPU LoRA ops give a base-model token no adapter's delta
  (cluster/lora_cpu_patch.py).
- VLLM_CONFIGURE_LOGGING=0: vLLM's console handler, without the dictConfig that would close
  Serve's replica log file (cluster/vllm_logging.py).
- TANDEM_ENGINE_NICE=N: vLLM's EngineCore and worker processes run at niceness N (at least),
  so the gateway and Serve's proxy on the same cores get the CPU when they have work. The
  replica process itself, which relays every token, keeps its priority.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time

EXIT_WITH_PARENT = "TANDEM_EXIT_WITH_PARENT"
ENGINE_NICE = "TANDEM_ENGINE_NICE"
POLL_S = 1.0
GRACE_S = 10.0


def register() -> None:
    from cluster.vllm_logging import configure_vllm_logger

    configure_vllm_logger()
    if os.environ.get(EXIT_WITH_PARENT) == "1":
        watch_parent()
    if os.environ.get(ENGINE_NICE) and multiprocessing.parent_process() is not None:
        lower_priority(int(os.environ[ENGINE_NICE]))
    from cluster import lora_cpu_patch, no_spin
    from kv_transfer import cpu_patch

    # Each patch acts only where the engine wrapper set its flag (never with a GPU).
    for patch in (cpu_patch, no_spin, lora_cpu_patch):
        if os.environ.get(patch.ENV_FLAG) == "1":
            patch.apply()


def lower_priority(niceness: int) -> None:
    """At least `niceness` for this process (inherited by its children); never raises it back."""
    current = os.getpriority(os.PRIO_PROCESS, 0)
    if niceness > current:
        os.setpriority(os.PRIO_PROCESS, 0, niceness)


_watching = False


def watch_parent() -> None:
    """Start (once per process) a daemon thread that ends this process when its parent dies:
    SIGTERM first so vLLM shuts down cleanly and frees its shared memory, SIGKILL if it hangs."""
    global _watching
    if _watching:
        return
    _watching = True
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(POLL_S)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(GRACE_S)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="tandem-exit-with-parent", daemon=True).start()
