"""Does a NIXL READ need its *target* to progress UCX, and what does NIXL's progress thread cost
the target while idle, per poll timeout (`pthrDelay`)? The question behind kv_transfer/cpu_patch.py:
the prefill engine is the target of every KV pull.

    python -m kv_transfer.bench.progress [--out kv_transfer/bench/results/progress_thread.json]

Per case, a target process registers a 12 MiB buffer (a 512-token prompt's KV for a 135M model
is about that) and then never calls NIXL again; it measures its own CPU while idle (3 s) and
while an initiator READs the buffer in 16 KiB blocks, six times (the first a warm-up), each
polled to DONE or given up after 5 s. Cases: no progress thread (what tandem ran until
2026-12-03), the thread with NIXL Python's own timeout 0, and with 1, 10 and 100 ms.
UCX as the cluster runs it on CPU hosts (tcp,self,sm over loopback).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import time
from pathlib import Path
from typing import Optional

from kv_transfer.bench.nixl_transfer import CPU_UCX_ENV, _buffer, _pattern
from kv_transfer.cpu_patch import agent_with_progress_delay

SIZE = 12 << 20
BLOCK = 16 << 10
IDLE_S = 3.0
GIVE_UP_S = 5.0
CASES: list[tuple[bool, Optional[int]]] = [(False, None), (True, 0), (True, 1_000), (True, 10_000), (True, 100_000)]
OUT = Path(__file__).resolve().parent / "results" / "progress_thread.json"


def _agent(name: str, thread: bool, delay_us: Optional[int]):
    os.environ.update({k: os.environ.get(k, v) for k, v in CPU_UCX_ENV.items()})
    import nixl._api as api

    if delay_us is not None:
        api.nixlBind.nixlAgent = agent_with_progress_delay(api.nixlBind.nixlAgent, delay_us)
    return api.nixl_agent(name, api.nixl_agent_config(enable_prog_thread=thread, backends=["UCX"]))


def _target(conn, thread: bool, delay_us: Optional[int]) -> None:
    agent = _agent("target", thread, delay_us)
    src = _buffer(SIZE, "cpu")
    src.copy_(_pattern(SIZE))
    agent.register_memory(src)
    conn.send((agent.get_agent_metadata(), src.data_ptr()))
    shares = []
    for _ in ("idle", "reads"):  # each window ends with a message from the parent
        cpu, wall = time.process_time(), time.monotonic()
        conn.recv()
        shares.append((time.process_time() - cpu) / (time.monotonic() - wall))
    conn.send(shares)
    conn.recv()


def _initiator(conn, meta: bytes, base: int) -> None:
    agent = _agent("initiator", False, None)  # it polls its own transfers, as vLLM's decode does
    dst = _buffer(SIZE, "cpu")
    agent.register_memory(dst)
    remote = agent.add_remote_agent(meta)
    n = SIZE // BLOCK
    local = agent.get_xfer_descs([(dst.data_ptr() + i * BLOCK, BLOCK, 0) for i in range(n)], "DRAM")
    far = agent.get_xfer_descs([(base + i * BLOCK, BLOCK, 0) for i in range(n)], "DRAM")
    handle = agent.initialize_xfer("READ", local, far, remote)
    seconds, state = [], "DONE"
    for _ in range(6):
        t0 = time.perf_counter()
        agent.transfer(handle)
        while (state := agent.check_xfer_state(handle)) not in ("DONE", "ERR") and time.perf_counter() - t0 < GIVE_UP_S:
            pass
        seconds.append(time.perf_counter() - t0)
        if state != "DONE":
            break  # stalled (or failed): a repost of an active transfer is refused
    conn.send((seconds, state))


def one_case(thread: bool, delay_us: Optional[int]) -> dict:
    ctx = mp.get_context("spawn")
    to_target, target_end = ctx.Pipe()
    to_initiator, initiator_end = ctx.Pipe()
    target = ctx.Process(target=_target, args=(target_end, thread, delay_us))
    target.start()
    meta, base = to_target.recv()
    time.sleep(IDLE_S)
    to_target.send("reads start")
    initiator = ctx.Process(target=_initiator, args=(initiator_end, meta, base))
    initiator.start()
    seconds, state = to_initiator.recv()
    initiator.join()
    to_target.send("reads done")
    idle, reads = to_target.recv()
    to_target.send("bye")
    target.join()
    timed = seconds[1:] or seconds
    return {"progress_thread": thread, "poll_timeout_us": delay_us, "completed": state == "DONE",
            "read_ms": [round(s * 1000, 1) for s in seconds], "median_read_ms": round(statistics.median(timed) * 1000, 1),
            "target_cores_idle": round(idle, 3), "target_cores_during_reads": round(reads, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    results = []
    for thread, delay_us in CASES:
        results.append(one_case(thread, delay_us))
        print(json.dumps(results[-1]), flush=True)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": {"cpu": cpu, "cores": os.cpu_count()}, "size_bytes": SIZE,
                                    "block_bytes": BLOCK, "ucx": CPU_UCX_ENV, "cases": results}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
