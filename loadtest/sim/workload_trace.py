"""`tandem plan --workload TRACE`: a request trace replayed as the offered load, instead of the
seeded Poisson mix. The trace is input; every run on it is still SIMULATED.

The format: JSON Lines, one request per line, in arrival order (blank lines are skipped). Its
three required fields are those of the load tests' trace (loadtest/workloads.py `parse_trace`,
`python -m loadtest`), so one file drives both; the prefix fields are the simulator's own:

    {"arrival_s": 0.00, "prompt_tokens": 2048, "output_tokens": 64}
    {"arrival_s": 0.13, "prompt_tokens": 900, "output_tokens": 200, "prefix_group": "chat", "prefix_tokens": 512}

- `arrival_s`: the arrival, seconds from the trace's start (>= 0, never going back in time);
- `prompt_tokens`, `output_tokens`: >= 1; the output length is exact, as the goodput benchmark
  asks for it (ignore_eos with a fixed max_tokens);
- `prefix_group` + `prefix_tokens`, both or neither: the prompt's first `prefix_tokens` tokens
  are the group's shared prefix (the same token ids in every request of the group; a longer
  one extends a shorter one, as a conversation grows), so the prefix cache and the KV-aware
  router see real reuse; the rest of the prompt is the request's own.

Token ids are drawn from the seed: only their equality matters here (block hashes), so the same
trace and seed give the same runs. `--rates` are replay speeds of the trace's own rate (1: as
written; 2: every arrival at half its time); the arrival window, which goodput is divided by,
is the last arrival's time over the speed.

The goodput benchmark's goodput.json is recognised and refused with what to run instead: its
per-request records carry kind, ttft_ms, mean_itl_ms, max_gap_ms, tokens and error, but no
arrival time and no prompt length; its load was the seeded mix, which `--workload mix` replays.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from loadtest.bench.workload import ScheduledRequest

KIND = "trace"  # the records' workload name (loadtest/measure/record.py), one for every request
VOCAB = (1000, 40000)  # poisson_schedule's token-id range
FIELDS = {"arrival_s", "prompt_tokens", "output_tokens", "prefix_group", "prefix_tokens"}
# Llama-3.1's context (the models the step tables cover): a longer request no engine would take,
# and the bound keeps a typo (a million-token prompt) from filling memory with token ids.
MAX_REQUEST_TOKENS = 131_072


class TraceError(ValueError):
    """A trace the simulator cannot replay; the message names the file and line."""


@dataclass(frozen=True)
class TraceRequest:
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    prefix_group: Optional[str] = None
    prefix_tokens: int = 0


@dataclass(frozen=True)
class Load:
    """One offered load: the schedule of a run and the window its goodput is divided by."""

    rate_rps: float  # requests over the window
    duration_s: float  # the arrival window
    schedule: list[ScheduledRequest]
    speed: Optional[float] = None  # a trace's replay speed; None: the mix's Poisson rate


@dataclass(frozen=True)
class WorkloadTrace:
    path: str
    requests: tuple[TraceRequest, ...]

    @property
    def span_s(self) -> float:
        return self.requests[-1].arrival_s

    @property
    def rate_rps(self) -> float:
        return len(self.requests) / self.span_s

    def load(self, speed: float, seed: int) -> Load:
        if not speed > 0:
            raise ValueError(f"a trace's replay speed must be positive, got {speed}")
        rng = random.Random(f"{seed}:trace")
        shared: dict[str, tuple[int, ...]] = {}
        for r in self.requests:  # each group's prefix as long as its longest use, drawn in first-seen order
            if r.prefix_group is not None:
                have = shared.get(r.prefix_group, ())
                if r.prefix_tokens > len(have):
                    shared[r.prefix_group] = have + tuple(rng.randrange(*VOCAB) for _ in range(r.prefix_tokens - len(have)))
        schedule = []
        for i, r in enumerate(self.requests):
            head = shared.get(r.prefix_group, ())[:r.prefix_tokens]  # no group (None) or a 0-token prefix: ()
            own = tuple(rng.randrange(*VOCAB) for _ in range(r.prompt_tokens - len(head)))
            schedule.append(ScheduledRequest(i, r.arrival_s / speed, KIND, head + own, r.output_tokens))
        window = self.span_s / speed
        return Load(round(len(schedule) / window, 3), window, schedule, speed)

    def kinds(self) -> list[tuple[float, int, int]]:
        """(share, prompt tokens, output tokens) per distinct size: plan_sizing.capacity_rps's input."""
        counts: dict[tuple[int, int], int] = {}
        for r in self.requests:
            counts[(r.prompt_tokens, r.output_tokens)] = counts.get((r.prompt_tokens, r.output_tokens), 0) + 1
        return [(n / len(self.requests), p, o) for (p, o), n in sorted(counts.items())]

    def describe(self) -> dict:
        prompt = sum(r.prompt_tokens for r in self.requests)
        return {"path": self.path, "requests": len(self.requests), "span_s": self.span_s,
                "rate_rps": round(self.rate_rps, 4), "prompt_tokens": prompt,
                "output_tokens": sum(r.output_tokens for r in self.requests),
                "prefix_groups": len({r.prefix_group for r in self.requests if r.prefix_group is not None}),
                "shared_prefix_share": round(sum(r.prefix_tokens for r in self.requests) / prompt, 4)}


