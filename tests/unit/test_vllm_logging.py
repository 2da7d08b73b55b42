"""vLLM's logging set-up must not close the handlers of the process it is imported into (Serve's
replica log file: cluster/vllm_logging.py), and vLLM's warnings still reach the console."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from cluster import vllm_logging
from cluster.local import LOCAL_RAY_ENV
from tests.conftest import REPO

# A MemoryHandler in front of a stream, as Serve sets up a replica's log file; then vLLM
# applies its logging config as AsyncLLM and EngineArgs.create_engine_config do in the replica
# (configure_logging_if_needed), then a record is logged: does it still arrive?
_PROBE = """
import logging, logging.handlers, sys
out = logging.StreamHandler(sys.stdout)
buffered = logging.handlers.MemoryHandler(capacity=1, target=out)
log = logging.getLogger("ray.serve")
log.addHandler(buffered); log.setLevel(logging.INFO); log.propagate = False
from vllm.config.logging import LoggingConfig
from vllm.logger import configure_logging_if_needed
configure_logging_if_needed(LoggingConfig())
log.info("probe-line")
"""


def _probe(configure: str) -> str:
    env = {**os.environ, vllm_logging.ENV_FLAG: configure}
    done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=300, env=env,
                          cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_with_vllms_logging_left_alone_serves_replica_log_survives_an_engines_set_up() -> None:
    assert "probe-line" in _probe("0")
    assert LOCAL_RAY_ENV[vllm_logging.ENV_FLAG] == "0"
    chart = (REPO / "deploy/helm/tandem/templates/_helpers.tpl").read_text()
    assert f"name: {vllm_logging.ENV_FLAG}\n  value: \"0\"" in chart


def test_vllms_own_set_up_still_closes_other_handlers() -> None:
    """The seam: when an upgrade stops vLLM's logging set-up from closing handlers, this fails, and
    VLLM_CONFIGURE_LOGGING=0 with cluster/vllm_logging.py can go."""
    assert "probe-line" not in _probe("1"), (
        "vLLM's configure_logging no longer closes other handlers: cluster/vllm_logging.py, its flag in cluster/local.py "
        "and the chart's tandem.env are no longer needed")


@pytest.fixture
def vllm_logger():
    logger = logging.getLogger("vllm")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield logger
    logger.handlers[:], logger.level, logger.propagate = saved[0], saved[1], saved[2]


def test_the_plugin_gives_vllm_one_console_handler_at_its_level(vllm_logger, monkeypatch) -> None:
    monkeypatch.setenv(vllm_logging.ENV_FLAG, "0")
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "WARNING")
    vllm_logging.configure_vllm_logger()
    vllm_logging.configure_vllm_logger()
    added = [h for h in vllm_logger.handlers if isinstance(h, vllm_logging._VllmConsole)]
    assert len(added) == 1 and added[0].level == logging.WARNING
    assert vllm_logger.level == logging.WARNING and vllm_logger.propagate is False


def test_where_vllm_configured_itself_the_plugin_adds_nothing(vllm_logger, monkeypatch) -> None:
    monkeypatch.setenv(vllm_logging.ENV_FLAG, "1")
    before = list(vllm_logger.handlers)
    vllm_logging.configure_vllm_logger()
    assert vllm_logger.handlers == before
