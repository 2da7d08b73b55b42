"""vLLM's console logging, without vLLM's own set-up.

Why: building an engine or its config (AsyncLLM, EngineArgs.create_engine_config: vLLM's
`configure_logging_if_needed`) applies vLLM's logging with `logging.config.dictConfig`, and a
non-incremental dictConfig first closes every handler in the process. In a Serve replica (the
gateway builds a config too) that comes after Serve has set up the replica's log file (ray/serve/_private/logging_utils.py: a
MemoryHandler in front of a RotatingFileHandler); closed, the MemoryHandler loses its target and
every later record of the replica, the gateway's access log included, silently goes nowhere.
So tandem's processes run with VLLM_CONFIGURE_LOGGING=0 (cluster/local.py for local clusters, the
chart's environment on Kubernetes), and the vLLM plugin (cluster/vllm_plugin.py) gives the
"vllm" logger the one handler vLLM would have given it: its level, its stream, a line per record.
"""

from __future__ import annotations

import logging
import os
import sys

ENV_FLAG = "VLLM_CONFIGURE_LOGGING"
_FORMAT = "%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s"
_DATE_FORMAT = "%m-%d %H:%M:%S"


class _VllmConsole(logging.StreamHandler):
    """Marks the handler this module adds, so adding it twice is a no-op."""


def configure_vllm_logger() -> None:
    """Give the "vllm" logger a console handler at VLLM_LOGGING_LEVEL, once per process; a no-op
    where vLLM configured its own logging (VLLM_CONFIGURE_LOGGING not 0)."""
    if os.environ.get(ENV_FLAG) != "0":
        return
    logger = logging.getLogger("vllm")
    if any(isinstance(h, _VllmConsole) for h in logger.handlers):
        return
    level = os.environ.get("VLLM_LOGGING_LEVEL", "INFO").upper()
    # vLLM's default stream is stdout (VLLM_LOGGING_STREAM).
    handler = _VllmConsole(sys.stderr if os.environ.get("VLLM_LOGGING_STREAM") == "ext://sys.stderr" else sys.stdout)
    handler.setFormatter(logging.Formatter(_FORMAT, _DATE_FORMAT))
    handler.setLevel(level)
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
