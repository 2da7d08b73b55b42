"""cluster/console.py: what `tandem run` prints and what goes to its log file (no Ray started)."""

from __future__ import annotations

import inspect
import logging
import shlex
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import pytest

from cluster import console
from cluster.config import ClusterConfig
from cluster.console import (RunLog, actionable, auth_warnings, describe_deployments, for_console, key_example,
                             latest_run_log, ready_banner, run_log_path, worker_lines)

URL = "http://127.0.0.1:8000"
MODEL = "SmolLM2-135M-Instruct"


def _keys(tmp_path: Path, *keys: dict):
    cfg = ClusterConfig.model_validate({
        "model": {"path": str(tmp_path)}, "tiers": {"interactive": {}},
        "auth": {"tenants": {"acme": {"tier": "interactive"}}, "keys": list(keys)},
    })
    return cfg.auth.keys


# --- the log file ---------------------------------------------------------------------------

def test_run_logs_are_named_by_time_and_the_newest_is_found(tmp_path):
    assert latest_run_log(tmp_path / "missing") is None
    older = run_log_path(tmp_path, datetime(2026, 12, 3, 22, 30, 25))
    newer = run_log_path(tmp_path, datetime(2026, 12, 4, 9, 5, 1))
    assert older.name == "run-20261203-223025.log"
    for path in (newer, older):
        path.write_text("")
    assert latest_run_log(tmp_path) == newer


def test_worker_output_keeps_rays_prefix():
    batch = {"pid": 9907, "actor_name": "ServeReplica:tandem:interactive-decode", "ip": "127.0.0.1",
             "localhost": "127.0.0.1", "lines": ["Triton is installed, but doesn't include CPU backend."]}
    assert worker_lines(batch) == ["(ServeReplica:tandem:interactive-decode pid=9907) Triton is installed, but "
                                   "doesn't include CPU backend."]
    assert worker_lines({"pid": 7, "ip": "10.0.0.2", "localhost": "127.0.0.1", "lines": ["x"]}) == ["(pid=7, ip=10.0.0.2) x"]
    assert worker_lines({"pid": "raylet", "lines": ["killed\r"]}) == ["(raylet) killed"]


@pytest.mark.parametrize("line", [
    # today's console (loadtest/bench/results/stream-issue27.tandem.log): none of it a person acts on
    "(ServeController pid=9764) WARNING 2026-12-03 22:31:08,026 controller 9764 -- Deployment 'interactive-prefill' "
    "in application 'tandem' has 1 replicas that have taken more than 30s to initialize.",
    "(ServeController pid=9764) This may be caused by a slow __init__ or reconfigure method.",
    "(ServeReplica:tandem:Gateway pid=10087) Triton is installed, but doesn't include CPU backend. Disabling Triton.",
    "(ServeReplica:tandem:interactive-decode pid=9907) (MainProcess pid=9907) WARNING 12-03 22:32:34 [vllm.py:1703] "
    "Enforce eager set, disabling torch.compile",
    "(ServeReplica:tandem:batch-decode pid=9997) INFO 2026-12-03 22:34:57,465 tandem_batch-decode zqvd1yoq -- CALL stats OK",
    "(ServeReplica:tandem:batch-decode pid=9997) 2026-12-03 22:34:49 NIXL INFO    _api.py:405 Backend UCX was instantiated",
    "(ServeReplica:tandem:batch-decode pid=9997) Loading safetensors checkpoint shards: 100% Completed | 1/1",
    "(ServeReplica:tandem:Gateway pid=10087) Traceback (most recent call last):",
    # a vLLM traceback: its header repeated on every line; the console has its first line
    "(ServeReplica:tandem:batch-decode pid=9997) (EngineCore pid=10467) ERROR 12-03 22:34:56 [core.py:1012] "
    "Traceback (most recent call last):",
    "(ServeReplica:tandem:batch-decode pid=9997) (EngineCore pid=10467) ERROR 12-03 22:34:56 [core.py:1012]   "
    "File \"/x/core.py\", line 1003, in run_engine_core",
    "(ServeReplica:tandem:batch-decode pid=9997) (EngineCore pid=10467) ERROR 12-03 22:34:56 [core.py:1012] ",
])
def test_routine_worker_output_stays_in_the_file(line):
    assert not for_console(line)


