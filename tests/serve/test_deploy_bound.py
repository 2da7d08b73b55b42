"""Starting an app is bounded: a replica whose start never ends (as a vLLM engine whose NIXL
listener died does) fails the start with the stuck deployment named, instead of holding
`tandem run` (or a test session) forever; and the app is taken down, nothing left behind.
It runs while the session's graph deploys (conftest.py `serve_session`): taking the stuck app
down leaves that one deploying."""

from __future__ import annotations

import time

import pytest
from ray import serve

from cluster.local import run_app


@serve.deployment(ray_actor_options={"num_cpus": 0}, graceful_shutdown_timeout_s=1)
class NeverReady:
    def __init__(self):
        time.sleep(3600)


def test_a_replica_that_never_starts_fails_the_start_by_its_deadline_and_is_removed(serve_session):
    lines: list[str] = []
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="NeverReady"):
        run_app(NeverReady.bind(), "never-ready", started + 6, progress=lines.append, route_prefix=None)
    assert time.monotonic() - started < 60
    deadline = time.monotonic() + 30
    while "never-ready" in serve.status().applications and time.monotonic() < deadline:
        time.sleep(0.5)
    assert "never-ready" not in serve.status().applications
    # The session's graph is untouched. Its deploy may not be submitted yet (build_app imports
    # vLLM's server in a thread while Serve starts, and Serve without an HTTP proxy starts
    # sooner than that): wait for it to be listed, then it must not be failing or going away.
    deadline = time.monotonic() + 120
    while "tandem" not in serve.status().applications and time.monotonic() < deadline:
        time.sleep(0.5)
    status = serve.status().applications.get("tandem")
    assert status is not None and status.status.value not in ("DEPLOY_FAILED", "DELETING", "UNHEALTHY")
