"""`tandem grafana-push` (cluster/grafana.py).

The pure part (reading the dashboards, payloads, folder uids, turning failures into messages)
runs everywhere. The push itself goes through grafana-client, the `grafana` extra, which is
kept out of the cluster's venv (its urllib3-future replaces urllib3): those tests run against
a fake Grafana HTTP server (tests/support/fakes.py) where grafana-client is installed, e.g.
    python -m venv /tmp/gf && /tmp/gf/bin/pip install 'grafana-client==5.1.4' pytest ...
and are skipped, with that reason, elsewhere."""

from __future__ import annotations

import io
import json
import re
import socket

import pytest

from cluster import cli, grafana
from tests.conftest import REPO
from tests.support.fakes import FakeGrafana

TOKEN = "glsa_s3cret-token-value"
CHART_DASHBOARDS = REPO / "deploy" / "helm" / "tandem" / "dashboards"

try:
    import grafana_client  # noqa: F401
    HAVE_CLIENT = True
except ImportError:
    HAVE_CLIENT = False
needs_client = pytest.mark.skipif(not HAVE_CLIENT, reason="grafana-client (the `grafana` extra) is not installed "
                                                          "in this venv; it is kept out of the cluster's venv")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- the pure part -------------------------------------------------------------------------------

def test_loads_the_charts_dashboards():
    boards = grafana.load_dashboards(CHART_DASHBOARDS)
    assert {b.uid for b in boards} == {"tandem-slo", "tandem-pools", "tandem-kv-transfer", "tandem-router"}
    assert all(b.title.startswith("tandem / ") for b in boards)


def test_refuses_an_empty_folder_and_a_dashboard_without_uid(tmp_path):
    with pytest.raises(grafana.PushError, match="no dashboards"):
        grafana.load_dashboards(tmp_path)
    (tmp_path / "x.json").write_text('{"title": "x"}')
    with pytest.raises(grafana.PushError, match="x.json has no uid"):
        grafana.load_dashboards(tmp_path)
    (tmp_path / "x.json").write_text('{"title": ')
    with pytest.raises(grafana.PushError, match="x.json is not valid JSON"):
        grafana.load_dashboards(tmp_path)


def test_folder_uid_is_stable_and_valid():
    assert grafana.folder_uid("tandem") == "tandem"
    assert grafana.folder_uid("LLM serving / prod") == "llm-serving-prod"
    assert len(grafana.folder_uid("x" * 100)) == 40
    with pytest.raises(grafana.PushError, match="no letters or digits"):
        grafana.folder_uid(" / ")


def test_payload_overwrites_by_uid_into_the_folder():
    [board] = [b for b in grafana.load_dashboards(CHART_DASHBOARDS) if b.uid == "tandem-slo"]
    payload = grafana.dashboard_payload(board, "tandem")
    assert payload["overwrite"] is True and payload["folderUid"] == "tandem"
    assert payload["dashboard"]["id"] is None and payload["dashboard"]["uid"] == "tandem-slo"
    assert payload["dashboard"]["panels"] == board.model["panels"]
    assert "id" not in board.model  # the loaded model is not changed


def test_url_is_printed_without_credentials():
    assert grafana.safe_url("https://admin:pw@grafana.example:3000/sub") == "https://grafana.example:3000/sub"
    assert grafana.safe_url("http://grafana:3000") == "http://grafana:3000"


@pytest.mark.parametrize("status, says", [(401, "rejected the token"), (403, "lacks permission")])
def test_rejected_token_message(status, says):
    message = str(grafana.http_error(status, "invalid API key", "http://u:pw@grafana:3000"))
    assert says in message and f"HTTP {status}" in message and "GRAFANA_TOKEN" in message
    assert "pw" not in message and "grafana:3000" in message


def test_other_http_errors_carry_status_and_grafanas_message():
    message = str(grafana.http_error(500, "database is locked", "http://grafana:3000"))
    assert message == "Grafana at http://grafana:3000 answered HTTP 500: database is locked"


def test_unreachable_url_names_the_url_and_the_cause():
    """The causes as they arrive: the socket's own error, wrapped by the HTTP client."""
    url = f"http://127.0.0.1:{_closed_port()}"
    try:
        socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=2).close()
    except ConnectionRefusedError as refused:
        try:
            raise OSError("Max retries exceeded") from refused
        except OSError as wrapped:
            message = str(grafana.connection_error(wrapped, url))
    assert message == f"cannot reach Grafana at {url}: connection refused (is Grafana running on that host and port?)"
    dns = grafana.connection_error(socket.gaierror(-2, "Name or service not known"), "http://grafana.invalid:3000")
    assert "'grafana.invalid' does not resolve (DNS)" in str(dns)
    slow = grafana.connection_error(TimeoutError("timed out"), "http://10.0.0.1:3000", timeout_s=5)
    assert str(slow) == "cannot reach Grafana at http://10.0.0.1:3000: no answer within 5 s (timeout)"


