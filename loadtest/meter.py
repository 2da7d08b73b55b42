"""Measuring one load-test request's answer: loadtest/measure/sse.py's StreamReader, plus the
checks a workload request allows (exact output and prompt token counts). Pure: the caller
passes the clock, so it is tested without a server (loadtest/users.py feeds it real lines).

Lifecycle: `StreamMeter(request, t_send, t0)` -> `feed(line, now)` for every line until it
returns False (done or error) -> `record(now, error="")` once.
"""

from __future__ import annotations

from dataclasses import replace

from loadtest.measure.record import RequestRecord
from loadtest.measure.sse import StreamReader
from loadtest.workloads import Request


class StreamMeter:
    def __init__(self, request: Request, t_send: float, t0: float) -> None:
        self.request = request
        self.t0 = t0
        self.reader = StreamReader(t_send)

    @property
    def ids(self) -> list[int]:
        return self.reader.ids

    def feed(self, line: bytes, now: float) -> bool:
        """One SSE line; False when the stream is over ([DONE] or an error event)."""
        return self.reader.feed(line, now)

    def record(self, now: float, error: str = "", status: int = 200) -> RequestRecord:
        """A stream that ended early or miscounted is a failure, not a fast success."""
        req = self.request
        sent = len(req.prompt_ids)
        rec = self.reader.record(now, error=error, status=status, expect_tokens=req.output_tokens,
                                 start_s=self.reader.t_send - self.t0, workload=req.workload, tier=req.tier,
                                 prompt_tokens=sent)
        counted = self.reader.usage.get("prompt_tokens")
        if rec.ok and counted not in (None, sent):
            return replace(rec, error=f"server counted {counted} prompt tokens, sent {sent}")
        return rec
