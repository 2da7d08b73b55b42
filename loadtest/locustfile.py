"""The locustfile: `locust -f loadtest/locustfile.py --host URL --slo FILE` (web UI), or
headless through `python -m loadtest`. Adds tandem's options to Locust's command line (and
its web UI), makes the run's shared state at test_start, prints progress, writes the report
at test_stop and sets the exit code at quitting: non-zero when the SLO was missed.

Single process only: the samples the gate reads live in this process (no --processes,
no --master/--worker).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import gevent
from locust import events

from loadtest.report import write_report
from loadtest.run import RunState
from loadtest.measure.slo import passed
from loadtest.users import TandemUser  # noqa: F401  (Locust runs the User classes it finds here)

REPO = Path(__file__).resolve().parent.parent
log = logging.getLogger("loadtest")


@events.init_command_line_parser.add_listener
def _options(parser: Any) -> None:
    group = parser  # Locust's own parser: an argument group would not take include_in_web_ui
    group.add_argument("--slo", default=str(REPO / "loadtest/slo/cpu-tiny.yaml"), include_in_web_ui=True,
                       help="load file: workload, user count and the SLO to gate on")
    group.add_argument("--tokenizer", default=str(REPO / ".tandem/models/SmolLM2-135M-Instruct"),
                       include_in_web_ui=True, help="folder with the served model's tokenizer.json")
    group.add_argument("--model", default="", include_in_web_ui=True, help="model id (default: the first in /v1/models)")
    group.add_argument("--api-key", default="", help="one API key for every tier (overrides the load file's api_keys)")
    group.add_argument("--report-dir", default="loadtest-report", include_in_web_ui=True, help="where the report goes")
    group.add_argument("--progress-s", type=float, default=5.0, help="seconds between progress lines (0 = none)")


@events.test_start.add_listener
def _start(environment: Any, **_: Any) -> None:
    environment.tandem = None
    try:
        state = RunState.create(environment.parsed_options, environment.host or "")
    except (ValueError, RuntimeError) as exc:
        log.error("%s", exc)
        if environment.parsed_options.headless:
            environment.process_exit_code = 2  # a usage error, not a missed SLO
            environment.runner.quit()
        else:
            gevent.spawn(environment.runner.stop)  # the web UI stays up to fix the options
        return
    environment.tandem = state
    environment.tandem_verdicts = None
    print(f"load file {state.spec.name}: stated at {state.spec.users} users; model {state.model}", flush=True)
    gevent.spawn(_watch, environment, state)


def _watch(environment: Any, state: RunState) -> None:
    """Track the peak user count every second; print a progress line every --progress-s."""
    every = environment.parsed_options.progress_s
    tick = 0
    while getattr(environment, "tandem", None) is state:
        gevent.sleep(1.0)
        tick += 1
        line = state.progress_line(environment.runner.user_count)
        if every > 0 and tick % max(1, round(every)) == 0:
            print(line, flush=True)


@events.test_stop.add_listener
def _stop(environment: Any, **_: Any) -> None:
    state: RunState | None = getattr(environment, "tandem", None)
    if state is None:
        return
    environment.tandem = None  # stops the watcher
    verdicts = state.verdicts()
    environment.tandem_verdicts = verdicts
    page = write_report(state.report_dir, f"tandem load test: {state.spec.name}", state.samples,
                        state.spec.slo, verdicts, notes=[f"model {state.model}, peak users {state.peak_users}"])
    print("\n".join(["", "SLO check:", *("  " + v.line() for v in verdicts),
                     f"SLO {'PASSED' if passed(verdicts) else 'FAILED'}; report: {page}"]), flush=True)


@events.quitting.add_listener
def _quitting(environment: Any, **_: Any) -> None:
    verdicts = getattr(environment, "tandem_verdicts", None)
    if verdicts is not None:
        environment.process_exit_code = 0 if passed(verdicts) else 1