def test_needs_a_token(capsys, monkeypatch):
    monkeypatch.delenv("GRAFANA_TOKEN", raising=False)
    assert cli.main(["grafana-push", "--url", "http://127.0.0.1:1"]) == 2
    assert "no Grafana token: pass --token or set GRAFANA_TOKEN" in capsys.readouterr().err


def test_install_hint_pins_the_extras_version():
    import tomllib

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    [pin] = extras["grafana"]
    assert f"'{pin}'" in grafana.INSTALL_HINT


@pytest.mark.skipif(HAVE_CLIENT, reason="grafana-client is installed here")
def test_without_the_extra_says_how_to_install_it(capsys, monkeypatch):
    monkeypatch.setenv("GRAFANA_TOKEN", TOKEN)  # read from the environment: past the token check
    assert cli.main(["grafana-push", "--url", "http://127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert "needs grafana-client" in err and "venv of its own" in err and TOKEN not in err


# --- the push, through grafana-client, against a fake Grafana ---------------------------------------

def _push(url: str, *extra: str, token: str | None = TOKEN) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = grafana.run(url, token, *(extra or (grafana.DEFAULT_FOLDER, CHART_DASHBOARDS)), out=out, err=err,
                       timeout_s=1.0)
    return code, out.getvalue(), err.getvalue()


@needs_client
def test_push_creates_the_folder_and_every_dashboard_and_overwrites_on_the_next_push():
    with FakeGrafana(TOKEN) as fake:
        code, out, err = _push(fake.url)
        assert (code, err) == (0, "")
        assert fake.folders == {"tandem": "tandem"}
        assert set(fake.dashboards) == {"tandem-slo", "tandem-pools", "tandem-kv-transfer", "tandem-router"}
        for body in fake.dashboards.values():
            assert body["folderUid"] == "tandem" and body["overwrite"] is True and body["dashboard"]["id"] is None
        assert fake.dashboards["tandem-slo"]["dashboard"] == {
            **json.loads((CHART_DASHBOARDS / "tandem-slo.json").read_text()), "id": None}
        assert all(auth == f"Bearer {TOKEN}" for _, _, auth, _ in fake.requests)
        assert f"tandem / SLO overview: {fake.url}/d/tandem-slo/x (version 1)" in out
        assert TOKEN not in out

        assert _push(fake.url)[0] == 0  # again: same folder, dashboards overwritten
        assert fake.folders == {"tandem": "tandem"}
        assert {b["version"] for b in fake.dashboards.values()} == {2}


@needs_client
def test_push_reuses_a_folder_of_that_name(tmp_path):
    with FakeGrafana(TOKEN) as fake:
        fake.folders["made-by-hand"] = "LLM serving"
        assert _push(fake.url, "LLM serving", CHART_DASHBOARDS)[0] == 0
        assert fake.folders == {"made-by-hand": "LLM serving"}
        assert {b["folderUid"] for b in fake.dashboards.values()} == {"made-by-hand"}


@needs_client
def test_token_from_the_environment(monkeypatch, capsys):
    monkeypatch.setenv("GRAFANA_TOKEN", TOKEN)
    with FakeGrafana(TOKEN) as fake:
        assert cli.main(["grafana-push", "--url", fake.url, "--folder", "ops"]) == 0
        assert fake.folders == {"ops": "ops"} and len(fake.dashboards) == 4
    assert TOKEN not in capsys.readouterr().out


@needs_client
@pytest.mark.parametrize("status, says", [
    (401, "rejected the token (HTTP 401: fake Grafana answers 401)"),
    (403, "refused the token: it lacks permission (HTTP 403: fake Grafana answers 403)"),
    (500, "answered HTTP 500: fake Grafana answers 500"),
    (404, "answered HTTP 404: fake Grafana answers 404"),
])
def test_http_errors_exit_2_with_a_clear_message(status, says):
    with FakeGrafana(TOKEN, status=status) as fake:
        code, out, err = _push(fake.url)
    assert code == 2 and err.startswith(f"grafana-push: Grafana at {fake.url} ") and says in err, err
    assert TOKEN not in out + err


@needs_client
def test_wrong_token_is_rejected_and_not_shown():
    with FakeGrafana(TOKEN) as fake:
        code, out, err = _push(fake.url, token="wrong-" + TOKEN)
    assert code == 2 and "rejected the token (HTTP 401: invalid API key)" in err
    assert TOKEN not in out + err and not fake.dashboards


@needs_client
def test_unreachable_grafana_says_which_url():
    url = f"http://127.0.0.1:{_closed_port()}"
    code, out, err = _push(url)
    assert (code, out) == (2, "")
    assert err.strip() == f"grafana-push: cannot reach Grafana at {url}: connection refused " \
                          "(is Grafana running on that host and port?)"
    code, _, err = _push("http://admin:pw@grafana.invalid:3000")
    assert code == 2 and "cannot reach Grafana at http://grafana.invalid:3000: the host name 'grafana.invalid' " \
                         "does not resolve (DNS)" in err and "pw" not in err


@needs_client
def test_silent_grafana_times_out():
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        code, _, err = _push(url)
    assert code == 2 and re.search(rf"cannot reach Grafana at {re.escape(url)}: no answer within 1 s", err), err
