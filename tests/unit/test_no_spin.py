"""cluster/no_spin.py: vLLM's shm queue readers sleep in poll (capped) instead of spinning."""

from __future__ import annotations

import zmq


def test_readers_never_busy_loop_and_wait_in_capped_polls(monkeypatch):
    from vllm.distributed.device_communicators import shm_broadcast

    from cluster import no_spin

    no_spin.apply()
    no_spin.apply()  # idempotent
    ctx = zmq.Context()
    address = "inproc://tandem-no-spin-test"
    writer = shm_broadcast.SpinCondition(is_reader=False, context=ctx, notify_address=address)
    reader = shm_broadcast.SpinCondition(is_reader=True, context=ctx, notify_address=address)
    try:
        assert reader.busy_loop_s == 0
        polls = []
        original = reader.poller.poll
        monkeypatch.setattr(reader.poller, "poll", lambda timeout=None: polls.append(timeout) or original(timeout))
        reader.record_read()  # a read just now: vLLM would spin for a second here
        reader.wait(timeout_ms=None)
        reader.wait(timeout_ms=5000)
        assert polls == [no_spin.POLL_CAP_MS, no_spin.POLL_CAP_MS]
    finally:
        for sock in (writer.local_notify_socket, reader.local_notify_socket, reader.read_cancel_socket,
                     reader.write_cancel_socket):
            sock.close(linger=0)
        ctx.term()
