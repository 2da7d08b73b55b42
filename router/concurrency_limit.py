"""An adaptive limit on a tier's running requests, steered by their time to first token.

A fixed `max_running` is either too small for light requests or past the knee for heavy
ones: beyond it, extra requests in the pools only queue inside the engines, and every
admitted request's TTFT grows with them. This limit finds the knee from what it measures
(AIMD, as TCP and Netflix's concurrency-limits do):

- A request whose TTFT (from taking its place to its first token) is over `target_s`
  shrinks the limit by `backoff`, once per round: requests admitted before the last cut
  were admitted under the older, higher limit and say nothing new about the current one.
- A request within target while the limit is in use (the tier was full when it reported)
  grows the limit by one.
- The limit stays within [floor, ceiling]; it starts at the ceiling.

Pure and synchronous (a clock is passed in), so the gate and the unit tests drive it alike.
Call order: `limit` whenever the gate asks for a free place; `observe(...)` once per admitted
request, at its first token.
"""

from __future__ import annotations

from typing import Callable


class AdaptiveLimit:
    def __init__(self, target_s: float, floor: int, ceiling: int, clock: Callable[[], float], backoff: float = 0.75):
        if not 1 <= floor <= ceiling:
            raise ValueError(f"need 1 <= floor ({floor}) <= ceiling ({ceiling})")
        self.target_s = target_s
        self.floor = floor
        self.ceiling = ceiling
        self.backoff = backoff
        self._clock = clock
        self._value = float(ceiling)
        self._last_cut = float("-inf")

    @property
    def limit(self) -> int:
        return max(self.floor, int(self._value))

    def observe(self, ttft_s: float, admitted_at: float, running: int) -> None:
        """One admitted request's time to first token; `running`: the tier's running count now."""
        if ttft_s > self.target_s:
            if admitted_at >= self._last_cut:
                self._value = max(float(self.floor), self._value * self.backoff)
                self._last_cut = self._clock()
        elif running >= self.limit:
            self._value = min(float(self.ceiling), self._value + 1)
