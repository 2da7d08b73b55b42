"""For tests that watch a pool scale: closed-loop load (client threads, each sending one
request after the other until stopped, outcomes counted; True: answered as asked), a wait,
and a pool's running replicas as Serve reports them."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from typing import Callable

import httpx

# (client, the thread's own seeded rng) → whether the request succeeded
Send = Callable[[httpx.Client, random.Random], bool]


class ClosedLoop:
    def __init__(self, clients: int, send: Send, join_timeout_s: float = 180):
        self.outcomes: Counter = Counter()
        self._send = send
        self._join_timeout_s = join_timeout_s
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(clients)]

    def _run(self, seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client() as client:
            while not self._stop.is_set():
                ok = self._send(client, rng)
                with self._lock:
                    self.outcomes[ok] += 1

    def __enter__(self) -> "ClosedLoop":
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=self._join_timeout_s)


def wait_for(what: str, condition: Callable[[], object], timeout_s: float, every_s: float = 0.5):
    """condition()'s first truthy value, asked every `every_s`; AssertionError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def running_replicas(deployment: str, app: str = "tandem", state: str = "RUNNING") -> int:
    """Replicas of `deployment` in Serve's replica `state` (RUNNING, STOPPING, ...)."""
    from ray import serve

    status = serve.status().applications[app].deployments[deployment]
    return sum(n for s, n in status.replica_states.items() if getattr(s, "value", s) == state)
