"""Measuring one streamed answer from its SSE lines. Pure: the caller passes the clock, so
the arithmetic is tested without a server (loadtest/users.py feeds it real lines).

Lifecycle: `StreamMeter(request, t_send, t0)` -> `feed(line, now)` for every line until it
returns False (done or error) -> `record(now, error="")` once.
"""

from __future__ import annotations

import json
from typing import Optional

from loadtest.stats import RequestRecord
from loadtest.workloads import Request


class StreamMeter:
    def __init__(self, request: Request, t_send: float, t0: float) -> None:
        self.request = request
        self.t_send = t_send
        self.t0 = t0
        self.first: Optional[float] = None
        self.last: Optional[float] = None
        self.gaps: list[float] = []
        self.ids: list[int] = []
        self.count = 0
        self.usage: Optional[dict] = None
        self.error = ""
        self.done = False

    def feed(self, line: bytes, now: float) -> bool:
        """One SSE line; False when the stream is over ([DONE] or an error event)."""
        if not line.startswith(b"data: "):
            return True
        data = line[6:]
        if data.strip() == b"[DONE]":
            self.done = True
            return False
        obj = json.loads(data)
        if obj.get("error"):
            err = obj["error"]
            self.error = f"stream error: {err.get('message', err) if isinstance(err, dict) else err}"
            return False
        self.usage = obj.get("usage") or self.usage
        for choice in obj.get("choices") or ():
            ids = choice.get("token_ids") or ()
            n = len(ids) or (1 if choice.get("text") else 0)  # without ids, one token per chunk
            if n == 0:
                continue
            if self.first is None or self.last is None:
                self.first = now
                self.gaps.extend([0.0] * (n - 1))  # tokens that came with the first one
            else:
                self.gaps.extend([(now - self.last) * 1000.0 / n] * n)
            self.last = now
            self.count += n
            self.ids.extend(ids)
        return True

    def check(self) -> str:
        """A stream that ended early or miscounted is a failure, not a fast success."""
        req = self.request
        if not self.done:
            return "stream ended without [DONE]"
        if self.count != req.output_tokens:
            return f"got {self.count} of {req.output_tokens} output tokens"
        if self.usage and self.usage.get("prompt_tokens") != len(req.prompt_ids):
            return f"server counted {self.usage.get('prompt_tokens')} prompt tokens, sent {len(req.prompt_ids)}"
        return ""

    def record(self, now: float, error: str = "") -> RequestRecord:
        error = error or self.error or self.check()
        req = self.request
        return RequestRecord(
            start_s=self.t_send - self.t0, workload=req.workload, tier=req.tier, ok=not error,
            prompt_tokens=len(req.prompt_ids), output_tokens=self.count,
            ttft_ms=None if self.first is None else (self.first - self.t_send) * 1000.0,
            e2e_ms=(now - self.t_send) * 1000.0, itl_ms=tuple(self.gaps), error=error)
