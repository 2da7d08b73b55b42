"""The Host allow-list: the edge answers only requests addressed to one of its own names.

Against DNS rebinding: a web page on evil.example re-points its name to 127.0.0.1, and the
browser then sends the page's requests to a local cluster, with `Host: evil.example`. The
browser cannot forge that header, so refusing unknown hosts (421 Misdirected Request) cuts
the attack off; a cluster with no API keys is otherwise open to any page its user visits.

Entries are host names or addresses ("localhost", "10.0.0.5", "[::1]"), optionally with a
port ("api.example:443"); a name without a port allows it on any port. "*" allows every host
(a deployment behind an ingress that checks Host itself). The default list for a bound
address is the config's (cluster/config/services.py default_allowed_hosts).
"""

from __future__ import annotations

from typing import Iterable, Optional

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from router.openai.errors import OpenAIError

# Probes (a kubelet sends the pod IP as Host) and nothing a rebinding page could use.
EXEMPT_PATHS = frozenset({"/livez", "/health"})
def _split(host: str) -> tuple[str, Optional[str]]:
    """'Name:8000' → ('name', '8000'); '[::1]:8000' → ('[::1]', '8000'); no port → None."""
    host = host.strip().lower()
    if host.startswith("["):
        end = host.find("]")
        rest = host[end + 1:]
        return host[: end + 1], (rest[1:] if rest.startswith(":") else None)
    name, sep, port = host.rpartition(":")
    return (name, port) if sep else (host, None)


class HostAllowList:
    """Pure ASGI middleware (streams and disconnects pass through untouched)."""

    def __init__(self, app: ASGIApp, allowed: Iterable[str]) -> None:
        self.app = app
        entries = [_split(a) for a in allowed]
        self._any = any(name == "*" for name, _ in entries)
        self._allowed = {(name, port) for name, port in entries}

    def allows(self, host: Optional[str]) -> bool:
        if self._any:
            return True
        if not host:
            return False
        name, port = _split(host)
        return (name, None) in self._allowed or (name, port) in self._allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in EXEMPT_PATHS:
            await self.app(scope, receive, send)
            return
        host = Headers(scope=scope).get("host")
        if self.allows(host):
            await self.app(scope, receive, send)
            return
        error = OpenAIError(421, "This server does not answer requests for that Host; it is not one of "
                                 "gateway.allowed_hosts.", "invalid_request_error", None, "host_not_allowed")
        await error.response()(scope, receive, send)
