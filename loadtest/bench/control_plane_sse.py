"""The light client's pure half: an HTTP/1.1 response parser (status, headers, chunked or
sized body) that hands out SSE `data:` payloads, and the accounting of one measuring window
over many streams. No I/O here: unit-tested byte by byte (tests/unit/test_bench_control_plane.py).

Why a parser of our own and not httpx: the benchmark measures CPU per streamed token of the
system under test on the same two cores as the load generator; httpx's SSE reading costs
~0.19 ms of CPU per token here, more than vLLM's whole API server per token. This one does a
few bytes operations per event, and JSON-parses only events without a usage figure.

Token counting: requests ask for `stream_options: {include_usage, continuous_usage_stats}`,
so every event carries the answer's cumulative `completion_tokens`; an event's tokens are the
difference from the previous event's. An event that adds tokens is a content event (the
role-only opening event and the closing usage event add none). Without a usage figure an
event counts 1 token if it has content or text (a server without continuous usage stats).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Callable, Optional

_USAGE = b'"completion_tokens":'
DONE = b"[DONE]"


class ProtocolError(Exception):
    """The server's bytes are not an HTTP/1.1 response this client understands."""


class ResponseParser:
    """One HTTP/1.1 response, fed as it arrives. `on_data(payload, now)` gets each SSE `data:`
    payload (stripped bytes) of a 200 response; the body of any other status is kept (its
    first 1 KiB) for the error message. `complete` once the body ended; `keep_alive` whether
    the connection may carry the next request."""

    def __init__(self, on_data: Callable[[bytes, float], None]) -> None:
        self.on_data = on_data
        self.status = 0
        self.headers: dict[str, str] = {}
        self.complete = False
        self.keep_alive = True
        self.error_body = b""
        self._buf = bytearray()  # unparsed bytes (head, or chunk framing)
        self._line = bytearray()  # an SSE line not ended yet
        self._in_head = True
        self._chunked = False
        self._left = 0  # bytes of the current chunk (chunked) or of the body (sized) still to come
        self._in_trailer = False

    def feed(self, data: bytes, now: float) -> None:
        if self.complete:
            return
        self._buf += data
        if self._in_head:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                return
            self._head(bytes(self._buf[:end]))
            del self._buf[:end + 4]
            self._in_head = False
        if self._chunked:
            self._chunks(now)
        else:
            take = bytes(self._buf[:self._left])
            del self._buf[:len(take)]
            self._left -= len(take)
            self._body(take, now)
            if self._left == 0:
                self._finish(now)

    def _head(self, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise ProtocolError(f"bad status line: {lines[0][:100]!r}")
        self.status = int(parts[1])
        for line in lines[1:]:
            name, _, value = line.partition(":")
            self.headers[name.strip().lower()] = value.strip()
        self._chunked = "chunked" in self.headers.get("transfer-encoding", "").lower()
        if self.headers.get("connection", "").lower() == "close" or parts[0] == "HTTP/1.0":
            self.keep_alive = False
        if not self._chunked:
            if "content-length" not in self.headers:  # a body up to the connection's close: not reusable
                raise ProtocolError("a response without Content-Length nor chunked encoding")
            self._left = int(self.headers["content-length"])

    def _chunks(self, now: float) -> None:
        while not self.complete:
            if self._in_trailer:  # after the last chunk: trailers (none expected), then an empty line
                end = self._buf.find(b"\r\n")
                if end < 0:
                    return
                line = bytes(self._buf[:end])
                del self._buf[:end + 2]
                if not line:
                    self._finish(now)
                continue
            if self._left == 0:
                end = self._buf.find(b"\r\n")
                if end < 0:
                    return
                size_text = bytes(self._buf[:end]).split(b";", 1)[0].strip()
                del self._buf[:end + 2]
                try:
                    size = int(size_text, 16)
                except ValueError:
                    raise ProtocolError(f"bad chunk size {size_text[:20]!r}") from None
                if size == 0:
                    self._in_trailer = True
                    continue
                self._left = size + 2  # the chunk and its closing CRLF
            if not self._buf:
                return
            take = min(self._left, len(self._buf))
            piece = bytes(self._buf[:take])
            del self._buf[:take]
            self._left -= take
            # Strip the chunk's closing CRLF (it may arrive split from the data).
            self._body(piece[:max(0, take - max(0, 2 - self._left))], now)

    def _body(self, data: bytes, now: float) -> None:
        if not data:
            return
        if self.status != 200:
            if len(self.error_body) < 1024:
                self.error_body += data[:1024 - len(self.error_body)]
            return
        self._line += data
        start = 0
        while True:
            end = self._line.find(b"\n", start)
            if end < 0:
                break
            line = self._line[start:end]
            start = end + 1
            if line.startswith(b"data:"):
                self.on_data(bytes(line[5:]).strip(), now)
        del self._line[:start]

    def _finish(self, now: float) -> None:
        if self._line.startswith(b"data:"):  # a last line without its newline
            self.on_data(bytes(self._line[5:]).strip(), now)
        self._line.clear()
        self.complete = True


def usage_tokens(payload: bytes) -> Optional[int]:
    """The cumulative `completion_tokens` of an event, read without parsing its JSON; None if
    absent. Content text cannot fake it: a quote inside a JSON string is escaped (\\")."""
    at = payload.rfind(_USAGE)
    if at < 0:
        return None
    i = at + len(_USAGE)
    while i < len(payload) and payload[i] == 0x20:
        i += 1
    j = i
    while j < len(payload) and 0x30 <= payload[j] <= 0x39:
        j += 1
    return int(payload[i:j]) if j > i else None


def slow_event(payload: bytes) -> tuple[int, str]:
    """(tokens, error) of an event without a usage figure, from its JSON: an error event, or a
    chunk counted 1 token per choice with content (or text)."""
    try:
        chunk = json.loads(payload)
    except ValueError:
        return 0, f"malformed event: {payload[:200]!r}"
    if not isinstance(chunk, dict):
        return 0, f"malformed event: {payload[:200]!r}"
    if chunk.get("error") or chunk.get("object") == "error":
        err = chunk.get("error", chunk)
        return 0, "error event: " + str(err.get("message", err) if isinstance(err, dict) else err)[:200]
    tokens = 0
    for choice in chunk.get("choices") or ():
        if choice.get("token_ids"):
            tokens += len(choice["token_ids"])
        elif choice.get("text") or (choice.get("delta") or {}).get("content"):
            tokens += 1
    return tokens, ""


@dataclass
class Window:
    """The measuring window, in the client's clock (s); closed on the left. Unset: infinite."""

    start: float = math.inf
    end: float = math.inf

    def holds(self, t: float) -> bool:
        return self.start <= t < self.end


STALL_MS = 500.0  # 25 token gaps at the default 20 ms pace: no engine step takes that long


@dataclass
class Tally:
    """What the window saw, over every stream: tokens and content events that arrived in it,
    the gaps between a stream's successive content events (both in it), the TTFT of requests
    whose first token arrived in it, and the requests that ended in it (ok or failed).
    Requests that ended outside it (warm-up) count apart, so a broken warm-up is not hidden."""

    window: Window = field(default_factory=Window)
    tokens: int = 0
    events: int = 0
    gaps_ms: list[float] = field(default_factory=list)
    # (the answer's tokens before the gap, the gap): a stream's gaps of STALL_MS or more, kept
    # apart because a few of them can halve what the streams deliver while p99 looks fine.
    stalls: list[tuple[int, float]] = field(default_factory=list)
    ttfts_ms: list[float] = field(default_factory=list)
    completed: int = 0
    errors: int = 0
    errors_outside: int = 0
    completed_outside: int = 0
    error_samples: list[str] = field(default_factory=list)

    def error(self, message: str, now: float) -> None:
        if self.window.holds(now):
            self.errors += 1
        else:
            self.errors_outside += 1
        if len(self.error_samples) < 5:
            self.error_samples.append(message[:300])


class RequestState:
    """One streamed request's events, accounted into a Tally as they come."""

    def __init__(self, tally: Tally, t_send: float, expect_tokens: int) -> None:
        self.tally, self.t_send, self.expect = tally, t_send, expect_tokens
        self.tokens = 0  # the answer's tokens so far
        self.last_event: Optional[float] = None  # when the last content event came
        self.done = False
        self.error = ""

    def on_data(self, payload: bytes, now: float) -> None:
        if self.done or self.error:
            return
        if payload == DONE:
            self.done = True
            return
        total = usage_tokens(payload)
        if total is not None:
            added = total - self.tokens
        else:
            added, self.error = slow_event(payload)
            total = self.tokens + added
        if added <= 0:
            return
        self.tokens = total
        tally = self.tally
        if tally.window.holds(now):
            tally.tokens += added
            tally.events += 1
            if self.last_event is None:
                tally.ttfts_ms.append((now - self.t_send) * 1000.0)
            elif self.last_event >= tally.window.start:
                gap_ms = (now - self.last_event) * 1000.0
                tally.gaps_ms.append(gap_ms)
                if gap_ms >= STALL_MS:
                    tally.stalls.append((total - added, gap_ms))
        self.last_event = now

    def finish(self, now: float, status: int, failure: str = "", body: bytes = b"") -> bool:
        """Account the request's end; True when it succeeded."""
        if failure:
            why = failure
        elif status != 200:
            why = f"HTTP {status}: {body[:200].decode(errors='replace')}"
        elif self.error:
            why = self.error
        elif not self.done:
            why = "stream ended without [DONE]"
        elif self.tokens != self.expect:
            why = f"short answer: {self.tokens} of {self.expect} tokens"
        else:
            if self.tally.window.holds(now):
                self.tally.completed += 1
            else:
                self.tally.completed_outside += 1
            return True
        self.tally.error(why, now)
        return False
