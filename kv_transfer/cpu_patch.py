"""A tiny, opt-in patch of vLLM 0.32's NIXL connector for CPU-only hosts.

Two behaviours of vLLM's NIXL CPU path hurt badly on small hosts (measured on 2 cores: idle
CPU ~92% → 0%, TTFT -35..50%, transfers unchanged):

1. NIXL's progress thread polls UCX with a zero timeout and burns a whole core per engine,
   even when idle. Without it, transfers progress when vLLM polls their status each step.
2. The NIXL worker pins the thread that runs the forward pass to the last core of each NUMA
   node, ignoring VLLM_CPU_OMP_THREADS_BIND, so a prefill engine computes on decode's core.
   We restore the affinity the thread had before the connector was built.

It is loaded through tandem's vLLM general plugin (cluster/vllm_plugin.py), so it runs in
every vLLM process, including the EngineCore child. It acts only where the engine wrapper set
TANDEM_NIXL_CPU_PATCH=1, which it never does with a GPU.
"""

from __future__ import annotations

import functools
import logging
import os

# Under "vllm." so the message goes through vLLM's own log handler in its child processes.
log = logging.getLogger("vllm.tandem_nixl_cpu_patch")
ENV_FLAG = "TANDEM_NIXL_CPU_PATCH"
_applied = False


def apply() -> None:
    global _applied
    if _applied:
        return
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import base_worker

    original_config = base_worker.nixl_agent_config
    if original_config is not None:
        base_worker.nixl_agent_config = functools.partial(original_config, enable_prog_thread=False)

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
    log.info("tandem: NIXL CPU patch applied (no progress thread, OMP core binding kept)")
