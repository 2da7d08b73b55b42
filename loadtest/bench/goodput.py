"""Goodput of tandem against aggregated serving, side by side in one run, on the same machine and
the same cores. Writes JSON and a PNG plot.

    make bench-rayllm   # once: Ray Serve LLM's dependencies, for the rayllm-pd system
    flock /tmp/tandem-cluster.lock .venv/bin/python -m loadtest.bench.goodput [--mix both] [--rates 0.5,1,1.5,2]

Systems (loadtest/bench/goodput_systems.py), each started afresh and given the same two cores
(or two GPUs): tandem adaptive, tandem always-disaggregated, two colocated vLLM engines at each
max_num_batched_tokens of a sweep (chunked prefill tuned: the best is the baseline), one engine
on all cores, and Ray Serve LLM's own P/D. Every engine gets the same model, dtype,
max_num_seqs and KV cache per core.

Objectives are calibrated on this machine first (loadtest/bench/goodput_judge.py): multiples
of one engine's unloaded TTFT (a prefill-heavy request alone) and step time (a decode-heavy
request's mean token gap alone), printed and written to the JSON. Goodput counts requests that
meet TTFT + mean ITL, and separately TTFT + every token gap (no stall). Workload
(loadtest/bench/workload.py): a seeded Poisson mix of prefill-heavy and decode-heavy streaming
/v1/completions requests, open loop, the same trace per rate for every system; `--mix` picks
prefill-heavy only, decode-heavy only or both (`--prefill-share`, default 70/30). `--step-log`
also records every tandem engine step as vLLM times it (the simulator's validation reads them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

import psutil

from cluster.hardware import cpu_flags, engine_dtype
from loadtest.bench.goodput_judge import Multiples, Objectives, Unloaded, best_of_sweep, verdict
from loadtest.bench.goodput_plot import plot
from loadtest.bench import procs
from loadtest.bench.decisions import delta, fetch, settled
from loadtest.bench.engine_steps import EngineSteps
from loadtest.bench.goodput_systems import NAMES, TANDEM_METRICS_URL, System, one_core_engine, serving, systems_of
from loadtest.bench.loadgen import replay
from loadtest.bench.workload import (Mix, RequestKind, ScheduledRequest, kinds_in_turn, poisson_schedule, summarize,
                                     warm_up_requests)

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = ROOT / ".tandem" / "models" / "SmolLM2-135M-Instruct"
RESULTS = Path(__file__).resolve().parent / "results"
MIXES = {"prefill-heavy": 1.0, "decode-heavy": 0.0}  # "both": --prefill-share


def log(line: str) -> None:
    print(line, flush=True)


def on_gpu() -> bool:
    """Two GPUs: each engine gets one (the single engine both, tensor-parallel). None: CPU cores."""
    try:
        import torch

        count = torch.cuda.device_count()
    except ImportError:
        return False
    if count == 1:
        raise SystemExit("goodput compares systems on the same two devices; this machine has one GPU. "
                         "Run it where two GPUs are visible (CUDA_VISIBLE_DEVICES), or hide the GPU for a CPU run.")
    return count >= 2


def _one_at_a_time(urls: list[str], model: str, requests: list[ScheduledRequest]) -> list:
    records = []
    for req in requests:
        got, _ = asyncio.run(replay(urls, model, [req], 120, lambda _: None, "one at a time"))
        if got[0].error:
            raise RuntimeError(f"request {req.kind} failed on {urls}: {got[0].error}")
        records += got
    return records


def warm_up(urls: list[str], model: str, mix: Mix) -> None:
    """Two requests of each kind per server, one at a time: first-call costs (NIXL handshake,
    allocator growth) stay out of the measurement."""
    for n, url in enumerate(urls):
        _one_at_a_time([url], model, warm_up_requests(mix, n))


def calibrate(args, gpu: bool, mix: Mix) -> tuple[Unloaded, Objectives]:
    """One plain engine on one core, unloaded: the TTFT of each prefill-heavy request and the
    mean token gap of each decode-heavy one (three of each, medians) set the objectives."""
    with one_core_engine(args, gpu) as engine:
        warm_up(engine.urls, args.model.name, mix)
        records = _one_at_a_time(engine.urls, args.model.name, kinds_in_turn(mix, 3, 1000))
    unloaded = Unloaded.of([r.ttft_ms for r in records if r.workload == mix.prefill_heavy.name],
                           [r.mean_itl_ms for r in records if r.workload == mix.decode_heavy.name])
    return unloaded, Objectives.calibrated(unloaded, Multiples(args.ttft_x, args.itl_x, args.gap_x))


def serve_rates(name: str, urls: list[str], args, mix: Mix, objectives: Objectives, cores: int,
                decisions: Optional[Callable[[], dict[str, float]]] = None,
                steps: Optional[EngineSteps] = None) -> list[dict]:
    """Each rate in turn; with `decisions` (tandem), the P/D decider's verdicts per rate too;
    with `steps` (tandem, --step-log), every engine step of the rate."""
    out = []
    counted = settled(decisions) if decisions else {}  # the warm-up's verdicts first, counted in no rate
    for rate in args.rates:
        schedule = poisson_schedule(mix, rate, args.duration, args.seed)
        log(f"[goodput] {name} at {rate} req/s: {len(schedule)} requests over {args.duration:.0f} s")
        if steps:
            steps.begin()
        before, machine_before, t0 = procs.snapshot(), psutil.cpu_times(), time.monotonic()
        records, span = asyncio.run(replay(urls, args.model.name, schedule, args.drain_timeout, log,
                                           f"{name} @ {rate}/s"))
        cpu = cores_by_process(before, procs.snapshot(), machine_before, psutil.cpu_times(), time.monotonic() - t0)
        engine_steps = {"engine_steps": steps.end()} if steps else {}  # over the same span as `cpu`
        summary = summarize(records, objectives.mean, args.duration, span, cores)
        no_stall = summarize(records, objectives.every_gap, args.duration, span, cores)
        summary["goodput_rps_max_gap"] = no_stall["goodput_rps"]
        summary["met_slo_max_gap"] = no_stall["met_slo"]
        log(f"[goodput] {name} at {rate} req/s: goodput {summary['goodput_rps']} req/s "
            f"({summary['met_slo']}/{summary['requests']} met TTFT + mean ITL, {summary['errors']} errors; "
            f"{summary['goodput_rps_max_gap']} with every gap bounded), "
            f"TTFT p50 {summary['ttft'].get('p50_ms')} ms p99 {summary['ttft'].get('p99_ms')} ms, "
            f"mean ITL p50 {summary['mean_itl'].get('p50_ms')} ms p99 {summary['mean_itl'].get('p99_ms')} ms")
        errors = sorted({r.error for r in records if r.error})
        time.sleep(2)  # the engines finish aborting what the drain cut off; the counters reach the port
        verdicts = None
        if decisions:
            now = settled(decisions)
            verdicts, counted = delta(counted, now), now
            log(f"[goodput] {name} at {rate} req/s: the decider's verdicts {verdicts}")
        log(f"[goodput] {name} at {rate} req/s: cores busy {cpu}")
        out.append({"rate_rps": rate, "offered_rps": round(len(schedule) / args.duration, 3), **summary,
                    "error_kinds": errors[:5], "pd_decisions": verdicts, "cpu_cores": cpu,
                    **engine_steps,
                    "records": [{"kind": r.workload, "ttft_ms": _round(r.ttft_ms, 1),
                                 "mean_itl_ms": _round(r.mean_itl_ms, 2), "max_gap_ms": round(r.max_gap_ms, 1),
                                 "tokens": r.output_tokens, "error": r.error or None} for r in records]})
    return out


def cores_by_process(before, after, machine_before, machine_after, seconds: float) -> dict[str, float]:
    """Where the cores' time went while a rate ran: the mean cores busy per process kind and
    pool (loadtest/bench/procs.py), this benchmark's own load generator as "client", the whole
    machine as "machine" (what exited meanwhile included) and "steal" (the hypervisor's)."""
    me = os.getpid()
    spent = procs.by_process(procs.cpu_delta(before, after, [pid for pid in after if pid != me]))
    mine = after.get(me)
    spent["client"] = mine.cpu_s - before[me].cpu_s if mine and me in before else 0.0
    spent["machine"], spent["steal"] = procs.machine_busy_s(machine_before, machine_after)
    span = max(seconds, 1e-9)
    return {k: round(v / span, 3) for k, v in sorted(spent.items(), key=lambda kv: -kv[1]) if v / span >= 0.005}


def _round(v, digits: int):
    return None if v is None else round(v, digits)


def run_system(system: System, args, mix: Mix, objectives: Objectives, gpu: bool) -> dict:
    """One system's rates; a system that cannot start here is recorded with its reason."""
    t0 = time.monotonic()
    try:
        with serving(system, args, gpu, objectives.every_gap, log) as urls:  # tandem: all three bounds
            cold = round(time.monotonic() - t0, 1)
            steps = args.step_log if system.kind == "tandem" else None
            if steps:
                steps.begin()
            warm_up(urls, args.model.name, mix)
            # The warm-up's requests run one at a time: the engines' unloaded steps, same processes.
            unloaded = {"warm_up_steps": steps.end()} if steps else {}
            verdicts = (lambda: fetch(TANDEM_METRICS_URL)) if system.kind == "tandem" else None
            rates = serve_rates(system.name, urls, args, mix, objectives, cores=2, decisions=verdicts, steps=steps)
    except Exception as exc:  # noqa: BLE001 - the run goes on with the other systems
        reason = f"{type(exc).__name__}: {exc}"[:3000]
        log(f"[goodput] {system.name} could not run here: {reason}")
        return {"error": reason}
    return {"cold_start_s": cold, "max_num_batched_tokens": system.max_num_batched_tokens or args.max_num_batched_tokens,
            **unloaded, "rates": rates}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="checkpoint folder (any vLLM model)")
    p.add_argument("--dtype", default="auto", help="auto: as tandem decides it on this host (cluster/hardware.py), "
                                                  "for every system alike")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--systems", default=",".join(NAMES), help=f"subset of {','.join(NAMES)}")
    p.add_argument("--colocated-mbt", default="256,2048",
                   help="the colocated engines' max_num_batched_tokens sweep (chunked-prefill budget)")
    p.add_argument("--rates", default="0.25,0.5,1,1.5,2", help="offered loads in requests/s")
    p.add_argument("--duration", type=float, default=40.0, help="arrival window per rate (s)")
    p.add_argument("--drain-timeout", type=float, default=30.0, help="wait after the last arrival (s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mix", choices=("both", *MIXES), default="both")
    p.add_argument("--prefill-share", type=float, default=0.7, help="with --mix both: share of prefill-heavy requests")
    p.add_argument("--long-prompt", type=int, default=512, help="prompt tokens of a prefill-heavy request")
    p.add_argument("--long-output", type=int, default=8)
    p.add_argument("--short-prompt", type=int, default=64, help="prompt tokens of a decode-heavy request")
    p.add_argument("--short-output", type=int, default=128)
    p.add_argument("--ttft-x", type=float, default=Multiples.ttft, help="TTFT objective: x unloaded TTFT")
    p.add_argument("--itl-x", type=float, default=Multiples.itl, help="mean ITL objective: x unloaded step time")
    p.add_argument("--gap-x", type=float, default=Multiples.gap, help="every-gap objective: x unloaded step time")
    p.add_argument("--kv-cache-mib", type=int, default=256, help="per engine (per core)")
    p.add_argument("--max-num-seqs", type=int, default=32)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048, help="tandem's, Ray Serve LLM's, single's")
    p.add_argument("--engine-niceness", type=int, default=None,
                   help="tandem's engines' cpu_niceness (engine config); default: the config's")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--step-log", action="store_true",
                   help="record tandem's engine steps (vLLM's own step timings) per rate and for the warm-up "
                        "in the JSON (loadtest/bench/engine_steps.py)")
    p.add_argument("--replot", action="store_true", help="only redraw goodput.png from goodput.json in --out")
    args = p.parse_args(argv)
    args.rates = [float(r) for r in args.rates.split(",")]
    args.colocated_mbt = [int(n) for n in args.colocated_mbt.split(",") if n]
    try:
        args.systems = systems_of([s for s in args.systems.split(",") if s], args.colocated_mbt)
    except ValueError as exc:
        p.error(str(exc))
    if not (args.model / "config.json").exists() and not args.replot:
        p.error(f"no model at {args.model}; run `tandem prepare-model` or pass --model PATH")
    args.model = args.model.resolve()
    args.step_log = EngineSteps(Path(tempfile.mkdtemp(prefix="tandem-steps-"))) if args.step_log and not args.replot else None
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.replot:
        plot(json.loads((args.out / "goodput.json").read_text()), args.out / "goodput.png")
        log(f"wrote {args.out / 'goodput.png'}")
        return 0
    gpu = on_gpu()
    args.dtype = engine_dtype(args.dtype, gpu, cpu_flags())  # one concrete dtype for every system
    share = MIXES.get(args.mix, args.prefill_share)
    mix = Mix(RequestKind("prefill-heavy", args.long_prompt, args.long_output),
              RequestKind("decode-heavy", args.short_prompt, args.short_output), share)
    log("[goodput] calibrating the objectives: one engine, one core, unloaded")
    unloaded, objectives = calibrate(args, gpu, mix)
    log(f"[goodput] unloaded: TTFT {unloaded.ttft_ms:.0f} ms (prefill-heavy), step {unloaded.step_ms:.1f} ms "
        f"(decode-heavy) → objectives TTFT <= {objectives.mean.ttft_ms:.0f} ms, mean ITL <= "
        f"{objectives.mean.mean_itl_ms:.0f} ms, every gap <= {objectives.every_gap.max_gap_ms:.0f} ms")
    result = {
        "benchmark": "goodput",
        "command": " ".join(["python -m loadtest.bench.goodput", *(argv if argv is not None else sys.argv[1:])]),
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                    "avx512_bf16": "avx512_bf16" in cpu_flags(), "amx_bf16": "amx_bf16" in cpu_flags(),
                    "memory_gib": round(psutil.virtual_memory().total / (1 << 30), 1), "gpu": gpu},
        "model": args.model.name, "dtype": args.dtype,
        "engines": {"max_num_seqs": args.max_num_seqs, "max_num_batched_tokens": args.max_num_batched_tokens,
                    "colocated_sweep": args.colocated_mbt, "kv_cache_mib_per_core": args.kv_cache_mib,
                    "enforce_eager": True},
        "workload": {"mix": args.mix, "prefill_share": share, "rates_rps": args.rates, "duration_s": args.duration,
                     "drain_timeout_s": args.drain_timeout, "seed": args.seed,
                     "kinds": {"prefill-heavy": [args.long_prompt, args.long_output],
                               "decode-heavy": [args.short_prompt, args.short_output]},
                     "api": "/v1/completions, streaming, random token-id prompts, ignore_eos"},
        "calibration": {"unloaded_ttft_ms": round(unloaded.ttft_ms, 1), "unloaded_step_ms": round(unloaded.step_ms, 2),
                        "multiples": {"ttft": args.ttft_x, "mean_itl": args.itl_x, "every_gap": args.gap_x},
                        "objectives": objectives.describe()},
        "systems": {},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "goodput.json"
    for system in args.systems:
        log(f"[goodput] === {system.name} ===")
        result["systems"][system.name] = run_system(system, args, mix, objectives, gpu)
        result["verdict"] = verdict(result["systems"])
        result["colocated_sweep_best"] = best_of_sweep(result["systems"])
        path.write_text(json.dumps(result, indent=1))  # after each system: a crash keeps what ran
    plot(result, args.out / "goodput.png")
    log(json.dumps({k: v for k, v in result["verdict"].items() if k != "baselines"}, indent=1)[:4000])
    log(f"wrote {path} and {args.out / 'goodput.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
