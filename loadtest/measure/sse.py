"""Reading an OpenAI-style server-sent-event stream (/v1/completions or /v1/chat/completions
with "stream": true), for every client in the repo: the Locust user, the benchmarks, the soak
and the integration tests.

- `payload(line)`: the data of one `data:` line; `read_events(lines)`: every event, parsed.
- `StreamReader`: one answer, line by line, timed with the caller's clock, into a
  RequestRecord (loadtest/measure/record.py). Pure: tested without a server.
- `stream_async(client, url, body)`: one streamed POST through httpx, read by a StreamReader.

Token counting: a choice's `token_ids` when the server sends them (request them with
"return_token_ids": true, so a chunk carrying several tokens counts them all), else one token
for a chunk with text (completions) or content (chat). The chat role-only opening chunk and
the usage chunk carry none.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import Any, Callable, Iterable, Optional

import httpx

from loadtest.measure.record import RequestRecord

DONE = "[DONE]"


def payload(line: str | bytes) -> Optional[str]:
    """The data of an SSE `data:` line, stripped; None for any other line (comments such as
    keep-alives, `event:`, blank separators)."""
    if isinstance(line, bytes):
        line = line.decode("utf-8", errors="replace")
    if not line.startswith("data:"):
        return None
    return line[5:].strip()


def read_events(lines: Iterable[str | bytes]) -> tuple[list[Any], bool]:
    """(every event's payload, parsed: JSON, or the text where it is not JSON; whether the
    stream said [DONE]). Blank payloads are skipped."""
    events: list[Any] = []
    done = False
    for line in lines:
        data = payload(line)
        if data == DONE:
            done = True
        elif data:
            try:
                events.append(json.loads(data))
            except ValueError:
                events.append(data)
    return events, done


def chunk_tokens(choice: dict) -> int:
    ids = choice.get("token_ids")
    if ids:
        return len(ids)
    return 1 if chunk_text(choice) else 0


def chunk_text(choice: dict) -> str:
    if "text" in choice:
        return choice.get("text") or ""
    return (choice.get("delta") or {}).get("content") or ""


def _message(error: Any) -> str:
    text = error.get("message", error) if isinstance(error, dict) else error
    return str(text)[:200]


class StreamReader:
    """One streamed answer. Lifecycle: `StreamReader(t_send)` -> `feed(line, now)` for each
    line (False once the stream is over: [DONE], an error event or a malformed one; later
    lines are ignored) -> `record(now, ...)` once. `now` and `t_send` read one clock, in s."""

    def __init__(self, t_send: float) -> None:
        self.t_send = t_send
        self.ttft_ms: Optional[float] = None
        self._last_ms = 0.0
        self.gaps_ms: list[float] = []
        self.ids: list[int] = []  # the output token ids, where the server sent them
        self.pieces: list[str] = []
        self.finish_reasons: list[str] = []
        self.usage: dict = {}
        self.done = False  # [DONE] came
        self.error = ""  # from an error event (or a malformed one)

    @property
    def over(self) -> bool:
        return self.done or bool(self.error)

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def finished(self) -> bool:
        """A choice ended with a finish reason (stop, length, ...)."""
        return bool(self.finish_reasons)

    def feed(self, line: str | bytes, now: float) -> bool:
        if self.over:
            return False
        data = payload(line)
        if not data:
            return True
        if data == DONE:
            self.done = True
            return False
        try:
            chunk = json.loads(data)
        except ValueError:
            chunk = None
        if not isinstance(chunk, dict):
            self.error = f"malformed event: {data[:200]}"
            return False
        if chunk.get("error"):
            self.error = f"error event: {_message(chunk['error'])}"
            return False
        self.usage = chunk.get("usage") or self.usage
        for choice in chunk.get("choices") or ():
            self.pieces.append(chunk_text(choice))
            if choice.get("finish_reason") is not None:
                self.finish_reasons.append(choice["finish_reason"])
            n = chunk_tokens(choice)
            if n == 0:
                continue
            self.ids.extend(choice.get("token_ids") or ())
            at = (now - self.t_send) * 1000.0
            if self.ttft_ms is None:
                self.ttft_ms = at
            else:
                self.gaps_ms.append(at - self._last_ms)
            self.gaps_ms.extend([0.0] * (n - 1))  # the chunk's other tokens came with it
            self._last_ms = at
        return True

    def record(self, now: float, *, error: str = "", status: int = 200, expect_tokens: Optional[int] = None,
               **labels: Any) -> RequestRecord:
        """The record, failed with the first of: the caller's `error`, the stream's error
        event, no token, no [DONE], or another count of output tokens than `expect_tokens`.
        `labels`: RequestRecord's index, start_s, workload, tier (or prompt_tokens: what was
        sent, instead of the server's count)."""
        labels.setdefault("prompt_tokens", self.usage.get("prompt_tokens"))
        rec = RequestRecord(ttft_ms=self.ttft_ms, token_gaps_ms=tuple(self.gaps_ms),
                            e2e_ms=(now - self.t_send) * 1000.0, usage_tokens=self.usage.get("completion_tokens"),
                            status=status, **labels)
        error = error or self.error
        if not error and self.ttft_ms is None:
            error = "stream ended without a token"
        elif not error and not self.done:
            error = "stream ended without [DONE]"
        elif not error and expect_tokens is not None and rec.output_tokens != expect_tokens:
            error = f"got {rec.output_tokens} of {expect_tokens} output tokens"
        return replace(rec, error=error) if error else rec


async def stream_async(client: httpx.AsyncClient, url: str, body: dict, *, headers: Optional[dict] = None,
                       expect_tokens: Optional[int] = None, clock: Callable[[], float] = time.perf_counter,
                       **labels: Any) -> tuple[RequestRecord, StreamReader]:
    """POST `body` to `url` and read the stream to its end (after [DONE] too, so the
    connection goes back to the pool instead of being closed: the next request's TTFT would
    include a new connection). An HTTP error or a connection failure is a failed record."""
    reader = StreamReader(clock())
    status = 0
    try:
        async with client.stream("POST", url, json=body, headers=headers) as resp:
            status = resp.status_code
            if status != 200:
                text = (await resp.aread())[:200].decode(errors="replace")
                return reader.record(clock(), status=status, error=f"HTTP {status}: {text}", **labels), reader
            async for line in resp.aiter_lines():
                reader.feed(line, clock())
    except httpx.HTTPError as exc:
        return reader.record(clock(), status=status, error=f"{type(exc).__name__}: {exc}", **labels), reader
    return reader.record(clock(), status=status, expect_tokens=expect_tokens, **labels), reader
