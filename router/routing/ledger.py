"""LoadLedger: this gateway's own load on each engine replica, kept request by request.

The engines report their queues about once a second, and Serve's broadcast of those reports
comes later still; the gateway knows its own requests at once. So the router counts, per
replica, the hops it has in flight there and the uncached prompt tokens it has sent there that
are not computed yet, and the decider reads the larger of that and the engine's report.

A request's entries, in the order KVRouter (service.py) makes them:
1. `expect(request_id, tokens)` at the decision: the uncached prompt tokens its hop will compute.
2. `start(request_id, worker, adapter)` as its hop is sent: one more in flight there, and the
   expected tokens count as queued there (timed, when nothing of this gateway's was queued
   ahead); its LoRA adapter counts as held there (the engine loads it for the hop).
3. `prompt_done(request_id, observe)` when the prompt is computed (a prefill hop returned, a
   streaming hop's first token) or the hop ended without it; once, later calls release nothing.
4. `end(worker, adapter)` as the hop ends.

After every request has ended, every map is empty (`leftovers()`), except the prompts done on a
prefill replica within the last `stale_s`: that replica's report may still count them.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Callable, Optional

from router.routing.types import Worker

# A replica's routing stats reach this gateway up to ~1 s (their period) plus Serve's
# broadcast late: a reported queue may still count prompts done since.
STALE_STATS_S = 3.0
MAX_PENDING = 10_000  # decisions whose hop has not started (cancelled ones age out)


@dataclass(frozen=True)
class _QueuedPrompt:
    worker: Worker
    tokens: int
    started: float
    timed: bool  # its time until done is a sample of the worker's prefill cost


@dataclass(frozen=True)
class PromptTimed:
    """A prompt computed on `worker` behind none of this gateway's prompts: one sample of its
    prefill cost (tokens in `seconds`)."""

    worker: Worker
    tokens: int
    seconds: float


class LoadLedger:
    def __init__(self, *, clock: Callable[[], float], timer: Callable[[], float],
                 stale_s: float = STALE_STATS_S, max_pending: int = MAX_PENDING):
        self._clock = clock  # for the window of prompts done
        self._timer = timer  # for a prompt's time until done
        self._stale_s = stale_s
        self._max_pending = max_pending
        self._in_flight: dict[str, int] = {}  # replica_id → this gateway's hops on it
        self._queued_tokens: dict[str, int] = {}  # replica_id → this gateway's uncached prompt tokens on it
        self._pending: dict[str, int] = {}  # request_id → uncached prompt tokens, until its hop starts
        self._prompts: dict[str, _QueuedPrompt] = {}  # request_id → its prompt queued on a replica, until done
        self._done: dict[str, collections.deque] = {}  # replica_id → (when, tokens) of its prompts done lately
        # replica_id → adapter name → this gateway's hops with it there: the engine holds those
        # adapters now, whatever its last report (a second old) says.
        self._adapters: dict[str, dict[str, int]] = {}
        # request_id → the decode replica picked for it, counted in flight from the pick: its hop
        # starts only after the prompt's prefill (seconds in a burst), and requests routed
        # meanwhile would all see that replica idle and pile onto it.
        self._booked: dict[str, str] = {}

    # -- what the decider reads ----------------------------------------------------------------

    def in_flight(self, replica_id: str) -> int:
        return self._in_flight.get(replica_id, 0)

    def queued_tokens(self, replica_id: str) -> int:
        return self._queued_tokens.get(replica_id, 0)

    def adapters(self, replica_id: str) -> frozenset[str]:
        """The LoRA adapters of this gateway's hops now on the replica."""
        return frozenset(self._adapters.get(replica_id, ()))

    def recently_done(self, replica_id: str) -> int:
        """This gateway's prompt tokens done on the replica within `stale_s`: its last reported
        queue may still count them."""
        done = self._done.get(replica_id)
        if not done:
            return 0
        horizon = self._clock() - self._stale_s
        while done and done[0][0] < horizon:
            done.popleft()
        if not done:
            del self._done[replica_id]
        return sum(tokens for _, tokens in done)

    # -- one request's entries, in order -----------------------------------------------------

    def expect(self, request_id: str, uncached_tokens: int) -> None:
        self._pending[request_id] = max(uncached_tokens, 0)
        while len(self._pending) > self._max_pending:
            self._pending.pop(next(iter(self._pending)))

    def book(self, request_id: str, worker: Worker) -> None:
        """The request's decode replica, chosen by the router: in flight there from now until its
        decode hop starts (`start` on a decode worker takes the booking over) or `unbook`."""
        self.unbook(request_id)  # routed again (a continuation): the new pick replaces the old
        self._booked[request_id] = worker.replica_id
        self._in_flight[worker.replica_id] = self._in_flight.get(worker.replica_id, 0) + 1
        while len(self._booked) > self._max_pending:  # bounded even if an owner never unbooks
            self.unbook(next(iter(self._booked)))

    def unbook(self, request_id: str) -> None:
        """The request ended before its decode hop started (or never had one booked)."""
        replica_id = self._booked.pop(request_id, None)
        if replica_id is not None:
            _release(self._in_flight, replica_id, 1)

    def start(self, request_id: str, worker: Worker, adapter: Optional[str] = None) -> None:
        if worker.pool == "decode" and self._booked.get(request_id) == worker.replica_id:
            del self._booked[request_id]  # counted since the pick
        else:
            if worker.pool == "decode":
                self.unbook(request_id)  # another decode replica after all (Serve's pick, a fallback)
            self._in_flight[worker.replica_id] = self._in_flight.get(worker.replica_id, 0) + 1
        if adapter is not None:
            held = self._adapters.setdefault(worker.replica_id, {})
            held[adapter] = held.get(adapter, 0) + 1
        tokens = self._pending.pop(request_id, None)
        if tokens is None:
            return
        ahead = self._queued_tokens.get(worker.replica_id, 0)
        self._queued_tokens[worker.replica_id] = ahead + tokens
        # A clean sample of a prefill engine's cost: queued behind none of this gateway's
        # prompts (those ahead were partly computed already, so counting them whole would
        # bias the fit's intercept towards 0).
        self._prompts[request_id] = _QueuedPrompt(worker, tokens, self._timer(),
                                                  timed=ahead == 0 and worker.pool == "prefill")

    def prompt_done(self, request_id: str, observe: bool) -> Optional[PromptTimed]:
        """Release the request's queued prompt; with `observe`, its time when it is a clean sample."""
        prompt = self._prompts.pop(request_id, None)
        if prompt is None:
            return None
        _release(self._queued_tokens, prompt.worker.replica_id, prompt.tokens)
        if prompt.worker.pool == "prefill":  # only a prefill replica's reported queue is discounted
            self.recently_done(prompt.worker.replica_id)  # pruned here too: bounded by the window
            self._done.setdefault(prompt.worker.replica_id, collections.deque()).append((self._clock(), prompt.tokens))
        if not (observe and prompt.timed):
            return None
        return PromptTimed(prompt.worker, prompt.tokens, self._timer() - prompt.started)

    def end(self, worker: Worker, adapter: Optional[str] = None) -> None:
        _release(self._in_flight, worker.replica_id, 1)
        held = self._adapters.get(worker.replica_id)
        if adapter is not None and held is not None:
            _release(held, adapter, 1)
            if not held:
                del self._adapters[worker.replica_id]

    # -- the leak check -------------------------------------------------------------------------

    def leftovers(self) -> dict[str, int]:
        """Entries per map that are still held (the window of prompts done pruned first): empty
        once every request has ended and `stale_s` has passed."""
        for replica_id in list(self._done):
            self.recently_done(replica_id)
        maps = {"in_flight": self._in_flight, "queued_tokens": self._queued_tokens, "pending": self._pending,
                "prompts": self._prompts, "done": self._done, "adapters": self._adapters, "booked": self._booked}
        return {name: len(entries) for name, entries in maps.items() if entries}


def _release(counts: dict[str, int], key: str, amount: int) -> None:
    left = counts.get(key, 0) - amount
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)
