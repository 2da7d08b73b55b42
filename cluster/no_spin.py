"""A one-line change to vLLM 0.32's shared-memory queues on CPU hosts: readers wait on the
queue's notification socket instead of spinning.

vLLM's EngineCore and its model worker talk through shared-memory ring buffers
(vllm/distributed/device_communicators/shm_broadcast.py). A reader that read within the last
second (`SpinCondition.busy_loop_s`, 1 s, not configurable) spins on `sched_yield()` instead
of sleeping on the writer's zmq notification. On a GPU host that saves microseconds per
step. On a small CPU host it burns the cores the engines compute on: while a stream runs,
the EngineCore spins through every forward pass of its worker and the worker spins between
steps, and the gateway and Serve's proxy, which share those cores, are starved into bursts.
A CPU forward step takes tens of milliseconds; a zmq wake-up costs tens of microseconds.

The reader sleeps in the poll of that socket instead, for at most POLL_CAP_MS at a time: the
writer pings on every write, but its PUB socket's high-water mark of 1 drops pings under
load (measured: with an uncapped poll a stream stalled 5 s, the read timeout, at p99), so
a capped sleep bounds the cost of a lost ping to a millisecond.

Loaded through tandem's vLLM general plugin (cluster/vllm_plugin.py) in every vLLM process;
acts only where the engine wrapper set TANDEM_NO_SPIN=1, which it does on CPU hosts only.
"""

from __future__ import annotations

import functools
import inspect
import logging

log = logging.getLogger("vllm.tandem_no_spin")
ENV_FLAG = "TANDEM_NO_SPIN"
POLL_CAP_MS = 1
WRITTEN_FOR = "vLLM 0.32.0"
_applied = False


def check(shm_broadcast) -> None:
    """Raise, naming this patch and the version it was written for, when vLLM's SpinCondition
    no longer has what the wrappers below call: a wrapper of a changed signature would fail
    later, inside vLLM's queues, with a message that names neither (UPSTREAM.md)."""
    condition = getattr(shm_broadcast, "SpinCondition", None)
    if condition is None:
        problems = ["shm_broadcast.SpinCondition is gone"]
    else:
        init = list(inspect.signature(condition.__init__).parameters)
        wait = list(inspect.signature(condition.wait).parameters)
        problems = []
        if init[:5] != ["self", "is_reader", "context", "notify_address", "busy_loop_s"]:
            problems.append(f"SpinCondition.__init__ takes {init}")
        if wait[:2] != ["self", "timeout_ms"]:
            problems.append(f"SpinCondition.wait takes {wait}")
    if problems:
        import vllm

        raise RuntimeError(f"tandem's no-spin patch (cluster/no_spin.py) was written for {WRITTEN_FOR} and does "
                           f"not apply to vLLM {vllm.__version__}: {'; '.join(problems)}. Update cluster/no_spin.py "
                           "(or run without it: the engine wrapper sets TANDEM_NO_SPIN on CPU hosts).")


def apply() -> None:
    global _applied
    if _applied:
        return
    from vllm.distributed.device_communicators import shm_broadcast

    check(shm_broadcast)
    original_init = shm_broadcast.SpinCondition.__init__
    original_wait = shm_broadcast.SpinCondition.wait

    @functools.wraps(original_init)
    def init_without_busy_loop(self, is_reader, context, notify_address, busy_loop_s: float = 1):
        original_init(self, is_reader, context, notify_address, busy_loop_s=0)

    @functools.wraps(original_wait)
    def wait_briefly(self, timeout_ms=None):
        # Sleep in poll(), but wake within POLL_CAP_MS even if a ping was dropped (the
        # writer's PUB socket has a high-water mark of 1, so pings can be lost).
        cap = POLL_CAP_MS if timeout_ms is None else min(timeout_ms, POLL_CAP_MS)
        original_wait(self, timeout_ms=cap)

    shm_broadcast.SpinCondition.__init__ = init_without_busy_loop
    shm_broadcast.SpinCondition.wait = wait_briefly
    _applied = True
    log.info("tandem: shared-memory queue readers wait instead of spinning")
