"""Workloads: what each simulated user sends. Seeded, exact in tokens, no Locust, no I/O
(except reading a trace file).

Every request is a list of prompt token ids for `/v1/completions` (the gateway accepts token
ids), so prompt lengths are exact by construction; `ignore_eos` makes output lengths exact.
Token ids come from the model's own tokenizer (`Vocab`), so the server sees real tokens.

Kinds (weights pick one per request, from a per-user seeded RNG):
  chat       short prompt, medium answer
  agent      a long system prompt + tool schema shared by every user (prefix-cache friendly),
             then `turns` user turns; each turn's prompt is the whole conversation so far,
             including the tokens the server generated (fed back with `observe`)
  summarize  long prompt, short answer
  batch      long answers, sent with the batch tier's API key
A trace (JSONL of arrival time, prompt tokens, output tokens) replaces the mix: see `Trace`.

Call order per user: `Mix.next()` -> send -> `Mix.observe(output_ids)` -> `Mix.next()` ...
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Protocol, Sequence

from pydantic import BaseModel, ConfigDict, Field, model_validator

# A small but real tool schema, so agent prompts look like what agents send.
TOOLS = [
    {"type": "function", "function": {
        "name": "search_docs", "description": "Search the internal documentation.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string"}, "top_k": {"type": "integer", "default": 5}},
            "required": ["query"]}}},
    {"type": "function", "function": {
        "name": "run_sql", "description": "Run a read-only SQL query on the analytics DB.",
        "parameters": {"type": "object", "properties": {"sql": {"type": "string"}},
                       "required": ["sql"]}}},
]


class Vocab(Protocol):
    """What a workload needs from a tokenizer."""

    def ids(self) -> Sequence[int]:
        """Ordinary (non-special) token ids to draw filler text from."""

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, without special tokens."""