@pytest.mark.parametrize("line", [
    "(ServeController pid=9764) ERROR 2026-12-03 22:31:08,026 controller 9764 -- Exception in Replica(id='x', "
    "deployment='batch-decode', app='tandem'), the replica will be stopped.",
    "(ServeReplica:tandem:batch-decode pid=9997) (EngineCore pid=10467) ERROR 12-03 22:34:56 [core.py:1] "
    "EngineCore failed to start.",
    "(ServeController pid=9764) WARNING 2026-12-03 22:40:00,000 controller 9764 -- Health check for Replica(id='x') "
    "failed: boom",
    "(raylet) A worker died or was killed while executing a task by an unexpected system error.",
])
def test_errors_and_failed_health_checks_reach_the_console(line):
    assert for_console(line)


def test_run_log_takes_worker_output_and_echoes_only_what_matters(tmp_path):
    echoed: list[str] = []
    log = RunLog(tmp_path / "logs" / "run.log", console=echoed.append)
    log.on_worker_output({"pid": 1, "actor_name": "ServeController", "lines": [
        "WARNING x controller -- has taken more than 30s to initialize.",
        "ERROR x controller -- Exception in Replica(id='r'), the replica will be stopped.",
        "Traceback (most recent call last):"]})
    log.close()
    assert (tmp_path / "logs" / "run.log").read_text().splitlines() == [
        "(ServeController pid=1) WARNING x controller -- has taken more than 30s to initialize.",
        "(ServeController pid=1) ERROR x controller -- Exception in Replica(id='r'), the replica will be stopped.",
        "(ServeController pid=1) Traceback (most recent call last):"]
    assert echoed == ["[tandem] (ServeController pid=1) ERROR x controller -- Exception in Replica(id='r'), "
                      "the replica will be stopped."]


def test_a_routed_logger_writes_to_the_file_and_keeps_only_errors_on_the_console(tmp_path, capsys):
    logger = logging.getLogger("tandem-test-library")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    stream = logging.StreamHandler()
    logger.addHandler(stream)
    log = RunLog(tmp_path / "run.log")
    try:
        log.route_logger(logger.name)
        logger.info('Started Serve in namespace "serve".')
        logger.error("a failure")
    finally:
        log.close()
        logger.removeHandler(stream)
    text = (tmp_path / "run.log").read_text()
    assert 'INFO tandem-test-library: Started Serve in namespace "serve".' in text and "a failure" in text
    assert capsys.readouterr().err == "a failure\n"
    assert stream.level == logging.NOTSET  # restored by close()


def test_ray_still_prints_worker_output_through_the_handler_the_run_log_replaces():
    """attach_to_ray() removes Ray's handler by name (a private one): a Ray upgrade that renames
    it would print worker output on the console again, beside the file. This catches it."""
    from ray._private import worker
    from ray._private.ray_logging import global_worker_stdstream_dispatcher

    assert f'"{console.RAY_PRINT_HANDLER}"' in inspect.getsource(worker.connect)
    assert callable(global_worker_stdstream_dispatcher.add_handler)
    assert callable(global_worker_stdstream_dispatcher.remove_handler)


# --- progress ---------------------------------------------------------------------------------

def _state(status: str, message: str = "", **replicas: int) -> SimpleNamespace:
    return SimpleNamespace(status=SimpleNamespace(value=status), message=message,
                           replica_states=replicas or {"STARTING": 1})


def test_progress_says_which_deployments_serve_and_which_are_starting():
    line = describe_deployments({"interactive-prefill": _state("UPDATING"), "batch-decode": _state("UNHEALTHY"),
                                 "interactive-decode": _state("UPSCALING", STARTING=1, RUNNING=1),
                                 "Gateway": _state("HEALTHY", RUNNING=1)})
    assert line == ("1/4 ready: Gateway; starting: interactive-prefill, batch-decode (unhealthy), "
                    "interactive-decode (upscaling, 1/2 replicas running)")
    assert describe_deployments({"Gateway": _state("HEALTHY")}) == "1/1 ready: Gateway"


