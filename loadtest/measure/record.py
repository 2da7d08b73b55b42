"""What the client saw of one streamed request (`RequestRecord`), and the records of a run
(`Samples`). Pure: no I/O; loadtest/measure/sse.py makes records from SSE lines.

Every figure is derived from three measurements: when the first token arrived, the gap before
each later token, and when the stream ended. Tokens that arrive in one SSE chunk arrive
together: the first carries the gap since the previous chunk, the others a gap of 0. Two
views of the gaps exist because two questions are asked of them:

- `token_gaps_ms`, as measured: a stall shows as one large gap (the stream benchmark's
  token-gap tail, the goodput benchmark's max-gap bound).
- `itl_ms`, a chunk's gap shared by its tokens (k tokens after a gap g: k gaps of g/k), as
  aiperf reports inter-token latency; its mean is (last - first token) / (tokens - 1). The
  load test's ITL events and its SLO bound read this one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

# The metrics a load-test SLO can bound (loadtest/measure/slo.py); all per request except
# itl_ms (one sample per token gap). Each is an attribute of RequestRecord.
METRICS = ("ttft_ms", "itl_ms", "e2e_ms", "tokens_per_s")


@dataclass(frozen=True)
class RequestRecord:
    """One streamed request. Times are ms since it was sent, except `start_s` (seconds since
    the run started). `error` set: it failed (its latencies count nowhere)."""

    ttft_ms: Optional[float] = None  # sent -> first token
    token_gaps_ms: tuple[float, ...] = ()  # one per token after the first
    e2e_ms: Optional[float] = None  # sent -> the stream's end (or the failure)
    usage_tokens: Optional[int] = None  # the server's count of output tokens, when it sent usage
    prompt_tokens: Optional[int] = None
    status: int = 0  # HTTP status; 0: no response
    error: str = ""
    # What was sent, for reports: the schedule's index, when, which workload, which tier.
    index: int = 0
    start_s: float = 0.0
    workload: str = ""
    tier: str = ""

    @property
    def ok(self) -> bool:
        return not self.error

    @property
    def tokens(self) -> int:
        """Tokens counted in the stream."""
        return 0 if self.ttft_ms is None else 1 + len(self.token_gaps_ms)

    @property
    def output_tokens(self) -> int:
        """The server's count when it gave one (a chunk without token ids counts as one
        token in the stream), else the stream's."""
        return self.tokens if self.usage_tokens is None else self.usage_tokens

    @property
    def decode_ms(self) -> Optional[float]:
        """First token -> last token."""
        return None if self.ttft_ms is None else sum(self.token_gaps_ms)

    @property
    def mean_itl_ms(self) -> Optional[float]:
        """The request's mean inter-token latency: decode time / (tokens - 1)."""
        if self.decode_ms is None or self.output_tokens < 2:
            return None
        return self.decode_ms / (self.output_tokens - 1)

    @property
    def max_gap_ms(self) -> float:
        return max(self.token_gaps_ms, default=0.0)

    @property
    def itl_ms(self) -> tuple[float, ...]:
        """Every gap, a chunk's shared by its tokens (see the module's docstring)."""
        out: list[float] = []
        i, gaps = 0, self.token_gaps_ms
        while i < len(gaps):
            j = i + 1
            while j < len(gaps) and gaps[j] == 0.0:  # the rest of this chunk
                j += 1
            out.extend([gaps[i] / (j - i)] * (j - i))
            i = j
        return tuple(out)

    @property
    def tokens_per_s(self) -> Optional[float]:
        """The stream's decode rate: (tokens - 1) / (end - first token)."""
        if self.ttft_ms is None or self.e2e_ms is None or self.output_tokens < 2:
            return None
        decode_s = (self.e2e_ms - self.ttft_ms) / 1000.0
        return (self.output_tokens - 1) / decode_s if decode_s > 0 else None


@dataclass
class Samples:
    """All records of a run, in completion order."""

    records: list[RequestRecord] = field(default_factory=list)

    def add(self, record: RequestRecord) -> None:
        self.records.append(record)

    def values(self, metric: str, workload: Optional[str] = None) -> list[float]:
        """Samples of one metric over the successful requests (optionally one workload)."""
        if metric not in METRICS:
            raise ValueError(f"unknown metric {metric!r}; one of {', '.join(METRICS)}")
        out: list[float] = []
        for r in self.records:
            if not r.ok or (workload is not None and r.workload != workload):
                continue
            v = getattr(r, metric)
            if isinstance(v, tuple):
                out.extend(v)
            elif v is not None:
                out.append(v)
        return out

    @property
    def requests(self) -> int:
        return len(self.records)

    @property
    def errors(self) -> int:
        return sum(1 for r in self.records if not r.ok)

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.records else 0.0

    def workloads(self) -> list[str]:
        return sorted({r.workload for r in self.records})