class Shape(BaseModel):
    """One single-turn kind. `spread` varies each length uniformly by +-spread (0 = fixed)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    weight: float = Field(1.0, ge=0)
    prompt_tokens: int = Field(ge=1)
    output_tokens: int = Field(ge=1)
    spread: float = Field(0.0, ge=0, lt=1)
    tier: str = "interactive"


class AgentShape(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    weight: float = Field(1.0, ge=0)
    system_tokens: int = Field(ge=1, description="shared system prompt + tool schema")
    turn_tokens: int = Field(ge=1, description="each new user message")
    turns: int = Field(3, ge=1)
    output_tokens: int = Field(ge=1)
    tier: str = "interactive"


class TraceSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    path: Path
    time_scale: float = Field(1.0, gt=0, description="multiplies arrival times (0.5 = twice as fast)")
    tier: str = "interactive"


class WorkloadSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int = 0
    chat: Optional[Shape] = None
    agent: Optional[AgentShape] = None
    summarize: Optional[Shape] = None
    batch: Optional[Shape] = None
    trace: Optional[TraceSpec] = None

    @model_validator(mode="after")
    def _one_source(self) -> "WorkloadSpec":
        kinds = [k for k in KINDS if getattr(self, k) is not None and getattr(self, k).weight > 0]
        if self.trace is not None and kinds:
            raise ValueError("workload: give either a trace or a mix of kinds, not both")
        if self.trace is None and not kinds:
            raise ValueError(f"workload: give at least one of {', '.join(KINDS)} with weight > 0, or a trace")
        return self


KINDS = ("chat", "agent", "summarize", "batch")


@dataclass(frozen=True)
class Request:
    """One request to send: exact prompt ids, exact output length, the tier (API key)."""

    workload: str
    prompt_ids: tuple[int, ...]
    output_tokens: int
    tier: str


def filler(rng: random.Random, vocab: Sequence[int], n: int) -> tuple[int, ...]:
    return tuple(rng.choice(vocab) for _ in range(n))


def _vary(rng: random.Random, n: int, spread: float) -> int:
    return max(1, round(n * rng.uniform(1 - spread, 1 + spread))) if spread else n


def agent_prefix(spec: AgentShape, vocab: Vocab, seed: int) -> tuple[int, ...]:
    """The shared system prompt: the tool schema's real tokens after seeded filler,
    exactly `system_tokens` long, identical for every user of a run."""
    tools = vocab.encode("\nTools:\n" + json.dumps(TOOLS))[: spec.system_tokens]
    rng = random.Random(f"{seed}:agent-system")
    return filler(rng, vocab.ids(), spec.system_tokens - len(tools)) + tuple(tools)


class Mix:
    """A per-user stream of requests drawn by weight. Same (spec, vocab, seed, user) -> same
    sequence, whatever the other users do; agent turns also depend on what was observed."""

    def __init__(self, spec: WorkloadSpec, vocab: Vocab, user: int) -> None:
        self.spec = spec
        self.vocab = vocab.ids()
        self.rng = random.Random(f"{spec.seed}:user:{user}")
        self.kinds = [k for k in KINDS if getattr(spec, k) is not None and getattr(spec, k).weight > 0]
        self.weights = [getattr(spec, k).weight for k in self.kinds]
        self.prefix = agent_prefix(spec.agent, vocab, spec.seed) if spec.agent else ()
        self.conversation: tuple[int, ...] = ()
        self.turn = 0
        self.pending: Optional[Request] = None

    def next(self) -> Request:
        kind = self.rng.choices(self.kinds, self.weights)[0]
        if kind == "agent":
            req = self._agent_turn()
        else:
            shape: Shape = getattr(self.spec, kind)
            prompt = filler(self.rng, self.vocab, _vary(self.rng, shape.prompt_tokens, shape.spread))
            req = Request(kind, prompt, _vary(self.rng, shape.output_tokens, shape.spread), shape.tier)
        self.pending = req
        return req

    def _agent_turn(self) -> Request:
        spec = self.spec.agent
        assert spec is not None
        if self.turn == 0:
            self.conversation = self.prefix
        user_msg = filler(self.rng, self.vocab, spec.turn_tokens)
        self.turn = (self.turn + 1) % spec.turns
        return Request("agent", self.conversation + user_msg, spec.output_tokens, spec.tier)

    def observe(self, output_ids: Sequence[int]) -> None:
        """The answer to the last request; an agent conversation continues with it. Without
        ids (the server did not return them) seeded filler of the same length stands in."""
        req, self.pending = self.pending, None
        if req is None or req.workload != "agent" or self.turn == 0:
            return
        answer = tuple(output_ids) or filler(self.rng, self.vocab, req.output_tokens)
        self.conversation = req.prompt_ids + answer


# ---- trace replay ------------------------------------------------------------------------


@dataclass(frozen=True)
class TraceEntry:
    arrival_s: float
    prompt_tokens: int
    output_tokens: int


def _field(obj: dict, names: Sequence[str], where: str) -> float:
    for name in names:
        if name in obj:
            value = obj[name]
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{where}: {name} must be a non-negative number, got {value!r}")
            return float(value)
    raise ValueError(f"{where}: missing {' or '.join(names)}")


def parse_trace(lines: Sequence[str], source: str = "trace") -> list[TraceEntry]:
    """JSONL, one request a line: {"arrival_s", "prompt_tokens", "output_tokens"}; Mooncake's
    names ({"timestamp" in ms, "input_length", "output_length"}) are read too. Sorted by
    arrival, shifted so the first arrives at 0. Blank lines are skipped."""
    entries: list[TraceEntry] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{source} line {n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: not JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{where}: expected a JSON object")
        arrival = (_field(obj, ["arrival_s"], where) if "arrival_s" in obj
                   else _field(obj, ["timestamp"], where) / 1000.0)
        prompt = int(_field(obj, ["prompt_tokens", "input_length"], where))
        output = int(_field(obj, ["output_tokens", "output_length"], where))
        if prompt < 1 or output < 1:
            raise ValueError(f"{where}: prompt and output tokens must be at least 1")
        entries.append(TraceEntry(arrival, prompt, output))
    if not entries:
        raise ValueError(f"{source}: no requests in the trace")
    entries.sort(key=lambda e: e.arrival_s)
    t0 = entries[0].arrival_s
    return [TraceEntry(e.arrival_s - t0, e.prompt_tokens, e.output_tokens) for e in entries]


class Trace:
    """A trace shared by all users of a run: each free user takes the next entry and waits
    for its arrival time, so the load is open-loop as long as enough users are free (the
    report shows how late requests started if not). Loops, shifted by the trace's length."""

    def __init__(self, spec: TraceSpec, entries: Sequence[TraceEntry], vocab: Vocab, seed: int) -> None:
        self.spec = spec
        self.entries = list(entries)
        self.vocab = vocab.ids()
        self.seed = seed
        self.taken = 0
        self.period = self.entries[-1].arrival_s + (self.entries[-1].arrival_s / max(1, len(self.entries) - 1))

    @classmethod
    def load(cls, spec: TraceSpec, vocab: Vocab, seed: int) -> "Trace":
        return cls(spec, parse_trace(spec.path.read_text().splitlines(), str(spec.path)), vocab, seed)

    def take(self) -> tuple[float, Request]:
        """The next request and when it is due (seconds after the run started)."""
        i, self.taken = self.taken, self.taken + 1
        lap, k = divmod(i, len(self.entries))
        entry = self.entries[k]
        rng = random.Random(f"{self.seed}:trace:{i}")
        req = Request("trace", filler(rng, self.vocab, entry.prompt_tokens), entry.output_tokens, self.spec.tier)
        return (lap * self.period + entry.arrival_s) * self.spec.time_scale, req