def _count(line: dict, key: str, where: str, least: int) -> int:
    v = line[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < least:
        raise TraceError(f"{where}: {key} must be an integer >= {least}, got {v!r}")
    return v


def parse_line(text: str, where: str, after_s: float) -> TraceRequest:
    try:
        line = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{where}: not JSON ({exc.msg})") from None
    if not isinstance(line, dict):
        raise TraceError(f"{where}: a request is a JSON object, got {type(line).__name__}")
    unknown = sorted(set(line) - FIELDS)
    missing = sorted({"arrival_s", "prompt_tokens", "output_tokens"} - set(line))
    if unknown or missing:
        raise TraceError(f"{where}: " + "; ".join(
            ([f"unknown field(s) {', '.join(unknown)}"] if unknown else []) +
            ([f"missing {', '.join(missing)}"] if missing else [])) + f" (fields: {', '.join(sorted(FIELDS))})")
    at = line["arrival_s"]
    if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at) or at < 0:
        raise TraceError(f"{where}: arrival_s must be a finite number of seconds >= 0, got {at!r}")
    if at < after_s:
        raise TraceError(f"{where}: arrival_s {at} is before the previous request's {after_s}: the trace must be in "
                         "arrival order")
    prompt, output = _count(line, "prompt_tokens", where, 1), _count(line, "output_tokens", where, 1)
    if prompt + output > MAX_REQUEST_TOKENS:
        raise TraceError(f"{where}: prompt_tokens + output_tokens is {prompt + output}, past the {MAX_REQUEST_TOKENS} "
                         "tokens of Llama-3.1's context")
    if ("prefix_group" in line) != ("prefix_tokens" in line):
        raise TraceError(f"{where}: prefix_group and prefix_tokens go together (both or neither)")
    if "prefix_group" not in line:
        return TraceRequest(float(at), prompt, output)
    group = line["prefix_group"]
    if not isinstance(group, str) or not group:
        raise TraceError(f"{where}: prefix_group must be a non-empty string, got {group!r}")
    shared = _count(line, "prefix_tokens", where, 0)
    if shared > prompt:
        raise TraceError(f"{where}: prefix_tokens {shared} exceeds prompt_tokens {prompt}")
    return TraceRequest(float(at), prompt, output, group, shared)


def _goodput_record(text: str, path: Path) -> Optional[str]:
    """What to run instead, if `text` is the goodput benchmark's result file."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not (isinstance(doc, dict) and doc.get("benchmark") == "goodput" and isinstance(doc.get("workload"), dict)):
        return None
    wl = doc["workload"]
    try:
        (lp, lo), (sp, so) = wl["kinds"]["prefill-heavy"], wl["kinds"]["decode-heavy"]
        flags = (f"--workload mix --long {lp}:{lo} --short {sp}:{so} --prefill-share {wl['prefill_share']} "
                 f"--rates {','.join(f'{r:g}' for r in wl['rates_rps'])} --duration {wl['duration_s']:g} --seed {wl['seed']}")
    except (KeyError, TypeError, ValueError):
        flags = "--workload mix with its workload's kinds, prefill_share, rates, duration and seed"
    return (f"{path}: the goodput benchmark's result, not a trace: its per-request records carry kind, ttft_ms, "
            f"mean_itl_ms, max_gap_ms, tokens and error, but no arrival time and no prompt length. Its offered load "
            f"was the seeded mix (loadtest/bench/workload.py poisson_schedule), which this replays exactly: {flags}")


def read_trace(path: Path) -> WorkloadTrace:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"--workload {path}: cannot read it ({exc})") from None
    instead = _goodput_record(text, path)
    if instead:
        raise TraceError(instead)
    requests: list[TraceRequest] = []
    for n, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            requests.append(parse_line(line, f"{path}:{n}", requests[-1].arrival_s if requests else 0.0))
    if not requests:
        raise TraceError(f"{path}: no requests (one JSON object a line)")
    if requests[-1].arrival_s <= 0:
        raise TraceError(f"{path}: every arrival is at 0 s: goodput is per second of arrivals, so a trace must "
                         "span some time")
    return WorkloadTrace(str(path), tuple(requests))
