"""The real engines' own step timings under load (a goodput run with `--step-log`), read back.

A goodput run recorded with `--step-log` (loadtest/bench/goodput.py, engine_steps.py) holds, per
tandem system, the engine steps of its warm-up (requests one at a time: the unloaded engine, same
processes, same cores) and of every rate: vLLM's own execution time of each step (its iteration
details) and the prompt tokens it computed. This module makes the figures the simulator's
validation rests on from those rows (pure; no Ray, no vLLM):

- `prefill_steps(engine_rows)`: the full-budget prefill chunks of the prefill engine (steps that
  computed the whole token budget of one prompt, decoding nothing): their ms;
- `slowdown(record, system)`: per rate, the median full-chunk step under load over the unloaded
  (warm-up) median, the prefill engine's busy share (sum of step times over the span) and its
  queue, and the cores' busy and steal shares.
"""

from __future__ import annotations

import json
from pathlib import Path
from bisect import bisect_left
from statistics import median
from typing import Optional

RECORD = Path(__file__).resolve().parents[1] / "bench" / "results" / "prefill_steps" / "goodput.json"


def load(path: Path = RECORD) -> dict:
    return json.loads(path.read_text())


def _engine(steps: dict, role: str) -> list[dict]:
    """The rows of the engine whose file names its role (`<tier>-<role>-<worker>`), as dicts."""
    cols = steps["columns"]
    rows = [r for name, rs in steps["engines"].items() if name.split("-")[1] == role for r in rs]
    return [dict(zip(cols, r)) for r in rows]


def prefill_steps(rows: list[dict], budget: int) -> list[float]:
    """ms of the steps that computed one full budget of prompt tokens and decoded nothing."""
    return [r["ms"] for r in rows if r["ctx_tokens"] == budget and r["gen_reqs"] == 0]


def _phase(steps: dict, budget: int, span_s: float | None = None) -> dict:
    """`span_s`: the rate's own span (first arrival to last answer); the steps after it and the
    shares over it. (In the recordings of 2026-12-06 `engine_steps` ran on until the decider's
    counters had been read, 15-25 s past the last answer: their `per_core` shares are over that
    longer span; goodput.py now ends it with the rate.)"""
    span = span_s or steps["span_s"]
    prefill = [r for r in _engine(steps, "prefill") if r["t_s"] <= span]
    decode = [r for r in _engine(steps, "decode") if r["t_s"] <= span]
    chunks = prefill_steps(prefill, budget)
    return {"prefill_full_chunks": len(chunks),
            "prefill_chunk_ms_p50": round(median(chunks), 1) if chunks else None,
            "prefill_chunk_ms_mean": round(sum(chunks) / len(chunks), 1) if chunks else None,
            "prefill_steps": len(prefill),
            "prefill_busy_share": round(sum(r["ms"] for r in prefill) / 1000 / span, 3),
            "prefill_waiting_max": max((r["waiting"] for r in prefill), default=0),
            "decode_steps": len(decode),
            "decode_busy_share": round(sum(r["ms"] for r in decode) / 1000 / span, 3),
            "per_core": steps["per_core"], "span_s": span}


def slowdown(record: dict, system: str = "tandem-adaptive") -> dict:
    """The prefill engine's full-chunk step time per rate against its own warm-up's."""
    entry = record["systems"][system]
    budget = entry["max_num_batched_tokens"]
    unloaded = _phase(entry["warm_up_steps"], budget)
    base: Optional[float] = unloaded["prefill_chunk_ms_p50"]
    rates = {}
    for rate in entry["rates"]:
        phase = _phase(rate["engine_steps"], budget, rate["span_s"])
        ms = phase["prefill_chunk_ms_p50"]
        phase["vs_unloaded"] = round(ms / base, 3) if ms and base else None
        phase["cores_busy"] = {k: v for k, v in rate["cpu_cores"].items()
                               if k in ("machine", "steal", "other") or "interactive-prefill" in k}
        rates[str(rate["rate_rps"])] = phase
    return {"budget_tokens": budget, "unloaded": unloaded, "rates": rates,
            "calibration": record["calibration"]}


def check_cell(entry: dict, rate: dict, simulated_engines: dict[str, dict]) -> dict:
    """One replayed rate's prefill engine, measured against simulated (validate.py puts it in the
    cell): full-chunk step time (the measured one also over the warm-up's) and busy share."""
    budget = entry["max_num_batched_tokens"]
    measured = _phase(rate["engine_steps"], budget, rate["span_s"])
    unloaded = _phase(entry["warm_up_steps"], budget)["prefill_chunk_ms_mean"] if "warm_up_steps" in entry else None
    sim = next((v for k, v in simulated_engines.items() if "prefill" in k), {})
    return {"measured": {"full_chunk_ms_mean": measured["prefill_chunk_ms_mean"], "unloaded_full_chunk_ms_mean": unloaded,
                         "busy_share": measured["prefill_busy_share"]},
            "simulated": {"full_chunk_ms_mean": sim.get("full_chunk_ms_mean"), "busy_share": sim.get("busy_share")}}


