"""The compatibility corpus (tests/integration/compat_corpus/*.json) and how one entry's two
answers, tandem's and vLLM's own server's, are compared (issue 15).

Pure functions apart from `send`: the corpus is loaded and checked with pydantic, an answer
is reduced to its status, its body's shape (the set of key paths, values ignored except the
`type`/`object` tags) and its greedy "answer" (texts, tool calls, token ids, usage), and
`judge` lists what differs. tests/integration/test_compat_differential.py runs it against the
two servers; tests/support/compat_table.py renders docs/api.md's table from the same corpus.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional

import httpx
from pydantic import BaseModel, ConfigDict, model_validator

from loadtest.measure.sse import read_events

CORPUS_DIR = Path(__file__).resolve().parents[1] / "integration" / "compat_corpus"
SHAPE_DEPTH = 5
# Dicts keyed by data (token strings, token ids, routes), not by field names: one "*" key.
DYNAMIC_KEYS = ("choices[].logprobs.top_logprobs[]", "prompt_logprobs[]", "choices[].prompt_logprobs[]")
TAG_KEYS = ("type", "object")  # string values that are part of the shape
REQUEST_TIMEOUT_S = 120
MAX_LISTED = 12  # key paths listed per side in a shape difference


class Difference(BaseModel):
    """A documented way tandem answers unlike vLLM: the status class it gives instead, and why."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    tandem: Literal["2xx", "4xx"]
    reason: str


class Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str
    feature: str  # the compatibility table's row (docs/api.md)
    method: Literal["GET", "POST"]
    path: str
    body: Optional[Any] = None
    raw_body: Optional[str] = None  # sent as is, for malformed JSON
    compare: Literal["text", "shape", "status"] = "text"
    shape_depth: int = SHAPE_DEPTH
    expect_vllm: int | Literal["2xx"] = "2xx"  # what vLLM's own server answers: keeps the corpus honest
    difference: Optional[Difference] = None
    note: Optional[str] = None

    @model_validator(mode="after")
    def _one_body(self) -> "Entry":
        if self.body is not None and self.raw_body is not None:
            raise ValueError(f"{self.id}: body and raw_body are exclusive")
        if self.method == "GET" and (self.body is not None or self.raw_body is not None):
            raise ValueError(f"{self.id}: a GET has no body")
        return self

    @property
    def stream(self) -> bool:
        return isinstance(self.body, dict) and self.body.get("stream") is True


def load_corpus(directory: Path = CORPUS_DIR) -> list[Entry]:
    """Every entry of every corpus file, in file-name order; ids must be unique."""
    entries = [Entry.model_validate(raw) for path in sorted(directory.glob("*.json"))
               for raw in json.loads(path.read_text())]
    ids = [e.id for e in entries]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise ValueError(f"duplicate corpus ids: {duplicates}")
    return entries


@dataclass(frozen=True)
class Outcome:
    status: int  # 0: no HTTP answer (connection error, timeout)
    body: Any = None  # parsed JSON, or the text when it is not JSON
    events: tuple[Any, ...] = ()  # a stream's `data:` payloads, parsed
    done: bool = False  # the stream ended with `data: [DONE]`
    error: Optional[str] = None
    elapsed_s: float = 0.0

    @property
    def status_class(self) -> str:
        return f"{self.status // 100}xx" if self.status else "no answer"


