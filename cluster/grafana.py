"""`tandem grafana-push`: upload the chart's dashboards to a Grafana through its HTTP API.

Uses `grafana-client` (the `grafana` extra), imported only here and only when pushing: it
brings urllib3-future, which replaces urllib3, so it belongs in a venv of its own rather than
the cluster's. Everything that does not talk to Grafana (reading the dashboards, the request
payloads, turning failures into messages) is plain Python and tested without it.

The token never appears in output: errors name the URL (without any user:password part)
and Grafana's own message, and anything that would echo the token is masked.
"""

from __future__ import annotations

import json
import re
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO
from urllib.parse import urlsplit, urlunsplit

DEFAULT_DIR = Path(__file__).resolve().parent.parent / "deploy" / "helm" / "tandem" / "dashboards"
DEFAULT_FOLDER = "tandem"
TIMEOUT_S = 10.0
INSTALL_HINT = (
    "tandem grafana-push needs grafana-client, the `grafana` extra. It replaces urllib3 with "
    "urllib3-future, so give it a venv of its own:\n"
    "  python -m venv .venv-grafana && .venv-grafana/bin/pip install --no-deps -e . "
    "&& .venv-grafana/bin/pip install 'grafana-client==5.1.4'\n"
    "  .venv-grafana/bin/tandem grafana-push --url URL"
)


class PushError(Exception):
    """A failure the user can act on; the message says what to do and never holds the token."""


@dataclass(frozen=True)
class Dashboard:
    file: str
    uid: str
    title: str
    model: dict


def load_dashboards(directory: Path) -> list[Dashboard]:
    files = sorted(Path(directory).glob("*.json"))
    if not files:
        raise PushError(f"no dashboards (*.json) in {directory}")
    out = []
    for path in files:
        try:
            model = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise PushError(f"{path} is not valid JSON: {e}") from e
        if not model.get("uid") or not model.get("title"):
            raise PushError(f"{path} has no uid or title; Grafana needs both to overwrite it on the next push")
        out.append(Dashboard(path.name, model["uid"], model["title"], model))
    return out


def folder_uid(name: str) -> str:
    """A stable folder uid from its name, so repeated pushes land in the same folder."""
    slug = re.sub(r"[^a-z0-9_-]+", "-", name.lower()).strip("-")
    if not slug:
        raise PushError(f"folder name {name!r} has no letters or digits to make a Grafana uid from")
    return slug[:40]  # Grafana's limit for uids


def dashboard_payload(dashboard: Dashboard, folder: str) -> dict:
    """Body of POST /api/dashboards/db: replaces the dashboard with the same uid, if any.
    `id` must be null, or Grafana looks for that numeric id instead of the uid."""
    return {"dashboard": {**dashboard.model, "id": None}, "folderUid": folder, "overwrite": True,
            "message": "tandem grafana-push"}


def safe_url(url: str) -> str:
    """The URL as it may be printed: without a user:password part."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _mask(text: str, secret: str | None) -> str:
    return text.replace(secret, "***") if secret else text


def http_error(status: int, grafana_message: str, url: str) -> PushError:
    where = safe_url(url)
    if status in (401, 403):
        what = "rejected the token" if status == 401 else "refused the token: it lacks permission"
        return PushError(f"Grafana at {where} {what} (HTTP {status}: {grafana_message}). Pass a service account "
                         "token with the Editor role (folders and dashboards write) via --token or GRAFANA_TOKEN.")
    return PushError(f"Grafana at {where} answered HTTP {status}: {grafana_message}")


def connection_error(exc: BaseException, url: str, timeout_s: float = TIMEOUT_S) -> PushError:
    """Names the cause the user can fix, found in the exception's chain (HTTP clients wrap
    the socket's error several times over)."""
    where = safe_url(url)
    seen = exc
    while seen is not None:
        if isinstance(seen, socket.gaierror):
            host = urlsplit(url).hostname
            return PushError(f"cannot reach Grafana at {where}: the host name {host!r} does not resolve (DNS)")
        if isinstance(seen, ConnectionRefusedError):
            return PushError(f"cannot reach Grafana at {where}: connection refused (is Grafana running on that "
                             "host and port?)")
        if isinstance(seen, TimeoutError):
            return PushError(f"cannot reach Grafana at {where}: no answer within {timeout_s:g} s (timeout)")
        seen = seen.__cause__ or seen.__context__
    return PushError(f"cannot reach Grafana at {where}: {type(exc).__name__}: {exc}")


def _grafana_message(response) -> str:
    if isinstance(response, dict) and response.get("message"):
        return str(response["message"])
    return str(response or "no message")


class _Grafana:
    """The few grafana-client calls a push makes, each failure turned into a PushError."""

    def __init__(self, url: str, token: str, timeout_s: float):
        from grafana_client import GrafanaApi
        from grafana_client.client import GrafanaException

        self._url, self._token, self._timeout_s = url, token, timeout_s
        self._exceptions = GrafanaException
        self._api = GrafanaApi.from_url(url, credential=token, timeout=timeout_s)

    def _call(self, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except self._exceptions as e:
            if e.status_code:
                raise http_error(e.status_code, _mask(_grafana_message(e.response), self._token), self._url) from None
            raise PushError(_mask(str(connection_error(e, self._url, self._timeout_s)), self._token)) from None
        except OSError as e:  # the HTTP client's ConnectionError is an OSError
            raise PushError(_mask(str(connection_error(e, self._url, self._timeout_s)), self._token)) from None

    def ensure_folder(self, name: str) -> str:
        """The uid of the top-level folder called `name`, created when missing."""
        for folder in self._call(self._api.folder.get_all_folders):
            if folder.get("title") == name:
                return folder["uid"]
        return self._call(self._api.folder.create_folder, name, uid=folder_uid(name))["uid"]

    def put_dashboard(self, payload: dict) -> dict:
        return self._call(self._api.dashboard.update_dashboard, payload)


def push(url: str, token: str, folder: str, directory: Path, out: TextIO, timeout_s: float = TIMEOUT_S) -> None:
    dashboards = load_dashboards(directory)
    grafana = _Grafana(url, token, timeout_s)
    uid = grafana.ensure_folder(folder)
    base = safe_url(url).rstrip("/")
    for dashboard in dashboards:
        answer = grafana.put_dashboard(dashboard_payload(dashboard, uid))
        print(f"{dashboard.title}: {base}{answer.get('url', '/d/' + dashboard.uid)} (version {answer.get('version')})",
              file=out, flush=True)


def run(url: str, token: str | None, folder: str, directory: Path, out: TextIO | None = None,
        err: TextIO | None = None, timeout_s: float = TIMEOUT_S) -> int:
    """The CLI command: 0 when every dashboard is in Grafana, 2 with one line saying why not."""
    out, err = out or sys.stdout, err or sys.stderr
    if not token:
        print("no Grafana token: pass --token or set GRAFANA_TOKEN (a service account token with the Editor role)",
              file=err)
        return 2
    try:
        import grafana_client  # noqa: F401  (only to say how to install it when missing)
    except ImportError:
        print(INSTALL_HINT, file=err)
        return 2
    try:
        push(url, token, folder, directory, out, timeout_s)
    except PushError as e:
        print(f"grafana-push: {_mask(str(e), token)}", file=err)
        return 2
    return 0
