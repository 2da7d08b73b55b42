"""python -m loadtest.sim validate: replay the recorded goodput runs and score the simulator."""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

from loadtest.sim import LABEL
from loadtest.sim.validate import RESULTS, replay_run, score, validation_runs

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "validation.json"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.sim", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    v = sub.add_parser("validate", help="replay loadtest/bench/results/**/goodput.json runs in the simulator")
    v.add_argument("--out", type=Path, default=DEFAULT_OUT)
    v.add_argument("--runs", nargs="*", type=Path, help="result files (default: every run with a calibration)")
    args = p.parse_args(argv)
    paths = [r.resolve() for r in args.runs] if args.runs else validation_runs()
    runs = []
    for path in paths:
        print(f"[sim] replaying {path.relative_to(RESULTS)}", file=sys.stderr, flush=True)
        runs.append(replay_run(path))
    out = {"label": LABEL, "what": "the simulator's replay of recorded CPU goodput runs, against their measurements",
           "python": platform.python_version(), "score": score(runs), "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    s = out["score"]
    print(f"{LABEL}: {s['within']}/{s['cells']} cells within max(0.15 req/s, 20%) (mean-ITL goodput), "
          f"{s['within_max_gap']}/{s['cells']} (every-gap), by system {s['within_by_system']}; ranking reproduced in "
          f"{s['ranking_reproduced']}/{s['runs_ranked']} runs (winner {s['winner_reproduced']}/{s['runs_ranked']}); reason mix within 10 points in {s['reason_mix_within']}/"
          f"{s['reason_mix_cells']} cells. Written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
