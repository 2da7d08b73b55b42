"""The edge's mapping of OpenAI parameters onto SamplingSettings, logprobs and tool calls.

Engines are faked (tests/fakes.py); the vLLM tool parser is the real one, on given text.
"""

from __future__ import annotations

import json

import pytest

from cluster.protocol import StructuredOutput, TokenChunk, TokenLogprob, TopLogprob
from router.openai.logprobs import chat_logprobs, completion_logprobs
from router.openai.protocol import ChatCompletionRequest, parse_request
from router.openai.responses import Accumulator
from tests.fakes import FakeBackend
from tests.unit.openai_helpers import MODEL, make_client, sse_events

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MSGS = [{"role": "user", "content": "hi"}]
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def _sent(path: str, **body):
    client, backend = make_client()
    base = {"model": MODEL, **({"messages": MSGS} if path == CHAT else {"prompt": "hi"})}
    r = client.post(path, json={**base, **body})
    assert r.status_code == 200, r.text
    return backend.requests[-1].sampling, r


@pytest.mark.parametrize("body, expected", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}},
     StructuredOutput("json", json.dumps(SCHEMA))),
    ({"response_format": {"type": "json_object"}}, StructuredOutput("json_object")),
    ({"response_format": {"type": "text"}}, None),
    ({"structured_outputs": {"regex": "[0-9]+"}}, StructuredOutput("regex", "[0-9]+")),
    ({"structured_outputs": {"choice": ["a", "b"]}}, StructuredOutput("choice", '["a", "b"]')),
    ({"structured_outputs": {"grammar": "root ::= \"x\""}}, StructuredOutput("grammar", "root ::= \"x\"")),
    ({"structured_outputs": {"json": json.dumps(SCHEMA)}}, StructuredOutput("json", json.dumps(SCHEMA))),
])
def test_structured_output_reaches_the_engine_request(body, expected) -> None:
    sampling, _ = _sent(CHAT, **body)
    assert sampling.structured == expected


def test_sampling_extras_reach_the_engine_request() -> None:
    sampling, _ = _sent(COMPLETIONS, presence_penalty=0.5, frequency_penalty=-1.0, repetition_penalty=1.2, top_k=5,
                        min_p=0.1, stop_token_ids=[3, 4], logprobs=2, structured_outputs={"regex": "a+"})
    assert (sampling.presence_penalty, sampling.frequency_penalty, sampling.repetition_penalty) == (0.5, -1.0, 1.2)
    assert (sampling.top_k, sampling.min_p, sampling.stop_token_ids, sampling.logprobs) == (5, 0.1, (3, 4), 2)
    assert sampling.structured == StructuredOutput("regex", "a+")
    plain, _ = _sent(CHAT)
    assert (plain.logprobs, plain.structured, plain.top_k, plain.repetition_penalty) == (None, None, 0, 1.0)
    chat, _ = _sent(CHAT, logprobs=True)
    assert chat.logprobs == 0  # the sampled token only
    chat, _ = _sent(CHAT, logprobs=True, top_logprobs=4)
    assert chat.logprobs == 4


def _entry(token: str, lp: float, *top: tuple[str, float]) -> TokenLogprob:
    return TokenLogprob(ord(token[0]), token, lp, tuple(TopLogprob(ord(t[0]), t, v) for t, v in top))


def test_logprob_shapes() -> None:
    entries = [_entry("Hé", -0.5, ("Hé", -0.5), ("x", -1.0)), _entry("y", -2.0, ("z", -1.5), ("y", -2.0))]
    chat = chat_logprobs(entries)["content"]
    assert chat[0] == {"token": "Hé", "logprob": -0.5, "bytes": list("Hé".encode()), "top_logprobs": [
        {"token": "Hé", "logprob": -0.5, "bytes": list("Hé".encode())}, {"token": "x", "logprob": -1.0, "bytes": [120]}]}
    legacy = completion_logprobs(entries, text_offset=10)
    assert legacy == {"tokens": ["Hé", "y"], "token_logprobs": [-0.5, -2.0],
                      "top_logprobs": [{"Hé": -0.5, "x": -1.0}, {"z": -1.5, "y": -2.0}], "text_offset": [10, 12]}


