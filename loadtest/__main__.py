"""`python -m loadtest`: one command for a headless load test against a running cluster.

    python -m loadtest --host http://127.0.0.1:8000 --slo loadtest/slo/cpu-tiny.yaml \
        [--users N] [--duration S] [--tokenizer DIR] [--report-dir DIR] [--web]

Users, spawn rate and duration default to the load file's. It runs Locust on
loadtest/locustfile.py (progress every few seconds, Locust's summary at the end), writes the
report (ours plus Locust's CSV and HTML) into --report-dir, and exits 0 when the SLO is met,
1 when it is missed (the failed bounds are printed), 2 on a usage error. `--web` starts
Locust's web UI instead, with the same options filled in.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from loadtest.spec import LoadSpec

LOCUSTFILE = Path(__file__).resolve().parent / "locustfile.py"
REPO = LOCUSTFILE.parent.parent


def locust_command(args: argparse.Namespace, spec: LoadSpec) -> list[str]:
    users = args.users or spec.users
    rate = spec.spawn_rate or users
    cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--host", args.host,
           "--slo", str(args.slo), "--tokenizer", str(args.tokenizer), "--report-dir", str(args.report_dir),
           "-u", str(users), "-r", str(rate)]
    for flag, value in (("--model", args.model), ("--api-key", args.api_key)):
        if value:
            cmd += [flag, value]
    if args.web:
        return cmd
    duration = args.duration or spec.duration_s
    return cmd + ["--headless", "--only-summary", "-t", f"{max(1, round(duration))}s",
                  "--csv", str(Path(args.report_dir) / "locust"), "--html", str(Path(args.report_dir) / "locust.html"),
                  "--progress-s", str(args.progress_s)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", required=True, help="the gateway, e.g. http://127.0.0.1:8000")
    parser.add_argument("--slo", type=Path, default=REPO / "loadtest/slo/cpu-tiny.yaml", help="load file (YAML)")
    parser.add_argument("--users", type=int, default=0, help="concurrent users (default: the load file's)")
    parser.add_argument("--duration", type=float, default=0, help="seconds (default: the load file's)")
    parser.add_argument("--tokenizer", type=Path, default=REPO / ".tandem/models/SmolLM2-135M-Instruct",
                        help="folder with the served model's tokenizer.json")
    parser.add_argument("--model", default="", help="model id (default: the first in /v1/models)")
    parser.add_argument("--api-key", default="", help="one API key for every tier")
    parser.add_argument("--report-dir", type=Path, default=Path("loadtest-report"))
    parser.add_argument("--progress-s", type=float, default=5.0)
    parser.add_argument("--web", action="store_true", help="open Locust's web UI instead of a headless run")
    args = parser.parse_args(argv)
    try:
        spec = LoadSpec.load(args.slo)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.users and args.users < spec.users:
        print(f"note: {spec.name} states its SLO at {spec.users} users; at {args.users} the gate fails "
              "the user-count bound", file=sys.stderr)
    cmd = locust_command(args, spec)
    print("running:", " ".join(cmd), flush=True)
    return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(main())
