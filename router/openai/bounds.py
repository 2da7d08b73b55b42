"""Bounds on what a client controls, checked at the edge before anything costly runs.

Each bound exists because something behind the edge would otherwise spend time or stack in
proportion to the input: jsonschema and pydantic recurse once per nesting level (a schema
nested ~120 levels was a RecursionError, a 500 with a 1,000-frame traceback), the structured-
output backend compiles schemas, regexes and grammars in time that grows with their size,
vLLM scans every stop string after each token, and a NUL in a regex fails inside the engine
(a decode retry) instead of here. Past a bound the client gets a 400 naming the field.
"""

from __future__ import annotations

import json
from typing import Any, Optional

MAX_JSON_DEPTH = 64  # the whole body; a legitimate schema is a few levels deep
MAX_STOP_CHARS = 1024  # per stop string
MAX_STOP_TOKEN_IDS = 128
MAX_TOOLS = 128  # OpenAI's own limit
MAX_TOOL_BYTES = 64 * 1024  # one tool's definition, serialized
MAX_SCHEMA_BYTES = 64 * 1024  # a structured-output JSON schema, serialized
MAX_REGEX_CHARS = 16 * 1024
MAX_GRAMMAR_CHARS = 64 * 1024
MAX_CHOICES = 1024
MAX_CHOICE_BYTES = 64 * 1024  # all choices together, serialized


def too_deep(value: Any, limit: int = MAX_JSON_DEPTH) -> Optional[tuple[Any, ...]]:
    """The path to the first container nested deeper than `limit` (the top value is level 1),
    or None. Iterative, so it cannot itself run out of stack."""
    stack: list[tuple[Any, int, tuple[Any, ...]]] = [(value, 1, ())]
    while stack:
        node, depth, path = stack.pop()
        if isinstance(node, dict):
            children = list(node.items())
        elif isinstance(node, list):
            children = list(enumerate(node))
        else:
            continue
        if depth > limit:
            return path
        for key, child in reversed(children):
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1, path + (key,)))
    return None


def param_of(path: tuple[Any, ...], parts: int = 2) -> Optional[str]:
    """('tools', 0, 'function', 'parameters', ...) → 'tools[0]': the field, not the
    whole way down to the offending level."""
    out = ""
    for part in path[:parts]:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or None


def check_depth(value: Any, what: str) -> None:
    """ValueError when `value` (e.g. a JSON schema given as a string) nests too deeply."""
    if too_deep(value) is not None:
        raise ValueError(f"{what} is nested deeper than {MAX_JSON_DEPTH} levels")


def has_nul(value: Any) -> bool:
    """A NUL character in any string (keys included) of a decoded JSON value."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            if "\x00" in node:
                return True
        elif isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


def check_size(value: Any, limit: int, what: str) -> None:
    """ValueError when `value` serialized as JSON (or a string's UTF-8) exceeds `limit` bytes."""
    size = len(value.encode("utf-8")) if isinstance(value, str) else len(json.dumps(value).encode("utf-8"))
    if size > limit:
        raise ValueError(f"{what} is {size} bytes; the limit is {limit}")


def check_text(value: str, limit: int, what: str) -> None:
    """A constraint given as text (regex, grammar): bounded, and no NUL (the engine's compilers
    take C strings: a NUL there is an engine error, not a 400)."""
    if "\x00" in value:
        raise ValueError(f"{what} must not contain a NUL character")
    if len(value) > limit:
        raise ValueError(f"{what} is {len(value)} characters; the limit is {limit}")


# Fields vLLM's request models (0.32) read in their "before" validators, ahead of pydantic's
# type check: a value of another JSON type raises AttributeError/TypeError inside vLLM, a 500
# from its own server (`"structured_outputs": false`, `"messages": 1`, responses' `"tools": 1`).
_READ_BEFORE_TYPE_CHECK = {"structured_outputs": (dict, "an object"), "messages": (list, "an array"),
                           "tools": (list, "an array")}


def body_bound_error(body: Any) -> Optional[tuple[str, str]]:
    """(param, message) for the first bound a generation body breaks, or None. What vLLM
    itself checks (types, ranges, logprobs limits) is left to vLLM, except the types of the
    fields it reads before checking them."""
    if not isinstance(body, dict):
        return None
    for param, (kind, name) in _READ_BEFORE_TYPE_CHECK.items():
        if body.get(param) is not None and not isinstance(body[param], kind):
            return param, f"'{param}' must be {name}, got {type(body[param]).__name__}."
    stop = body.get("stop")
    for item in stop if isinstance(stop, list) else [stop]:
        if isinstance(item, str) and len(item) > MAX_STOP_CHARS:
            return "stop", f"A stop sequence is at most {MAX_STOP_CHARS} characters."
    ids = body.get("stop_token_ids")
    if isinstance(ids, list) and len(ids) > MAX_STOP_TOKEN_IDS:
        return "stop_token_ids", f"At most {MAX_STOP_TOKEN_IDS} stop token ids are allowed."
    tools = body.get("tools")
    if isinstance(tools, list):
        if len(tools) > MAX_TOOLS:
            return "tools", f"At most {MAX_TOOLS} tools are allowed; got {len(tools)}."
        for i, tool in enumerate(tools):
            try:
                check_size(tool, MAX_TOOL_BYTES, f"tools[{i}]")
            except ValueError as exc:
                return f"tools[{i}]", f"{exc}."
    constraints = [("structured_outputs", body.get("structured_outputs")), ("response_format", body.get("response_format"))]
    for param, spec in constraints:
        if not isinstance(spec, dict):
            continue
        if has_nul(spec):
            return param, f"'{param}' must not contain a NUL character."
        for key, limit in (("regex", MAX_REGEX_CHARS), ("grammar", MAX_GRAMMAR_CHARS)):
            if isinstance(spec.get(key), str) and len(spec[key]) > limit:
                return f"{param}.{key}", f"'{param}.{key}' is at most {limit} characters."
        for key in ("json", "json_schema"):
            if key in spec:
                try:
                    check_size(spec[key], MAX_SCHEMA_BYTES, f"{param}.{key}")
                    if isinstance(spec[key], str):
                        check_depth(json.loads(spec[key]), f"{param}.{key}")
                except RecursionError:
                    return f"{param}.{key}", f"'{param}.{key}' is nested deeper than {MAX_JSON_DEPTH} levels."
                except ValueError as exc:
                    return f"{param}.{key}", f"{exc}."
        choice = spec.get("choice")
        if isinstance(choice, list):
            if len(choice) > MAX_CHOICES:
                return f"{param}.choice", f"At most {MAX_CHOICES} choices are allowed."
            try:
                check_size(choice, MAX_CHOICE_BYTES, f"{param}.choice")
            except ValueError as exc:
                return f"{param}.choice", f"{exc}."
    return None
