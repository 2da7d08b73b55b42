"""Tool calling at the edge, with vLLM's own parser classes (`model.tool_parser`).

Lifecycle and call order, per gateway: `ToolCalling(tool_parser, tokenizer)` once (an
unknown parser name fails here, at start, naming `model.tool_parser`). Per request that
`calls_tools()`: `prepare(req)` → a `ToolRequest` holding vLLM's view of the request and
the decoding constraint (for tool_choice "required" or a named function, vLLM constrains
the output to the tools' JSON schema, exactly as `vllm serve` does); after generation,
`parse(tool_request, text)` → (content, tool_calls) in OpenAI's shape.

"auto" uses the configured parser's own format (e.g. hermes' <tool_call> tags) and is
unconstrained: whether a call comes out depends on the model. Streams that may call tools
are buffered and sent as one delta at the end (tool-call arguments are not streamed).
vLLM is imported only here, lazily, so the rest of the edge stays importable without it.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Optional

from pydantic import ValidationError

from cluster.protocol import StructuredOutput
from router.openai.errors import bad_request
from router.openai.protocol import ChatCompletionRequest
from router.openai.responses import ToolResult


@dataclass(frozen=True)
class ToolRequest:
    vllm_request: Any  # vLLM's ChatCompletionRequest after the parser's adjust_request
    structured: Optional[StructuredOutput]
    parallel: bool


class ToolCalling:
    def __init__(self, tool_parser: Optional[str], tokenizer: Any, compact_json: bool = False) -> None:
        """`compact_json`: the engines run with json_disable_whitespace; vLLM 0.32 does not
        apply that to the structural tags of forced tool calls, so it is applied here."""
        self.name = tool_parser
        self._tokenizer = tokenizer
        self._compact_json = compact_json
        self._parser_cls = None
        if tool_parser is not None:
            from vllm.parser.parser_manager import ParserManager
            from vllm.tool_parsers import ToolParserManager

            known = sorted(ToolParserManager.list_registered())
            if tool_parser not in known:
                raise ValueError(f"model.tool_parser: unknown vLLM tool parser {tool_parser!r}; one of {known}")
            self._parser_cls = ParserManager.get_parser(tool_parser_name=tool_parser, enable_auto_tools=True)

    @classmethod
    def from_config(cls, cfg: Any, tokenizer: Any) -> "ToolCalling":
        """The model's parser; compact JSON when every decode pool generates compact JSON."""
        compact = all(t.decode.engine.json_disable_whitespace for t in cfg.tiers.values())
        return cls(cfg.model.tool_parser, tokenizer, compact_json=compact)

    def prepare(self, req: ChatCompletionRequest) -> ToolRequest:
        if self._parser_cls is None:
            raise bad_request(
                "This model has no tool parser configured (model.tool_parser in the cluster YAML), so it "
                "cannot call tools; leave out 'tools' or set 'tool_choice' to \"none\".",
                "tools", "tool_parser_missing",
            )
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest as VllmChatRequest

        body = req.model_dump(include={"model", "tools", "tool_choice", "parallel_tool_calls"}, exclude_none=True,
                              by_alias=True)
        try:
            vreq = VllmChatRequest.model_validate({**body, "messages": [m.for_template() for m in req.messages]})
        except ValidationError as exc:  # our models should have caught it; still the request's fault
            raise bad_request(f"The tool-calling request is not valid: {exc.errors()[0].get('msg', exc)}",
                              "messages") from None
        vreq = self._new_parser(vreq).adjust_request(vreq)
        structured = None
        so = vreq.structured_outputs
        if so is not None and so.structural_tag is not None:  # the parser's own call format
            tag = _limit_whitespace(json.loads(so.structural_tag)) if self._compact_json else json.loads(so.structural_tag)
            structured = StructuredOutput("structural_tag", json.dumps(tag))
        elif so is not None and so.json is not None:  # generic JSON list of calls
            structured = StructuredOutput("json", so.json if isinstance(so.json, str) else json.dumps(so.json))
        return ToolRequest(vreq, structured, parallel=req.parallel_tool_calls is not False)

    def parse(self, tool_request: ToolRequest, text: str) -> tuple[Optional[str], list[dict[str, Any]]]:
        """The message's content (None when only tools were called) and its tool_calls."""
        vreq = tool_request.vllm_request
        _, content, calls = self._new_parser(vreq).parse(text, vreq, enable_auto_tools=True)
        calls = list(calls or [])
        if not tool_request.parallel:
            calls = calls[:1]
        tool_calls = [
            {"id": call.id or f"call_{uuid.uuid4().hex[:24]}", "type": "function",
             "function": {"name": call.name, "arguments": call.arguments}}
            for call in calls
        ]
        return (content or None) if tool_calls else (content or ""), tool_calls

    def _new_parser(self, vreq: Any) -> Any:
        # vLLM parsers keep per-request state: one instance per use, as vLLM's server does.
        assert self._parser_cls is not None
        return self._parser_cls(self._tokenizer, vreq.tools)


def _limit_whitespace(node: Any) -> Any:
    """At most one whitespace character between JSON tokens of the tool-call arguments
    (xgrammar's smallest limit; unlimited whitespace lets a weak model pad forever)."""
    if isinstance(node, dict):
        return {k: (1 if k == "max_whitespace_cnt" and v is None else _limit_whitespace(v)) for k, v in node.items()}
    if isinstance(node, list):
        return [_limit_whitespace(v) for v in node]
    return node


def tool_result(tools: ToolCalling, tool_request: ToolRequest, acc: Any) -> ToolResult:
    """Parse a finished answer (an Accumulator). OpenAI's finish reason is "tool_calls"
    when the model chose to call (auto, required), "stop" for a named function."""
    content, calls = tools.parse(tool_request, acc.text)
    finish = acc.finish_reason
    named = not isinstance(tool_request.vllm_request.tool_choice, str)
    if calls and not named and finish == "stop":
        finish = "tool_calls"
    return ToolResult(content, calls, finish)