def warm_up_prompt_ms(run: dict, prompt_tokens: int, budget: int) -> Optional[float]:
    """One prompt's compute on tandem's own prefill engine, unloaded: the mean full-chunk step of
    every tandem system's warm-up times the chunks the prompt takes. None without a step log.
    The replay's prompt speed where a run has one (validate.py "own-engines"), in place of the
    one-core calibration engine's TTFT (off by -21% to +26% against these, minutes apart, on the
    AVX2 host of 2026-12-07)."""
    chunk = min(budget, prompt_tokens)
    steps = [ms for entry in run["systems"].values() if entry.get("warm_up_steps")
             for ms in prefill_steps(_engine(entry["warm_up_steps"], "prefill"), chunk)]
    if not steps:
        return None
    return sum(steps) / len(steps) * -(-prompt_tokens // chunk)


def warm_up_decode_step_ms(run: dict) -> Optional[float]:
    """One stream's decode step on tandem's own decode engine, unloaded: the mean of every tandem
    system's warm-up steps that decoded one request and computed no prompt (the calibration's
    counterpart is one request's mean token gap on its plain engine). None without a step log."""
    steps = [r["ms"] for entry in run["systems"].values() if entry.get("warm_up_steps")
             for r in _engine(entry["warm_up_steps"], "decode") if r["ctx_tokens"] == 0 and r["gen_reqs"] == 1]
    return sum(steps) / len(steps) if steps else None


def _intervals(rows: list[dict]) -> list[tuple[float, float]]:
    return sorted((r["t_s"] - r["ms"] / 1000, r["t_s"]) for r in rows)  # t_s: the step's end


def _overlap(row: dict, intervals: list[tuple[float, float]], starts: list[float]) -> float:
    """The share of `row`'s step during which the other engine computed a step."""
    a, b = row["t_s"] - row["ms"] / 1000, row["t_s"]
    if b <= a:
        return 0.0
    shared, i = 0.0, bisect_left(starts, a - 60.0)  # no step lasts a minute
    while i < len(intervals) and intervals[i][0] < b:
        shared += max(0.0, min(b, intervals[i][1]) - max(a, intervals[i][0]))
        i += 1
    return shared / (b - a)


def neighbour_slowdown(run: dict) -> dict:
    """How much longer an engine's step takes while the other engine on the 2-core host computes
    one, over every tandem system and rate of a `--step-log` run: the decode engine's one-stream
    pure decode steps with the prefill engine busy for more than half of the step against those
    with it idle throughout, and the prefill engine's full chunks with the decode engine busy for
    more than 80% of the chunk against under 20%. Ratios of medians; None where a side is empty.
    (The two engines share the host's memory bandwidth and caches: each is pinned to its own
    core, yet a decode step, which streams every weight once, slows most.)"""
    dec_alone, dec_shared, pre_alone, pre_shared = [], [], [], []
    for entry in run["systems"].values():
        if not entry.get("warm_up_steps"):
            continue
        budget = entry["max_num_batched_tokens"]
        for rate in entry["rates"]:
            prefill, decode = _engine(rate["engine_steps"], "prefill"), _engine(rate["engine_steps"], "decode")
            busy_pre = _intervals([r for r in prefill if r["ctx_tokens"] > 0])
            busy_dec = _intervals(decode)
            pre_starts, dec_starts = [a for a, _ in busy_pre], [a for a, _ in busy_dec]
            for r in decode:
                if r["gen_reqs"] == 1 and r["ctx_tokens"] == 0:
                    share = _overlap(r, busy_pre, pre_starts)
                    if share > 0.5:
                        dec_shared.append(r["ms"])
                    elif share == 0.0:
                        dec_alone.append(r["ms"])
            for chunk in (r for r in prefill if r["ctx_tokens"] == budget and r["gen_reqs"] == 0):
                share = _overlap(chunk, busy_dec, dec_starts)
                if share > 0.8:
                    pre_shared.append(chunk["ms"])
                elif share < 0.2:
                    pre_alone.append(chunk["ms"])

    def ratio(shared: list[float], alone: list[float]) -> Optional[float]:
        return round(median(shared) / median(alone), 3) if shared and alone else None

    return {"decode": ratio(dec_shared, dec_alone), "decode_steps": (len(dec_shared), len(dec_alone)),
            "prefill": ratio(pre_shared, pre_alone), "prefill_chunks": (len(pre_shared), len(pre_alone))}