class LogprobBackend(FakeBackend):
    """The echo fake, with a made-up logprob per token (-token_id / 100)."""

    async def generate(self, request):
        async for chunk in super().generate(request):
            if request.sampling.logprobs is not None:
                lps = tuple(TokenLogprob(t, chr(t), -t / 100) for t in chunk.token_ids)
                chunk = TokenChunk(chunk.text, chunk.token_ids, chunk.finish_reason, chunk.num_prompt_tokens,
                                   chunk.num_output_tokens, lps)
            yield chunk


def test_logprobs_in_bodies_and_streams() -> None:
    client, _ = make_client(LogprobBackend(model_id=MODEL))
    out = client.post(COMPLETIONS, json={"model": MODEL, "prompt": "abc", "logprobs": 0}).json()["choices"][0]
    assert out["logprobs"]["tokens"] == ["a", "b", "c"] and out["logprobs"]["text_offset"] == [0, 1, 2]
    events = sse_events(client.post(COMPLETIONS, json={"model": MODEL, "prompt": "abc", "logprobs": 0, "stream": True}))
    offsets = [o for e in events[:-1] for c in e["choices"] if c["logprobs"] for o in c["logprobs"]["text_offset"]]
    assert offsets == [0, 1, 2]
    chat = client.post(CHAT, json={"model": MODEL, "messages": MSGS, "logprobs": True, "max_tokens": 2}).json()
    assert [e["logprob"] for e in chat["choices"][0]["logprobs"]["content"]] == [-ord("u") / 100, -ord("s") / 100]
    plain = client.post(CHAT, json={"model": MODEL, "messages": MSGS, "max_tokens": 2}).json()
    assert plain["choices"][0]["logprobs"] is None


@pytest.fixture(scope="module")
def hermes(tiny_model_dir):
    from transformers import AutoTokenizer

    from router.openai.tools import ToolCalling

    return ToolCalling("hermes", AutoTokenizer.from_pretrained(tiny_model_dir))


def _req(**body) -> ChatCompletionRequest:
    return parse_request(ChatCompletionRequest, {"model": MODEL, "messages": MSGS, "tools": [TOOL], **body})


def test_unknown_tool_parser_fails_at_start_naming_the_field(tiny_model_dir) -> None:
    from router.openai.tools import ToolCalling

    with pytest.raises(ValueError, match="model.tool_parser"):
        ToolCalling("no-such-parser", None)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_tool_choice_is_a_decoding_constraint(hermes, choice) -> None:
    prepared = hermes.prepare(_req(tool_choice=choice))
    assert prepared.structured is not None and prepared.structured.kind == "structural_tag"
    assert "get_weather" in prepared.structured.spec and "<tool_call>" in prepared.structured.spec


def test_hermes_output_is_parsed_into_tool_calls(hermes) -> None:
    from router.openai.tools import tool_result

    prepared = hermes.prepare(_req(tool_choice="auto"))
    acc = Accumulator(prompt_tokens=1)
    acc.add(TokenChunk('Sure. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
                       (1,), "stop"))
    result = tool_result(hermes, prepared, acc)
    assert result.finish_reason == "tool_calls" and result.content == "Sure. "
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in result.tool_calls] == [
        ("get_weather", {"city": "Oslo"})]
    plain = Accumulator(prompt_tokens=1)
    plain.add(TokenChunk("no call here", (1,), "stop"))
    result = tool_result(hermes, prepared, plain)
    assert (result.content, result.tool_calls, result.finish_reason) == ("no call here", [], "stop")


