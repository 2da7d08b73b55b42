"""How much one more running stream slows a CPU engine's decode step, on this host: the
goodput benchmark's calibration engine (one plain vLLM engine on one core, the same model,
dtype and settings) decodes N streams together, for each N of --batches, and each stream's mean
token gap is the step at batch N. Writes JSON and a PNG.

    flock /tmp/tandem-cluster.lock .venv/bin/python -m loadtest.bench.decode_slope [--batches 1,2,4,8,16]

Why: the simulator's CPU step model (loadtest/sim/step_time.py CpuFitted) grows the decode step
by a share of the one-stream step per running stream. Its earlier share, 1/35, was the router
cost model's prior (+1 ms on a 35 ms step); a float32 engine on an AVX2-only core computes each
stream's weights pass itself, so the share is host-class dependent. The fit here is the step
against N by least squares; `per_stream_share` = slope / (intercept + slope): the extra per
stream as a share of the one-stream step, what the simulator reads (setups.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
from pathlib import Path
from statistics import median

import psutil

from cluster.hardware import cpu_flags, engine_dtype
from loadtest.bench.goodput import DEFAULT_MODEL, RESULTS, log, parse_args as goodput_args, warm_up
from loadtest.bench.goodput_systems import one_core_engine
from loadtest.bench.loadgen import replay
from loadtest.bench.workload import Mix, RequestKind, ScheduledRequest


def together(n: int, prompt_tokens: int, output_tokens: int, first: int) -> list[ScheduledRequest]:
    """n requests arriving at once, each with its own prompt (no prefix shared between them)."""
    starts = [1000 + (97 * (first + i)) % 30_000 for i in range(n)]  # within the vocabulary of any Llama-like model
    return [ScheduledRequest(first + i, 0.0, "decode", tuple(range(start, start + prompt_tokens)), output_tokens)
            for i, start in enumerate(starts)]


def fit(points: list[tuple[int, float]]) -> dict:
    """Least squares step_ms = intercept + slope * streams, and the per-stream share."""
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    intercept = my - slope * mx
    return {"intercept_ms": round(intercept, 2), "slope_ms_per_stream": round(slope, 2),
            "per_stream_share": round(slope / (intercept + slope), 4)}


def measure(urls: list[str], model: str, batches: list[int], repeats: int, prompt_tokens: int,
            output_tokens: int) -> list[dict]:
    rows = []
    for n in batches:
        gaps = []
        for r in range(repeats):
            records, _ = asyncio.run(replay(urls, model, together(n, prompt_tokens, output_tokens, 10_000 * (r + 1) + 100 * n),
                                            300, lambda _: None, f"{n} streams"))
            failed = [rec.error for rec in records if rec.error]
            if failed:
                raise RuntimeError(f"{n} streams: {failed[0]}")
            gaps.append(median(rec.mean_itl_ms for rec in records))
        rows.append({"streams": n, "mean_itl_ms_per_repeat": [round(g, 2) for g in gaps], "step_ms": round(median(gaps), 2)})
        log(f"[decode_slope] {n} streams: mean token gap {rows[-1]['step_ms']:.1f} ms (repeats {rows[-1]['mean_itl_ms_per_repeat']})")
    return rows


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [r["streams"] for r in result["rows"]]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(xs, [r["step_ms"] for r in result["rows"]], "o", label="measured (median of repeats)")
    f = result["fit"]
    ax.plot(xs, [f["intercept_ms"] + f["slope_ms_per_stream"] * x for x in xs], "-",
            label=f"fit: {f['intercept_ms']:.1f} + {f['slope_ms_per_stream']:.2f} ms/stream")
    prior = result["prior_share"] * (f["intercept_ms"] + f["slope_ms_per_stream"])
    ax.plot(xs, [f["intercept_ms"] + f["slope_ms_per_stream"] - prior + prior * x for x in xs], "--",
            label=f"the earlier share 1/35 from the same one-stream step")
    ax.set_xlabel("streams decoding together")
    ax.set_ylabel("decode step (mean token gap), ms")
    ax.set_title(f"{result['model']} {result['dtype']}, one core ({result['machine']['host_class']})", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    p.add_argument("--batches", default="1,2,4,8,16", help="streams decoding together, one measurement each")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--prompt-tokens", type=int, default=64, help="the goodput benchmark's decode-heavy prompt")
    p.add_argument("--output-tokens", type=int, default=128, help="the goodput benchmark's decode-heavy output")
    p.add_argument("--out", type=Path, default=RESULTS / "decode_slope.json")
    args = p.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    if len(set(batches)) < 2 or min(batches) < 1:
        p.error("--batches needs at least two different stream counts, each >= 1")
    # The calibration engine exactly as the goodput benchmark starts it (its defaults).
    engine_args = goodput_args(["--model", str(args.model)])
    engine_args.dtype = engine_dtype(engine_args.dtype, False, cpu_flags())
    flags = cpu_flags()
    host_class = "AMX" if "amx_bf16" in flags else ("AVX-512 BF16" if "avx512_bf16" in flags else "AVX2")
    mix = Mix(RequestKind("prefill-heavy", 512, 8), RequestKind("decode-heavy", args.prompt_tokens, args.output_tokens), 0.5)
    log(f"[decode_slope] one engine, one core, {engine_args.dtype}; streams {batches}, {args.repeats} repeats each")
    with one_core_engine(engine_args, False) as engine:
        warm_up(engine.urls, engine_args.model.name, mix)
        rows = measure(engine.urls, engine_args.model.name, batches, args.repeats, args.prompt_tokens, args.output_tokens)
    result = {"benchmark": "decode_slope",
              "command": " ".join(["python -m loadtest.bench.decode_slope", *(argv if argv is not None else sys.argv[1:])]),
              "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                          "host_class": host_class, "memory_gib": round(psutil.virtual_memory().total / (1 << 30), 1)},
              "model": engine_args.model.name, "dtype": engine_args.dtype,
              "engine": {"max_num_seqs": engine_args.max_num_seqs, "max_num_batched_tokens": engine_args.max_num_batched_tokens,
                         "kv_cache_mib": engine_args.kv_cache_mib, "enforce_eager": True, "cores": 1},
              "workload": {"prompt_tokens": args.prompt_tokens, "output_tokens": args.output_tokens,
                           "api": "/v1/completions, streaming, all streams sent at once, ignore_eos"},
              "rows": rows, "fit": fit([(r["streams"], r["step_ms"]) for r in rows]), "prior_share": round(1 / 35, 4)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    plot(result, args.out.with_suffix(".png"))
    log(f"[decode_slope] fit {result['fit']}; wrote {args.out} and {args.out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
