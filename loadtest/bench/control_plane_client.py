"""The control-plane benchmark's load generator, a process of its own (so its CPU is apart
from the system's and the parent's): `streams` closed loops, each one keep-alive HTTP/1.1
connection sending one streaming chat completion after another, for a warm-up and then a
measuring window. The client is a raw asyncio Protocol (uvloop's loop where installed) over
control_plane_sse.py's parser: CLIENT names it in the results.

    python -m loadtest.bench.control_plane_client --url http://127.0.0.1:8000 --model tiny-llama \\
        --streams 32 --warmup-s 5 --duration-s 20 --max-tokens 256

It reads the CPU seconds of the system's processes (--cpu-pids) and of the machine at the
window's edges itself, and talks to its parent on stdout, one line each: `WINDOW start` and
`WINDOW end`, `PROGRESS ...` every few seconds, and last `RESULT {json}`: the window's figures
(control_plane_stats.client_summary), each watched process's CPU seconds in the window, the
machine's busy seconds, and this process's own CPU seconds. Requests still streaming when the window
closes are dropped (their connections closed), neither completed nor failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
from typing import Optional
from urllib.parse import urlsplit

import psutil

from loadtest.bench.control_plane_sse import ProtocolError, RequestState, ResponseParser, Tally
from loadtest.bench.control_plane_stats import client_summary
from loadtest.bench.procs import machine_busy_s

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
                      timeout_s: float, conns: list[StreamConnection], stop: asyncio.Event) -> None:
    """One closed loop: a request, its whole answer, the next request, until `stop`. The
    flag, not only the task's cancellation: Python 3.11's wait_for (and a connect failing at
    the same moment) can swallow a cancellation, and a loop that missed it ran on forever.
    What fails once `stop` is set is this client closing, not the server failing: not counted."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(delay_s)
    conn: Optional[StreamConnection] = None
    while not stop.is_set():
        if conn is None or conn.lost:
            try:
                _, conn = await loop.create_connection(StreamConnection, host, port)
            except OSError as exc:
                if stop.is_set():
                    return
                tally.error(f"connect: {exc}", time.perf_counter())
                conn = None
                await asyncio.sleep(0.5)  # a server that refuses: do not spin
                continue
            conns.append(conn)
        state = RequestState(tally, time.perf_counter(), max_tokens)
        try:
            await asyncio.wait_for(conn.send(request, state), timeout_s)
        except (ConnectionError, ProtocolError, asyncio.TimeoutError) as exc:
            if stop.is_set():
                return
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
    stop = asyncio.Event()
    tasks = [asyncio.create_task(stream_loop(host, port, request, tally, args.max_tokens,
                                             spread * i / max(args.streams, 1), args.request_timeout_s, conns, stop))
             for i in range(args.streams)]
    watch = CpuWatch(args.cpu_pids)
    await asyncio.sleep(args.warmup_s)
    cpu0, machine0, own0 = watch.read(), psutil.cpu_times(), time.process_time()
    tally.window.start = time.perf_counter()
    say("WINDOW start")
    end = tally.window.start + args.duration_s
    while (left := end - time.perf_counter()) > 0.01:  # a timer may fire a little early
        await asyncio.sleep(min(args.progress_s, left))
        elapsed = time.perf_counter() - tally.window.start
        say(f"PROGRESS {elapsed:5.1f} s  {tally.tokens / elapsed:8.0f} tok/s  requests done {tally.completed}  "
            f"errors {tally.errors + tally.errors_outside}")
    tally.window.end = time.perf_counter()
    cpu1, machine1, own1 = watch.read(), psutil.cpu_times(), time.process_time()
    say("WINDOW end")
    stop.set()
    for task in tasks:
        task.cancel()
    for conn in conns:  # what a cancellation missed ends on its closed connection
        conn.close()
    _, stuck = await asyncio.wait(tasks, timeout=10)
    if stuck:
        say(f"PROGRESS {len(stuck)} stream(s) did not stop within 10 s of the window's end")
    busy, steal = machine_busy_s(machine0, machine1)
    return {"client": CLIENT, "client_cpu_s": round(own1 - own0, 4),
            "cpu_s_by_pid": {str(pid): round(cpu1[pid] - cpu0[pid], 4) for pid in cpu1 if pid in cpu0},
            "machine_busy_s": round(busy, 4), "steal_s": round(steal, 4), **client_summary(tally)}


class CpuWatch:
    """CPU seconds (user + system) of the system's processes, read at the window's edges by
    this process, so the readings and the window are the same instants (a parent woken by a
    pipe, reading every process on a saturated machine, lagged by more than a second)."""

    def __init__(self, pids: list[int]) -> None:
        self.procs = []
        for pid in pids:
            try:
                self.procs.append(psutil.Process(pid))
            except psutil.NoSuchProcess:
                pass

    def read(self) -> dict[int, float]:
        out = {}
        for proc in self.procs:
            try:
                t = proc.cpu_times()
            except psutil.NoSuchProcess:  # exited: its CPU in the window is unknown, so not counted
                continue
            out[proc.pid] = t.user + t.system
        return out


def room_for_sockets(streams: int) -> None:
    """One socket per stream (and a few more): raise the soft open-files limit toward the hard
    one where 1,024 (a common default) would refuse the 512-stream cell's connections."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = streams * 2 + 64
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want if hard == resource.RLIM_INFINITY else min(want, hard), hard))


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
    parser.add_argument("--cpu-pids", type=lambda t: [int(p) for p in t.split(",") if p], default=[],
                        help="the system's processes, whose CPU is read at the window's edges")
    args = parser.parse_args(argv)
    room_for_sockets(args.streams)
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
