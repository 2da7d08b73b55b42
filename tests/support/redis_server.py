"""A real, throwaway redis-server for the tests (Debian's package, installed by `make test`),
on a free port of 127.0.0.1, and the one way tests run one: `running(server)`."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from contextlib import contextmanager
from typing import Iterator, TypeVar

import pytest
import redis


class RedisServer:
    """A throwaway redis-server (no persistence) that a test can stop and start again."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not installed: run `make test` (it installs Debian's redis-server)")
        self.binary = binary
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc = None

    def listen_args(self) -> list[str]:
        """Where and how it listens (a subclass adds a password or TLS)."""
        return ["--port", str(self.port)]

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url)

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", *self.listen_args()],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = self.client()
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
            self.proc = None


Server = TypeVar("Server", bound=RedisServer)


@contextmanager
def running(server: Server) -> Iterator[Server]:
    server.start()
    try:
        yield server
    finally:
        server.stop()
