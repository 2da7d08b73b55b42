"""cluster/local.py run_app's wait, step by step, against a stand-in for Serve's status calls
(the real deploy path runs in tests/serve: the graph's start and a replica that never starts)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from ray import serve
from ray.serve.schema import ApplicationStatus

from cluster.local import run_app


def _app(status: ApplicationStatus, deployment_status: str = "updating", message: str = "") -> SimpleNamespace:
    state = SimpleNamespace(status=SimpleNamespace(value=deployment_status.upper()), replica_states={"STARTING": 1},
                            message=message)
    return SimpleNamespace(status=status, message="boom", deployments={"Gateway": state})


@pytest.fixture
def fake_serve(monkeypatch):
    calls = {"run": 0, "delete": [], "answers": []}

    def status():
        answer = calls["answers"].pop(0) if len(calls["answers"]) > 1 else calls["answers"][0]
        if isinstance(answer, Exception):
            raise answer
        return SimpleNamespace(applications={} if answer is None else {"app": answer})

    monkeypatch.setattr(serve, "_run", lambda *a, **kw: calls.__setitem__("run", calls["run"] + 1))
    monkeypatch.setattr(serve, "status", status)
    monkeypatch.setattr(serve, "delete", lambda name, _blocking=True: calls["delete"].append(name))
    monkeypatch.setattr(time, "sleep", lambda s: None)
    return calls


def test_it_returns_once_running_and_a_status_error_on_the_way_is_only_progress(fake_serve):
    fake_serve["answers"] = [None, RuntimeError("controller busy"), _app(ApplicationStatus.DEPLOYING),
                             _app(ApplicationStatus.RUNNING)]
    lines: list[str] = []
    run_app(object(), "app", time.monotonic() + 60, lines.append)
    assert fake_serve["run"] == 1 and fake_serve["delete"] == []
    assert [line.split(" s  ", 1)[1] for line in lines] == ["status unavailable: controller busy",
                                                          "0/1 ready; starting: Gateway"]


def test_a_failed_deploy_raises_with_serves_message(fake_serve):
    fake_serve["answers"] = [_app(ApplicationStatus.DEPLOY_FAILED)]
    with pytest.raises(RuntimeError, match="Deploying app failed: boom"):
        run_app(object(), "app", time.monotonic() + 60, lambda _: None)


def test_past_the_deadline_the_app_is_deleted_and_the_stuck_deployments_named(fake_serve):
    fake_serve["answers"] = [_app(ApplicationStatus.DEPLOYING)]
    with pytest.raises(TimeoutError, match=r"its deployments then: 0/1 ready; starting: Gateway"):
        run_app(object(), "app", time.monotonic() - 1, lambda _: None)
    assert fake_serve["delete"] == ["app"]


def test_a_redeploy_past_its_deadline_leaves_the_app_to_serve(fake_serve):
    """A redeploy (take_down_on_timeout False): the old replicas not yet replaced still serve."""
    fake_serve["answers"] = [_app(ApplicationStatus.DEPLOYING)]
    with pytest.raises(TimeoutError, match=r"not redeployed by its deadline.*starting: Gateway.*keep serving"):
        run_app(object(), "app", time.monotonic() - 1, lambda _: None, take_down_on_timeout=False)
    assert fake_serve["delete"] == []


def test_unchanged_states_are_said_again_only_every_heartbeat(fake_serve, monkeypatch):
    clock = iter(range(0, 1000, 5))  # every status poll is 5 s later (run_app reads the clock once a poll)
    monkeypatch.setattr("cluster.local.time", SimpleNamespace(monotonic=lambda: float(next(clock)), sleep=lambda s: None))
    fake_serve["answers"] = [_app(ApplicationStatus.DEPLOYING)] * 14 + [_app(ApplicationStatus.RUNNING)]
    lines: list[str] = []
    run_app(object(), "app", 10_000, lines.append, t0=0, heartbeat_s=30)
    assert len(lines) == 3  # at once, then twice 30 s later, over 14 polls of 5 s each


def test_a_replica_that_failed_to_start_is_said_once_with_its_exception(fake_serve):
    failed = ("A replica failed to start with exception. Retrying 2 more time(s). Error:\n"
              "ray::ServeReplica:tandem:Gateway.initialize_and_get_metadata()\n  File \"x.py\", line 1\n"
              "RuntimeError: Engine core initialization failed.")
    stuck = _app(ApplicationStatus.DEPLOYING, message=failed)
    fake_serve["answers"] = [stuck, stuck, _app(ApplicationStatus.RUNNING)]
    lines: list[str] = []
    run_app(object(), "app", time.monotonic() + 60, lines.append)
    assert lines.count("[tandem] Gateway: A replica failed to start with exception. Retrying 2 more time(s). "
                       "RuntimeError: Engine core initialization failed.") == 1
