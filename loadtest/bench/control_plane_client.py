"""The control-plane benchmark's load generator, a process of its own (so its CPU is apart
from the system's and the parent's): `streams` closed loops, each one keep-alive HTTP/1.1
connection sending one streaming chat completion after another, for a warm-up and then a
measuring window. The client is a raw asyncio Protocol (uvloop's loop where installed) over
control_plane_sse.py's parser: CLIENT names it in the results.

    python -m loadtest.bench.control_plane_client --url http://127.0.0.1:8000 --model tiny-llama \\
        --streams 32 --warmup-s 5 --duration-s 20 --max-tokens 256

It talks to its parent on stdout, one line each: `WINDOW start` and `WINDOW end` when the
window opens and closes (the parent reads every process's CPU then), `PROGRESS ...` every few
seconds, and last `RESULT {json}`: the window's figures (control_plane_stats.client_summary)
and this process's own CPU seconds in the window. Requests still streaming when the window
closes are dropped (their connections closed), neither completed nor failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Optional
from urllib.parse import urlsplit

from loadtest.bench.control_plane_sse import ProtocolError, RequestState, ResponseParser, Tally
from loadtest.bench.control_plane_stats import client_summary

PROMPT = "Write a short poem about the sea."


def client_name() -> str:
    try:
        import uvloop  # noqa: F401
        loop = "uvloop"
    except ImportError:
        loop = "asyncio"
    return f"raw HTTP/1.1 keep-alive client on {loop} (loadtest/bench/control_plane_client.py)"


CLIENT = client_name()


def request_bytes(host: str, port: int, path: str, model: str, max_tokens: int, prompt: str = PROMPT) -> bytes:
    """The one request every stream sends, built once: a streaming chat completion whose
    every event carries the usage so far (its tokens are counted exactly), ignore_eos so
    each answer has max_tokens tokens."""
    body = json.dumps({
        "model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
        "temperature": 0, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Accept: text/event-stream\r\nContent-Length: {len(body)}\r\n\r\n")
    return head.encode() + body


class StreamConnection(asyncio.Protocol):
    """One keep-alive connection; `send` one request at a time and await its end."""

    def __init__(self) -> None:
        self.transport: Optional[asyncio.Transport] = None
        self.parser: Optional[ResponseParser] = None
        self.ended: Optional[asyncio.Future] = None
        self.lost = False

    def connection_made(self, transport) -> None:
        self.transport = transport

    def send(self, data: bytes, state: RequestState) -> asyncio.Future:
        self.parser = ResponseParser(state.on_data)
        self.ended = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return self.ended

    def data_received(self, data: bytes) -> None:
        if self.parser is None or self.ended is None or self.ended.done():
            return
        try:
            self.parser.feed(data, time.perf_counter())
        except ProtocolError as exc:
            self.ended.set_exception(exc)
            return
        if self.parser.complete:
            self.ended.set_result(None)

    def connection_lost(self, exc) -> None:
        self.lost = True
        if self.ended is not None and not self.ended.done():
            self.ended.set_exception(ConnectionError(f"connection lost: {exc or 'closed by the server'}"))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def stream_loop(host: str, port: int, request: bytes, tally: Tally, max_tokens: int, delay_s: float,
                      timeout_s: float, conns: list[StreamConnection]) -> None:
    """One closed loop: a request, its whole answer, the next request, until cancelled."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(delay_s)
    conn: Optional[StreamConnection] = None
    while True:
        if conn is None or conn.lost:
            try:
                _, conn = await loop.create_connection(StreamConnection, host, port)
            except OSError as exc:
                tally.error(f"connect: {exc}", time.perf_counter())
                conn = None
                await asyncio.sleep(0.5)  # a server that refuses: do not spin
                continue
            conns.append(conn)
        state = RequestState(tally, time.perf_counter(), max_tokens)
        try:
            await asyncio.wait_for(conn.send(request, state), timeout_s)
        except (ConnectionError, ProtocolError, asyncio.TimeoutError) as exc:
            state.finish(time.perf_counter(), conn.parser.status, failure=f"{type(exc).__name__}: {exc}")
            conn.close()
            conn = None
            continue
        parser = conn.parser
        state.finish(time.perf_counter(), parser.status, body=parser.error_body)
        if not parser.keep_alive:
            conn.close()
            conn = None


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def run(args) -> dict:
    url = urlsplit(args.url)
    host, port = url.hostname or "127.0.0.1", url.port or 80
    request = request_bytes(host, port, "/v1/chat/completions", args.model, args.max_tokens)
    tally = Tally()
    conns: list[StreamConnection] = []
    # Stream starts spread over the first half of the warm-up: requests begin and end at
    # different times, as a steady load's do, not all 256 tokens in lockstep.
    spread = args.warmup_s / 2
    tasks = [asyncio.create_task(stream_loop(host, port, request, tally, args.max_tokens,
                                             spread * i / max(args.streams, 1), args.request_timeout_s, conns))
             for i in range(args.streams)]
    await asyncio.sleep(args.warmup_s)
    tally.window.start = time.perf_counter()
    cpu0 = time.process_time()
    say("WINDOW start")
    end = tally.window.start + args.duration_s
    while (left := end - time.perf_counter()) > 0.01:  # a timer may fire a little early
        await asyncio.sleep(min(args.progress_s, left))
        elapsed = time.perf_counter() - tally.window.start
        say(f"PROGRESS {elapsed:5.1f} s  {tally.tokens / elapsed:8.0f} tok/s  requests done {tally.completed}  "
            f"errors {tally.errors + tally.errors_outside}")
    tally.window.end = time.perf_counter()
    client_cpu_s = time.process_time() - cpu0
    say("WINDOW end")
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for conn in conns:
        conn.close()
    return {"client": CLIENT, "client_cpu_s": round(client_cpu_s, 4), **client_summary(tally)}


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True, help="the server's base URL (http only)")
    parser.add_argument("--model", required=True)
    parser.add_argument("--streams", type=int, required=True)
    parser.add_argument("--warmup-s", type=float, default=5)
    parser.add_argument("--duration-s", type=float, default=20)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--request-timeout-s", type=float, default=600)
    parser.add_argument("--progress-s", type=float, default=5)
    args = parser.parse_args(argv)
    try:
        import uvloop
    except ImportError:
        result = asyncio.run(run(args))
    else:
        result = uvloop.run(run(args))
    say("RESULT " + json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