def _parse(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def send(client: httpx.Client, base_url: str, entry: Entry) -> Outcome:
    """One corpus request to one server; a stream is read to its end."""
    kwargs: dict[str, Any] = {"timeout": REQUEST_TIMEOUT_S}
    if entry.raw_body is not None:
        kwargs.update(content=entry.raw_body.encode(), headers={"Content-Type": "application/json"})
    elif entry.body is not None:
        kwargs["json"] = entry.body
    t0 = time.monotonic()
    try:
        with client.stream(entry.method, base_url + entry.path, **kwargs) as response:
            if entry.stream and response.status_code == 200:
                events, done = read_events(response.iter_lines())
                return Outcome(response.status_code, events=tuple(events), done=done,
                               elapsed_s=time.monotonic() - t0)
            response.read()
            return Outcome(response.status_code, body=_parse(response.text), elapsed_s=time.monotonic() - t0)
    except httpx.HTTPError as exc:
        return Outcome(0, error=f"{type(exc).__name__}: {exc}", elapsed_s=time.monotonic() - t0)


def key_paths(value: Any, depth: int, prefix: str = "") -> set[str]:
    """The key paths of a JSON value, `a.b[].c`, down `depth` levels of objects; a `type` or
    `object` key with a string value contributes `path=value` too."""
    if depth <= 0:
        return set()
    paths: set[str] = set()
    if isinstance(value, dict):
        dynamic = prefix in DYNAMIC_KEYS
        for key, item in value.items():
            path = f"{prefix}.{'*' if dynamic else key}" if prefix else ("*" if dynamic else key)
            paths.add(path)
            if key in TAG_KEYS and isinstance(item, str):
                paths.add(f"{path}={item}")
            paths |= key_paths(item, depth - 1, path)
    elif isinstance(value, list):
        for item in value:
            paths |= key_paths(item, depth, prefix + "[]")
    return paths


def shape(entry: Entry, outcome: Outcome) -> set[str]:
    if entry.stream:
        paths = {p for event in outcome.events for p in key_paths(event, entry.shape_depth)}
        return paths | ({"[DONE]"} if outcome.done else set())
    return key_paths(outcome.body, entry.shape_depth)


def _tool_calls(calls: Any) -> list[tuple[Any, Any]]:
    return [((c.get("function") or {}).get("name"), (c.get("function") or {}).get("arguments")) for c in calls or ()]


def _usage(usage: Any) -> Any:
    if not isinstance(usage, dict):
        return None
    keys = ("prompt_tokens", "completion_tokens", "input_tokens", "output_tokens")
    return {k: usage[k] for k in keys if k in usage}


def _choices_answer(body: Any) -> Any:
    choices = []
    for choice in sorted(body.get("choices") or (), key=lambda c: c.get("index", 0)):
        message = choice.get("message")
        if message is not None:
            choices.append({"content": message.get("content"), "tool_calls": _tool_calls(message.get("tool_calls")),
                            "finish_reason": choice.get("finish_reason")})
        else:
            choices.append({"text": choice.get("text"), "finish_reason": choice.get("finish_reason")})
    return {"choices": choices, "usage": _usage(body.get("usage"))}


@dataclass
class _StreamChoice:
    text: str = ""
    tools: dict[int, list] = field(default_factory=dict)
    finish_reason: Optional[str] = None


def _stream_choices_answer(events: tuple[Any, ...]) -> Any:
    """A chat or completion stream folded into its choices: deltas concatenated per index."""
    choices: dict[int, _StreamChoice] = {}
    usage = None
    for event in events:
        if not isinstance(event, dict):
            continue
        usage = event.get("usage") or usage
        for choice in event.get("choices") or ():
            acc = choices.setdefault(choice.get("index", 0), _StreamChoice())
            delta = choice.get("delta")
            acc.text += (delta.get("content") if delta is not None else choice.get("text")) or ""
            for call in (delta or {}).get("tool_calls") or ():
                tool = acc.tools.setdefault(call.get("index", 0), [None, ""])
                function = call.get("function") or {}
                tool[0] = function.get("name") or tool[0]
                tool[1] += function.get("arguments") or ""
            acc.finish_reason = choice.get("finish_reason") or acc.finish_reason
    return {"choices": [{"text": c.text, "tool_calls": [tuple(c.tools[i]) for i in sorted(c.tools)],
                         "finish_reason": c.finish_reason} for _, c in sorted(choices.items())],
            "usage": _usage(usage)}


def _equal_but_unstreamed_tails(ours: Any, theirs: Any) -> bool:
    """Two folded streams equal but for the end of a tool call's arguments in a choice cut by
    max_tokens. At the last delta vLLM's parser appends what it parsed but never streamed of
    the last call's arguments, only when that delta itself carries a tool-call delta
    (vllm/parser/abstract_parser.py `_append_unstreamed_tool_args`): whether the tail is there
    depends on how the engine's tokens were chunked into deltas, which varies on vLLM's own
    server with load. So one side's arguments must be the other's plus such a tail."""
    if not (isinstance(ours, dict) and isinstance(theirs, dict)) or ours.get("usage") != theirs.get("usage"):
        return False
    pairs = list(zip(ours.get("choices") or (), theirs.get("choices") or ()))
    if len(pairs) != len(ours.get("choices") or ()) or len(pairs) != len(theirs.get("choices") or ()):
        return False
    for a, b in pairs:
        if {**a, "tool_calls": None} != {**b, "tool_calls": None} or len(a["tool_calls"]) != len(b["tool_calls"]):
            return False
        for (name_a, args_a), (name_b, args_b) in zip(a["tool_calls"], b["tool_calls"]):
            cut = a["finish_reason"] == "length"
            if name_a != name_b or not (args_a == args_b or cut and (args_a.startswith(args_b) or args_b.startswith(args_a))):
                return False
    return True


def _responses_output(response: Any) -> Any:
    items = []
    for item in (response or {}).get("output") or ():
        if item.get("type") == "message":
            items.append(("message", "".join(c.get("text") or "" for c in item.get("content") or ())))
        elif item.get("type") == "function_call":
            items.append(("function_call", item.get("name"), item.get("arguments")))
        else:
            items.append((item.get("type"),))
    return {"output": items, "status": (response or {}).get("status"), "usage": _usage((response or {}).get("usage"))}


def _responses_stream_answer(events: tuple[Any, ...]) -> Any:
    deltas = "".join(e.get("delta") or "" for e in events
                     if isinstance(e, dict) and e.get("type") == "response.output_text.delta")
    final = next((e.get("response") for e in reversed(events)
                  if isinstance(e, dict) and e.get("type") in ("response.completed", "response.incomplete")), None)
    return {"deltas": deltas, "final": _responses_output(final)}


def answer(entry: Entry, outcome: Outcome) -> Any:
    """What must be equal between the two servers for a greedy request, by endpoint."""
    body = outcome.body
    if entry.path == "/v1/responses":
        return _responses_stream_answer(outcome.events) if entry.stream else _responses_output(body)
    if entry.path in ("/v1/chat/completions", "/v1/completions"):
        return _stream_choices_answer(outcome.events) if entry.stream else _choices_answer(body)
    if entry.path == "/tokenize":
        return {"tokens": body.get("tokens"), "count": body.get("count")}
    if entry.path == "/detokenize":
        return {"prompt": body.get("prompt")}
    if entry.path == "/v1/models":
        return [(model.get("id"), model.get("max_model_len")) for model in body.get("data") or ()]
    return body


def _short(value: Any, limit: int = 300) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= limit else text[:limit] + "…"


def error_message(outcome: Outcome) -> Optional[str]:
    """The message of an error answer, for the report."""
    if outcome.error:
        return outcome.error
    if outcome.status < 400:
        return None
    body = outcome.body
    if isinstance(body, dict):
        err = body.get("error", body.get("detail", body))
        message = err.get("message", err) if isinstance(err, dict) else err
        return _short(message, 200)
    return _short(body, 200)


def vllm_problems(entry: Entry, vllm: Outcome) -> list[str]:
    """The corpus says what vLLM answers; when it does not, the entry (or vLLM) changed."""
    if entry.expect_vllm == "2xx":
        ok = vllm.status_class == "2xx"
    else:
        ok = vllm.status == entry.expect_vllm
    if ok:
        return []
    return [f"vLLM answered {vllm.status or vllm.error}, the corpus expects {entry.expect_vllm}: "
            f"{error_message(vllm)}"]


def judge(entry: Entry, tandem: Outcome, vllm: Outcome) -> list[str]:
    """Every way tandem's answer falls short of vLLM's for this entry; empty when it passes."""
    problems = []
    allowed = {vllm.status_class} | ({entry.difference.tandem} if entry.difference else set())
    if tandem.status_class not in allowed:
        problems.append(f"status {tandem.status or tandem.error} where vLLM answers {vllm.status}"
                        + (f" ({error_message(tandem)})" if tandem.status_class != "2xx" else ""))
    if tandem.status >= 500:
        problems.append(f"tandem answered {tandem.status}: {error_message(tandem)}")
    if problems or tandem.status_class != "2xx" or vllm.status_class != "2xx" or entry.compare == "status":
        return problems
    if entry.stream and tandem.done != vllm.done:
        problems.append(f"stream ends with [DONE]: tandem {tandem.done}, vLLM {vllm.done}")
    ours, theirs = shape(entry, tandem), shape(entry, vllm)
    if ours != theirs:
        problems.append(f"body shape: only tandem {sorted(ours - theirs)[:MAX_LISTED]}, "
                        f"only vLLM {sorted(theirs - ours)[:MAX_LISTED]}")
    if entry.compare == "text":
        ours_answer, theirs_answer = answer(entry, tandem), answer(entry, vllm)
        if ours_answer != theirs_answer and not (entry.stream and _equal_but_unstreamed_tails(ours_answer, theirs_answer)):
            problems.append(f"answer: tandem {_short(ours_answer)}, vLLM {_short(theirs_answer)}")
    return problems
