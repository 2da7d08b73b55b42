"""python -m loadtest.sim validate: replay the recorded goodput runs and score the simulator.
python -m loadtest.sim validate-gpu: the GPU engine model against AIConfigurator's measured rows.
python -m loadtest.sim matrix: issue 32's simulated GPU matrix and the decider rules that never fired."""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

from loadtest.sim import LABEL
from loadtest.sim.validate import RESULTS, SPEEDS, replay_run, score, validation_runs

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "validation.json"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.sim", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    v = sub.add_parser("validate", help="replay loadtest/bench/results/**/goodput.json runs in the simulator")
    v.add_argument("--out", type=Path, default=DEFAULT_OUT)
    v.add_argument("--runs", nargs="*", type=Path, help="result files (default: every run with a calibration)")
    v.add_argument("--speed", choices=SPEEDS, default=SPEEDS[0],
                   help="the prompt speed replayed: own-engines, the run's own tandem prefill engine's unloaded "
                        "warm-up steps where it was recorded with --step-log, else its calibration engine's; "
                        "calibration, the calibration engine's always")
    g = sub.add_parser("validate-gpu", help="the GPU engine model against AIConfigurator's measured vLLM samples")
    g.add_argument("--out", type=Path, default=DEFAULT_OUT.with_name("validation-gpu.json"))
    g.add_argument("--max-osl", type=int, help="only rows with at most this many output tokens (quick runs)")
    g.add_argument("--max-concurrency", type=int, help="only rows with at most this many clients (quick runs)")
    g.add_argument("--arrivals", choices=("spread", "lockstep"), default="spread",
                   help="clients' phases spread by a warm-up (the model), or all starting together (a sensitivity)")
    m = sub.add_parser("matrix", help="adaptive vs colocated vs always on 8/16/64 H200, 70B/8B, two mixes (SIMULATED)")
    from loadtest.sim.matrix import add_arguments

    add_arguments(m)
    args = p.parse_args(argv)
    if args.command == "validate-gpu":
        return _validate_gpu(args)
    if args.command == "matrix":
        from loadtest.sim.matrix import main as matrix

        return matrix(args)
    paths = [r.resolve() for r in args.runs] if args.runs else validation_runs()
    runs = []
    for path in paths:
        print(f"[sim] replaying {path.relative_to(RESULTS)}", file=sys.stderr, flush=True)
        runs.append(replay_run(path, speed=args.speed))
    from loadtest.sim.repeats import repeats
    from loadtest.sim.validate import machine_class, within

    measured_again = repeats({p: json.loads(p.read_text()) for p in paths}, machine_class, within, RESULTS)
    out = {"label": LABEL, "what": "the simulator's replay of recorded CPU goodput runs, against their measurements",
           "prefill_speed": args.speed,
           "python": platform.python_version(), "score": {**score(runs), "measured_repeats": measured_again},
           "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    from loadtest.sim.validate_plot import plot

    picture = plot(out, args.out.with_suffix(".png"))
    s = out["score"]
    print(f"{LABEL}: {s['within']}/{s['cells']} cells within max(0.15 req/s, 20%) (mean-ITL goodput), "
          f"{s['within_max_gap']}/{s['cells']} (every-gap), by system {s['within_by_system']}, by host {s['within_by_machine']}; ranking reproduced in "
          f"{s['ranking_reproduced']}/{s['runs_ranked']} runs (winner {s['winner_reproduced']}/{s['runs_ranked']}); reason mix within 10 points in {s['reason_mix_within']}/"
          f"{s['reason_mix_cells']} cells; measured cells recorded twice agree within the same bar in "
          f"{measured_again['within']}/{measured_again['pairs']} pairs. Written {args.out}" + (f" and {picture}" if picture else ""))
    if own := s["own_engines"]:
        print(f"{LABEL}, the {own['runs']} runs replayed at their own engines' speed: {own['within']}/{own['cells']} cells "
              f"within (every-gap {own['within_max_gap']}); ranking {own['ranking_reproduced']}/{own['runs_ranked']} strict, "
              f"{own['ranking_reproduced_at_tolerance']}/{own['runs_ranked']} at the bar's tolerance; reason mix "
              f"{own['reason_mix_within']}/{own['reason_mix_cells']} cells, {own['reason_mix_pooled_within']} pooled per run and system")
    return 0


def _validate_gpu(args: argparse.Namespace) -> int:
    from loadtest.sim.validate_gpu import validate

    out = validate(max_osl=args.max_osl, max_concurrency=args.max_concurrency, arrivals=args.arrivals)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    for name, s in out["score"].items():
        if name == "by_concurrency":
            continue
        print(f"{LABEL} {name}: {s['simulated']}/{s['rows']} rows; TPOT median error {s['tpot_median_err']:.1%} "
              f"(bar 15%: {'met' if s['tpot_bar_met'] else 'NOT met'}), TTFT {s['ttft_median_err']:.1%} "
              f"(bar 25%: {'met' if s['ttft_bar_met'] else 'NOT met'})")
    for name, s in out["aic_own_estimate"]["score"].items():
        print(f"(reference, not held out) AIConfigurator's own estimate, {name}: TPOT {s['tpot_median_err']:.1%}, "
              f"TTFT {s['ttft_median_err']:.1%}")
    print(f"Written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
