"""A tiny, opt-in patch of vLLM 0.32's NIXL connector for CPU-only hosts.

Two behaviours of vLLM's NIXL CPU path hurt badly on small hosts (measured on 2 cores: idle
CPU ~92% → 0%, TTFT -35..50%, transfers unchanged):

1. NIXL's progress thread polls UCX with a zero timeout and burns a whole core per engine,
   even when idle: NIXL's Python API hard-codes the thread's poll timeout (`pthrDelay`) to 0.
   We give it kv_transfer.nixl_progress_poll_ms (10 ms) instead, so the thread sleeps in
   poll() on the UCX workers' event fds and wakes when UCX has work. The thread must stay:
   over UCX's TCP transport a READ completes only while the *target* progresses
   (`python -m kv_transfer.bench.progress`, bench/results/progress_thread.json: a 12 MiB READ
   stalls > 5 s with no progress thread on the target, takes 4-6 ms with one, which idles at
   0.3-1% of a core with a 10-100 ms timeout and at 100% with 0). Without the thread (tandem
   until 2026-12-03) a prefill engine progressed its outgoing transfers only between its own steps,
   so under load a handoff waited out whole prefill steps (0.5-0.7 s on a 2-core EPYC).
2. The NIXL worker pins the thread that runs the forward pass to the last core of each NUMA
   node, ignoring VLLM_CPU_OMP_THREADS_BIND, so a prefill engine computes on decode's core.
   We restore the affinity the thread had before the connector was built.

It is loaded through tandem's vLLM general plugin (cluster/vllm_plugin.py), so it runs in
every vLLM process, including the EngineCore child. It acts only where the engine wrapper set
TANDEM_NIXL_CPU_PATCH=1, which it never does with a GPU.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import os

# Under "vllm." so the message goes through vLLM's own log handler in its child processes.
log = logging.getLogger("vllm.tandem_nixl_cpu_patch")
ENV_FLAG = "TANDEM_NIXL_CPU_PATCH"
# The progress thread's poll() timeout in µs, or "off" (no thread), from the config's
# kv_transfer.nixl_progress_poll_ms (kv_transfer/nixl.py sets it for the engine's processes).
# A bound on a lost wake-up (NIXL's own comment: UCX's event fd may miss some events), not a
# delay on work, which wakes the thread at once.
PROGRESS_POLL_ENV = "TANDEM_NIXL_PROGRESS_POLL_US"
WRITTEN_FOR = "vLLM 0.32.0 with NIXL 1.5.1"
_applied = False


def check(base_worker) -> None:
    """Raise, naming this patch and the versions it was written for, when vLLM's NIXL worker or
    NIXL's bindings no longer have what apply() replaces: the patch must not half-apply, and a
    missing name would otherwise fail as a bare AttributeError inside the EngineCore."""
    problems = [f"base_worker.{name} is gone" for name in ("nixl_agent_config", "NixlWrapper", "NixlBaseConnectorWorker")
                if not hasattr(base_worker, name)]
    if not problems and base_worker.nixl_agent_config is not None:  # None: vLLM found no NIXL
        if "enable_prog_thread" not in inspect.signature(base_worker.nixl_agent_config).parameters:
            problems.append("nixl_agent_config takes no enable_prog_thread")
        bindings = getattr(importlib.import_module(base_worker.NixlWrapper.__module__), "nixlBind", None)
        if bindings is None or not hasattr(bindings, "nixlAgent"):
            problems.append("NIXL's _api module has no nixlBind.nixlAgent")
        elif not hasattr(bindings.nixlAgentConfig(), "pthrDelay"):
            problems.append("NIXL's nixlAgentConfig has no pthrDelay")
    if problems:
        import vllm

        raise RuntimeError(f"tandem's NIXL CPU patch (kv_transfer/cpu_patch.py) was written for {WRITTEN_FOR} and "
                           f"does not apply to vLLM {vllm.__version__}: {'; '.join(problems)}. Update "
                           "kv_transfer/cpu_patch.py (or set kv_transfer.cpu_patch: false).")


def apply() -> None:
    global _applied
    if _applied:
        return
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import base_worker

    poll = os.environ.get(PROGRESS_POLL_ENV)
    if poll is None:
        raise RuntimeError(f"{ENV_FLAG}=1 needs {PROGRESS_POLL_ENV} (microseconds or 'off'): "
                           "kv_transfer/nixl.py nixl_env sets both from the config")
    check(base_worker)
    if base_worker.nixl_agent_config is not None:  # None: vLLM found no NIXL
        if poll == "off":
            base_worker.nixl_agent_config = functools.partial(base_worker.nixl_agent_config, enable_prog_thread=False)
        else:
            bindings = importlib.import_module(base_worker.NixlWrapper.__module__).nixlBind
            bindings.nixlAgent = agent_with_progress_delay(bindings.nixlAgent, int(poll))

    worker_cls = base_worker.NixlBaseConnectorWorker
    original_init = worker_cls.__init__

    @functools.wraps(original_init)
    def init_keeping_affinity(self, *args, **kwargs):
        cores = os.sched_getaffinity(0)
        try:
            original_init(self, *args, **kwargs)
        finally:
            os.sched_setaffinity(0, cores)

    worker_cls.__init__ = init_keeping_affinity
    _applied = True
    log.info("tandem: NIXL CPU patch applied (progress thread poll timeout: %s us, OMP core binding kept)", poll)


def agent_with_progress_delay(make_agent, delay_us: int):
    """NIXL's agent constructor (nixlBind.nixlAgent, which nixl_agent calls with the config it
    built), with the progress thread's poll timeout set first."""

    @functools.wraps(make_agent)
    def make(name, config):
        config.pthrDelay = delay_us
        return make_agent(name, config)

    return make
