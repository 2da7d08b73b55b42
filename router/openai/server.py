"""The gateway replica's own HTTP server (`gateway.ingress: direct`, the default).

Why not Serve's HTTP proxy: every chunk of a streamed answer crossed a Ray hop from the
gateway replica to the proxy actor (an ASGI message pickled, queued and sent per chunk), which
cost the proxy ~0.4 ms and the gateway as much again per streamed token on the 2-core VM
(loadtest/bench/RESULTS.md, the control-plane section): more than vLLM's whole API server
spends per token. Here the replica serves HTTP itself with uvicorn, as `vllm serve` does, on the
same host and port Serve's proxy took; Serve still places, restarts and scales the replicas.

Several gateway replicas on one node share the port with SO_REUSEPORT: the kernel spreads
connections over them (Linux lets only the same user join a port so bound). On Kubernetes the
chart pins the gateway to the head pod, where Serve's proxy was.

Each request gets one access line in the replica's Serve log file (not the console), as Serve's
proxy wrote for it: method, path, status, latency and the request id the client sent in
X-Request-Id (or the one the edge made up), so an operator finds a request by the id it returned.

Lifecycle: `start` once on the replica's event loop (it returns when the socket listens, or
raises naming the address); `stop` on teardown (idempotent): stops accepting, lets open
streams finish for up to `drain_s`, then closes what is left. In a redeploy the new replica
already listens on the port (cluster/app.py gateway_options: surge), so closing this listener
leaves the port served; a connection the kernel had queued on this socket but not yet handed
to it is reset then, unless `net.ipv4.tcp_migrate_req` is 1 (docs/operations.md, Upgrades).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from typing import Any, Iterator, Optional

import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from router.openai.errors import REQUEST_ID_HEADER

log = logging.getLogger(__name__)
# A child of Serve's logger: inside a replica its records reach the replica's file under the
# session's logs/serve/. Its own level, because the cluster sets Serve's to WARNING to keep the
# console quiet, and an access log is an operator's record (Serve's proxy wrote it at INFO too).
access_log = logging.getLogger("ray.serve.tandem_access")
access_log.setLevel(logging.INFO)
_REQUEST_ID = REQUEST_ID_HEADER.lower().encode()


class AccessLog:
    """One line per HTTP request after its response ends, in Serve's access-log shape."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status, request_id = "ERROR", ""

        async def send_noting_status(message: Message) -> None:
            nonlocal status, request_id
            if message["type"] == "http.response.start":
                status = str(message["status"])
                for name, value in message.get("headers", ()):
                    if name.lower() == _REQUEST_ID:
                        request_id = value.decode("latin-1")
            await send(message)

        try:
            await self.app(scope, receive, send_noting_status)
        finally:
            path = scope.get("path", "")
            access_log.info("%s %s %s %.1fms request_id=%s", scope.get("method", ""), path, status,
                            (time.perf_counter() - start) * 1000, request_id,
                            extra={"request_id": request_id, "route": path, "serve_access_log": True,
                                   "log_to_stderr": False})


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # The process is a Ray worker: its signals are Ray's (uvicorn takes them on the main
        # thread, where Serve may run user code).
        yield


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port with SO_REUSEPORT (several replicas, one port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise RuntimeError(f"the gateway cannot listen on {host}:{port} ({exc}): another program holds the "
                           "port (set gateway.port), or Serve's HTTP proxy does (it must be off with "
                           "gateway.ingress: direct)") from exc
    return sock


class GatewayServer:
    def __init__(self, server: _Server, task: asyncio.Task, host: str, port: int):
        self._server, self._task = server, task
        self.host, self.port = host, port

    @classmethod
    async def start(cls, app: Any, host: str, port: int, *, keep_alive_s: float = 5.0) -> "GatewayServer":
        sock = listening_socket(host, port)
        config = uvicorn.Config(AccessLog(app), host=host, port=port, lifespan="off", access_log=False, log_config=None,
                                timeout_keep_alive=keep_alive_s, timeout_graceful_shutdown=None)
        server = _Server(config)
        task = asyncio.ensure_future(server.serve(sockets=[sock]))
        while not server.started:
            if task.done():  # it failed before listening: its error, with the address
                sock.close()
                raise RuntimeError(f"the gateway's HTTP server on {host}:{port} did not start") from task.exception()
            await asyncio.sleep(0.01)
        log.info("gateway listening on http://%s:%d", host, port)
        return cls(server, task, host, port)

    async def stop(self, drain_s: Optional[float] = 5.0) -> None:
        if self._task.done():
            return
        self._server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self._task), drain_s)
        except asyncio.TimeoutError:
            self._server.force_exit = True
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._task, 2.0)
        except Exception as exc:  # a server that failed: nothing left to stop
            log.warning("gateway HTTP server ended with %r", exc)