def test_only_what_a_person_can_act_on_in_a_deployments_message():
    assert actionable("") is None
    assert actionable("Deployment 'x' in application 'tandem' has 1 replicas that have taken more than 30s to "
                      "initialize.\nThis may be caused by a slow __init__ or reconfigure method.") is None
    scheduled = actionable("Deployment 'x' in application 'tandem' has 1 replicas that have taken more than 30s to "
                           "be scheduled. Resources required for each replica: {'CPU': 1.0}, total resources "
                           "available: {}. Use `ray status` for more details.")
    assert scheduled is not None and "{'CPU': 1.0}" in scheduled and "\n" not in scheduled
    # The gateway needs no resources: late only because its worker starts while engines load.
    assert actionable("Deployment 'Gateway' in application 'tandem' has 1 replicas that have taken more than 30s "
                      "to be scheduled. This may be due to waiting for the cluster to auto-scale or for a runtime "
                      "environment to be installed. Resources required for each replica: {}, total resources "
                      "available: {}. Use `ray status` for more details.") is None
    assert actionable("Deployment 'x' in application 'tandem' has 1 replicas that have taken more than 30s to "
                      "be scheduled. Resources required for each replica: {'CPU': 1.0}, total resources "
                      "available: {'CPU': 2.0}. Use `ray status` for more details.") is None
    assert actionable("A replica failed to start with exception. Retrying 1 more time(s). Error:\n"
                      "ray::ServeReplica.initialize()\n  File \"a.py\", line 3\nValueError: no such model") == (
        "A replica failed to start with exception. Retrying 1 more time(s). ValueError: no such model")


# --- the ready banner ---------------------------------------------------------------------------

def _banner(key=None, warnings=()) -> str:
    return ready_banner(URL, MODEL, key=key, python=".venv/bin/python", log_file=Path(".tandem/logs/run-1.log"),
                        ray_token=Path(".tandem/ray_auth_token"), warnings=warnings)


def _commands(banner: str) -> tuple[list[str], str]:
    """The banner's curl as argv (continuation lines joined) and its python -c program."""
    text = banner.replace("\\\n", "")
    curl = next(line for line in text.splitlines() if line.strip().startswith("curl"))
    python = next(line for line in text.splitlines() if "-c" in line and "openai" in line)
    return shlex.split(curl), shlex.split(python)[2]


def test_banner_without_keys_has_working_examples_for_the_served_model():
    banner = _banner()
    curl, program = _commands(banner)
    assert curl[:2] == ["curl", f"{URL}/v1/chat/completions"] and "Authorization" not in banner
    assert f'"model": "{MODEL}"' in curl[-1]
    compile(program, "<banner>", "exec")  # the snippet is valid Python as the shell hands it over
    assert f"base_url='{URL}/v1', api_key='none'" in program and f"model='{MODEL}'" in program
    assert ".tandem/logs/run-1.log" in banner and "Warning" not in banner
    assert "!" not in banner  # an interactive bash expands "!" inside the python -c "..." (event not found)
    assert len(banner.splitlines()) < 16


@pytest.mark.parametrize("source, shell, python", [
    ({"env": "ACME_KEY"}, "Authorization: Bearer $ACME_KEY", "os.environ['ACME_KEY']"),
    ({"file": "/run/secrets/acme key"}, "Authorization: Bearer $(cat '/run/secrets/acme key')",
     "open('/run/secrets/acme key').read().strip()"),
])
def test_banner_with_keys_sends_the_key_from_its_own_source(tmp_path, source, shell, python):
    banner = _banner(key=key_example(_keys(tmp_path, {"tenant": "acme", **source})))
    curl_line = next(line for line in banner.splitlines() if line.strip().startswith("curl"))
    assert f'-H "{shell}"' in curl_line
    _, program = _commands(banner)
    compile(program, "<banner>", "exec")
    assert f"api_key={python}" in program


def test_banner_never_prints_a_plaintext_key(tmp_path):
    keys = _keys(tmp_path, {"tenant": "acme", "value": "sk-plain-0b9c8d7e6f51"})
    banner = _banner(key=key_example(keys), warnings=auth_warnings(keys, "127.0.0.1", loopback=True))
    assert "sk-plain-0b9c8d7e6f51" not in banner
    assert "export TANDEM_API_KEY=<the key of tenant 'acme' in auth.keys>" in banner
    assert "Bearer $TANDEM_API_KEY" in banner and "os.environ['TANDEM_API_KEY']" in banner
    assert banner.rstrip().splitlines()[-1].startswith("Warning: the API key of tenant 'acme' is plaintext")


def test_an_open_api_is_a_warning_only_off_loopback(tmp_path):
    assert auth_warnings((), "127.0.0.1", loopback=True) == []
    assert auth_warnings((), "0.0.0.0", loopback=False) == [
        "no API keys configured (auth.keys): the API on 0.0.0.0 is open to anyone who can reach it"]
    assert key_example(()) is None