def test_earlier_tool_calls_in_the_conversation_reach_the_parser(hermes) -> None:
    """A multi-turn conversation (assistant tool call, tool answer) prepares; a malformed
    earlier call is a 400 naming it (the fuzzer found it a 500 inside vLLM's validation)."""
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    turns = [*MSGS, {"role": "assistant", "content": None, "tool_calls": [call]},
             {"role": "tool", "tool_call_id": "call_1", "content": "12 C"}]
    assert hermes.prepare(_req(messages=turns, tool_choice="auto")).vllm_request.messages[1]["tool_calls"]
    client, _ = make_client(tool_calling=hermes)
    for bad, param in (({"": [False]}, "messages[1].tool_calls[0].id"),
                       ({**call, "function": {"name": "get_weather"}}, "messages[1].tool_calls[0].function.arguments"),
                       ({**call, "type": "custom"}, "messages[1].tool_calls[0].type")):
        body = {"model": MODEL, "messages": [*MSGS, {"role": "assistant", "content": None, "tool_calls": [bad]}],
                "tools": [TOOL], "tool_choice": "auto"}
        r = client.post(CHAT, json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_tool_answers_in_bodies_and_streams(hermes) -> None:
    """The echo fake sends the prompt back; a prompt holding a hermes call makes it 'call' one."""
    from tests.fakes import FakeTokenizer

    class EchoLast(FakeTokenizer):
        def chat(self, messages, tools=None):
            return self.encode(messages[-1]["content"])

    client, _ = make_client(FakeBackend(model_id=MODEL, max_model_len=512, tokenizer=EchoLast()),
                            tool_calling=hermes)
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Lima"}}</tool_call>'
    body = {"model": MODEL, "messages": [{"role": "user", "content": call}], "tools": [TOOL], "tool_choice": "auto"}
    out = client.post(CHAT, json=body).json()["choices"][0]
    assert out["finish_reason"] == "tool_calls" and out["message"]["content"] is None
    assert out["message"]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Lima"}'}
    events = sse_events(client.post(CHAT, json={**body, "stream": True}))
    deltas = [c for e in events[:-1] for c in e["choices"]]
    assert deltas[0]["delta"] == {"role": "assistant", "content": ""}
    assert deltas[-1]["finish_reason"] == "tool_calls"
    assert deltas[-1]["delta"]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert all("content" not in d["delta"] for d in deltas[1:])


def test_compact_json_limits_whitespace_in_forced_tool_calls(tiny_model_dir) -> None:
    from transformers import AutoTokenizer

    from router.openai.tools import ToolCalling

    compact = ToolCalling("hermes", AutoTokenizer.from_pretrained(tiny_model_dir), compact_json=True)
    spec = compact.prepare(_req(tool_choice="required")).structured.spec
    assert '"max_whitespace_cnt": 1' in spec and '"max_whitespace_cnt": null' not in spec


def test_openai_sdk_reads_logprobs_and_tool_calls(hermes) -> None:
    """The openai SDK parses our bodies unchanged (typed objects, no validation errors)."""
    from openai import OpenAI

    from tests.fakes import FakeTokenizer

    class EchoLast(FakeTokenizer):
        def chat(self, messages, tools=None):
            return self.encode(messages[-1]["content"])

    client, _ = make_client(LogprobBackend(model_id=MODEL, max_model_len=512, tokenizer=EchoLast()),
                            tool_calling=hermes)
    sdk = OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=client, max_retries=0)
    out = sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "abc"}], logprobs=True,
                                      top_logprobs=0)
    assert [t.token for t in out.choices[0].logprobs.content] == ["a", "b", "c"]
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Lima"}}</tool_call>'
    out = sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": call}], tools=[TOOL])
    assert out.choices[0].finish_reason == "tool_calls"
    assert out.choices[0].message.tool_calls[0].function.name == "get_weather"
    stream = sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": call}], tools=[TOOL],
                                         stream=True)
    calls = [tc for chunk in stream for tc in (chunk.choices[0].delta.tool_calls or [])]
    assert [(c.index, c.function.name) for c in calls] == [(0, "get_weather")]
    legacy = sdk.completions.create(model=MODEL, prompt="xy", logprobs=1, max_tokens=2)
    assert legacy.choices[0].logprobs.tokens == ["x", "y"]
