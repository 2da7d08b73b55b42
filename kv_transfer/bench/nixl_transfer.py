"""Raw NIXL block transfers between two processes: a target that registers a source buffer, and
an initiator that READs it block by block, the way a decode engine pulls a prefill's KV blocks.

Needs only torch and NIXL (no vLLM, no Ray). Call order, all inside `nixl_reads`:
1. spawn the target; it fills a source buffer with seeded random bytes, registers it with its
   NIXL agent and sends (agent metadata, base address) up its pipe;
2. spawn the initiator with that metadata; it registers its destination buffer, adds the
   target as a remote agent, and for each transfer size builds one READ request whose
   descriptors are `block_bytes` slices (one per KV block);
3. each READ is posted `repeats` times and polled to DONE (timed), after one untimed warm-up;
   the destination is zeroed first and compared with the source bytes afterwards;
4. the initiator sends its results up, the parent tells the target to deregister and exit.

Metadata travels over multiprocessing pipes; the bytes travel over UCX (loopback TCP and
shared memory on CPU hosts; on GPU hosts whatever UCX picks, e.g. cuda_ipc).
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import statistics
import time
from dataclasses import asdict, dataclass

MIB = 1 << 20
SEED = 1234
# Shared-memory-only UCX fails with NIXL_ERR_BACKEND on this machine (shared/DESIGN.md); tcp
# over loopback must be among the transports. On GPU hosts UCX is left to pick (cuda_ipc, ...).
CPU_UCX_ENV = {"UCX_TLS": "tcp,self,sm", "UCX_NET_DEVICES": "lo"}
POLL_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class TransferResult:
    """One transfer size at one block size, source and destination memory as given."""

    src_device: str
    dst_device: str
    size_bytes: int
    block_bytes: int
    descriptors: int
    seconds: list[float]  # one per timed repeat
    median_s: float
    gib_s: float  # size / median time
    verified: bool  # destination bytes equal the source after the transfers
    src_sha256: str | None = None  # only when digests were asked for (tests)
    dst_sha256: str | None = None


def ucx_env(src_device: str, dst_device: str) -> dict[str, str]:
    """The UCX settings the children run with; values already in the environment win."""
    if src_device == "cpu" and dst_device == "cpu":
        return {k: os.environ.get(k, v) for k, v in CPU_UCX_ENV.items()}
    return {k: os.environ[k] for k in ("UCX_TLS", "UCX_NET_DEVICES") if k in os.environ}


def _pattern(nbytes: int):
    """The source bytes: seeded random, so each block differs and the initiator can rebuild them."""
    import torch

    gen = torch.Generator().manual_seed(SEED)
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=gen)


def _buffer(nbytes: int, device: str):
    """A contiguous byte buffer in host memory ("cpu") or on a GPU ("cuda", "cuda:1", ...)."""
    import torch

    if device == "cpu":
        return torch.empty(nbytes, dtype=torch.uint8)
    return torch.empty(nbytes, dtype=torch.uint8, device=device)


def _agent(name: str, env: dict[str, str], progress_thread: bool):
    os.environ.update(env)  # before NIXL creates its UCX backend
    from nixl._api import nixl_agent, nixl_agent_config

    return nixl_agent(name, nixl_agent_config(enable_prog_thread=progress_thread, backends=["UCX"]))


def _digest(tensor) -> str:
    return hashlib.sha256(tensor.cpu().numpy().tobytes()).hexdigest()


def _target(conn, nbytes: int, device: str, env: dict[str, str], digest_sizes: list[int]) -> None:
    """Holds the source buffer until the parent says done. Its progress thread serves the READs
    (UCX over TCP needs the remote side to progress)."""
    try:
        agent = _agent("bench-target", env, progress_thread=True)
        src = _buffer(nbytes, device)
        src.copy_(_pattern(nbytes))
        reg = agent.register_memory(src)
        digests = {n: _digest(src[:n]) for n in digest_sizes}
        dev_id = max(src.get_device(), 0)
        conn.send(("ready", agent.get_agent_metadata(), src.data_ptr(), dev_id, digests))
        conn.recv()  # "done"
        agent.deregister_memory(reg)
        conn.send(("bye",))
    except Exception as exc:  # the parent reports it; a child traceback alone is easy to miss
        conn.send(("error", f"target: {exc!r}"))


def _wait(agent, handle) -> None:
    deadline = time.monotonic() + POLL_TIMEOUT_S
    while True:
        state = agent.check_xfer_state(handle)
        if state == "DONE":
            return
        if state == "ERR":
            raise RuntimeError("NIXL transfer failed (check_xfer_state returned ERR)")
        if time.monotonic() > deadline:
            raise TimeoutError(f"NIXL transfer not done after {POLL_TIMEOUT_S} s")


def _sync(device: str) -> None:
    if device != "cpu":
        import torch

        torch.cuda.synchronize()


def _initiator(conn, meta: bytes, remote_base: int, remote_dev: int, src_device: str,
               dst_device: str, sizes: list[int], block_bytes: int, repeats: int,
               env: dict[str, str], digests: dict[int, str]) -> None:
    """READs every size from the target, timing each post-to-DONE."""
    try:
        import torch

        # No progress thread here: the timing loop polls check_xfer_state, which progresses UCX
        # itself; a second polling thread would only steal one of this host's cores.
        agent = _agent("bench-initiator", env, progress_thread=False)
        nbytes = max(sizes)
        dst = _buffer(nbytes, dst_device)
        reg = agent.register_memory(dst)
        remote = agent.add_remote_agent(meta)
        expected = _pattern(nbytes).to(dst.device)
        src_mem = "DRAM" if src_device == "cpu" else "VRAM"
        dst_mem = "DRAM" if dst_device == "cpu" else "VRAM"
        dst_dev = max(dst.get_device(), 0)
        results = []
        for size in sizes:
            n = size // block_bytes
            offsets = [i * block_bytes for i in range(n)]
            local = agent.get_xfer_descs([(dst.data_ptr() + o, block_bytes, dst_dev) for o in offsets], dst_mem)
            far = agent.get_xfer_descs([(remote_base + o, block_bytes, remote_dev) for o in offsets], src_mem)
            handle = agent.initialize_xfer("READ", local, far, remote)
            dst[:size].zero_()
            _sync(dst_device)
            seconds = []
            for rep in range(repeats + 1):  # the first post is a warm-up (connection, caches)
                t0 = time.perf_counter()
                if agent.transfer(handle) == "ERR":
                    raise RuntimeError("NIXL transfer could not be posted (transfer returned ERR)")
                _wait(agent, handle)
                _sync(dst_device)
                if rep:
                    seconds.append(time.perf_counter() - t0)
            agent.release_xfer_handle(handle)
            median = statistics.median(seconds)
            results.append(TransferResult(
                src_device=src_device, dst_device=dst_device, size_bytes=size,
                block_bytes=block_bytes, descriptors=n, seconds=seconds, median_s=median,
                gib_s=size / median / (1 << 30),
                verified=bool(torch.equal(dst[:size], expected[:size])),
                src_sha256=digests.get(size), dst_sha256=_digest(dst[:size]) if size in digests else None,
            ))
        agent.remove_remote_agent(remote)
        agent.deregister_memory(reg)
        conn.send(("results", [asdict(r) for r in results]))
    except Exception as exc:
        conn.send(("error", f"initiator: {exc!r}"))


def _recv(conn, proc, what: str):
    """The next message from a child, or a clear error if it died or reported one."""
    while not conn.poll(1.0):
        if not proc.is_alive():
            raise RuntimeError(f"the NIXL {what} process exited (code {proc.exitcode}) without answering")
    msg = conn.recv()
    if msg[0] == "error":
        raise RuntimeError(f"NIXL benchmark {msg[1]}")
    return msg


def nixl_reads(sizes: list[int], block_bytes: int, repeats: int = 5, src_device: str = "cpu",
               dst_device: str = "cpu", digests: bool = False) -> list[TransferResult]:
    """READ each size (bytes, multiples of block_bytes) from a target process into an initiator
    process with NIXL; returns one timed, verified result per size. `digests` also returns the
    sha256 of the source (computed by the target) and the destination (by the initiator)."""
    bad = [s for s in sizes if s % block_bytes or s < block_bytes]
    if bad:
        raise ValueError(f"sizes {bad} are not positive multiples of the block size {block_bytes}")
    env = ucx_env(src_device, dst_device)
    ctx = mp.get_context("spawn")  # fresh interpreters: no inherited UCX or CUDA state
    t_parent, t_child = ctx.Pipe()
    target = ctx.Process(target=_target, args=(t_child, max(sizes), src_device, env,
                                                list(sizes) if digests else []), daemon=True)
    target.start()
    initiator = None
    try:
        _, meta, base, dev_id, src_digests = _recv(t_parent, target, "target")
        i_parent, i_child = ctx.Pipe()
        initiator = ctx.Process(target=_initiator, daemon=True, args=(
            i_child, meta, base, dev_id, src_device, dst_device, list(sizes), block_bytes,
            repeats, env, src_digests))
        initiator.start()
        _, rows = _recv(i_parent, initiator, "initiator")
        t_parent.send("done")
        _recv(t_parent, target, "target")
        return [TransferResult(**r) for r in rows]
    finally:
        for proc in (initiator, target):
            if proc is not None:
                proc.join(timeout=10)
                if proc.is_alive():
                    proc.kill()
