"""How the differential test compares tandem's answer with vLLM's (tests/support/compat.py)."""

from __future__ import annotations

from loadtest.measure.sse import read_events
from tests.support.compat import Difference, Entry, Outcome, answer, judge, key_paths, shape

CHAT = "/v1/chat/completions"


def _entry(**kw) -> Entry:
    return Entry(id="e", feature="f", method="POST", path=kw.pop("path", CHAT), **kw)


def _chat(content: str, **extra) -> dict:
    return {"id": "chatcmpl-1", "created": 1, "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}, **extra}


def test_key_paths_ignore_values_but_keep_type_tags_and_data_keys_collapse():
    body = {"id": "a", "object": "list", "choices": [{"logprobs": {"top_logprobs": [{"tok": -1.0, "en": -2.0}]}}]}
    assert key_paths(body, 5) == {"id", "object", "object=list", "choices", "choices[].logprobs",
                                  "choices[].logprobs.top_logprobs", "choices[].logprobs.top_logprobs[].*"}
    assert key_paths({"a": {"b": 1}}, 1) == {"a"}


def test_same_answers_pass_and_ids_do_not_matter():
    e = _entry(body={"temperature": 0})
    theirs = Outcome(200, _chat("hi there"))
    ours = Outcome(200, {**_chat("hi there"), "id": "other", "created": 2})
    assert judge(e, ours, theirs) == []


def test_text_shape_and_status_differences_are_reported():
    e = _entry(body={"temperature": 0})
    theirs = Outcome(200, _chat("hi there"))
    assert any("answer" in p for p in judge(e, Outcome(200, _chat("bye")), theirs))
    assert any("body shape" in p and "system_fingerprint" in p
               for p in judge(e, Outcome(200, _chat("hi there", system_fingerprint="x")), theirs))
    problems = judge(e, Outcome(400, {"error": {"message": "unsupported n"}}), theirs)
    assert problems == ["status 400 where vLLM answers 200 (\"unsupported n\")"]


def test_a_5xx_always_fails_and_a_documented_difference_is_allowed():
    e = _entry(body={}, compare="status")
    bad = Outcome(400, {"error": {"message": "x"}})
    assert any("tandem answered 500" in p for p in judge(e, Outcome(500, "boom"), bad))
    documented = _entry(body={}, difference=Difference(tandem="2xx", reason="r"), compare="status")
    assert judge(documented, Outcome(200, {}), bad) == []
    assert judge(e, Outcome(200, {}), bad) != []
    assert judge(e, Outcome(0, error="ConnectError"), bad)[0].startswith("status ConnectError")


def test_streams_are_folded_per_choice_and_tool_call():
    lines = [
        'data: {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}',
        'data: {"choices": [{"index": 1, "delta": {"content": "b"}}, {"index": 0, "delta": {"content": "a"}}]}',
        'data: {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"name": "f", "arguments": "{\\"x\\""}}]}}]}',
        'data: {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}, "finish_reason": "tool_calls"}]}',
        'data: {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 3}}',
        "data: [DONE]",
    ]
    events, done = read_events(lines)
    assert done and len(events) == 5
    e = _entry(body={"stream": True, "temperature": 0})
    got = answer(e, Outcome(200, events=tuple(events), done=done))
    assert got == {"choices": [{"text": "a", "tool_calls": [("f", '{"x": 1}')], "finish_reason": "tool_calls"},
                               {"text": "b", "tool_calls": [], "finish_reason": None}],
                   "usage": {"prompt_tokens": 4, "completion_tokens": 3}}
    assert "[DONE]" in shape(e, Outcome(200, events=tuple(events), done=True))


def test_responses_answer_is_the_output_text_and_function_calls():
    body = {"status": "completed", "usage": {"input_tokens": 5, "output_tokens": 2},
            "output": [{"type": "message", "content": [{"type": "output_text", "text": "hi"}]},
                       {"type": "function_call", "name": "f", "arguments": "{}"}]}
    e = _entry(path="/v1/responses", body={"temperature": 0})
    assert answer(e, Outcome(200, body)) == {"output": [("message", "hi"), ("function_call", "f", "{}")],
                                            "status": "completed",
                                            "usage": {"input_tokens": 5, "output_tokens": 2}}


def test_a_stream_cut_by_max_tokens_may_lack_the_unstreamed_tail_of_its_last_tool_call():
    """vLLM appends a cut call's parsed-but-unstreamed arguments only when the last delta
    carries a tool-call delta: whether it is there follows how tokens were chunked."""
    def stream(args: str, finish: str, streamed: str = "false") -> Outcome:
        lines = [
            'data: {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"name": "f", "arguments": "%s"}}]}}]}' % streamed,
            'data: {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "%s"}}]}, "finish_reason": "%s"}]}' % (args, finish),
            "data: [DONE]",
        ]
        events, done = read_events(lines)
        return Outcome(200, events=tuple(events), done=done)

    e = _entry(body={"stream": True, "temperature": 0})
    assert judge(e, stream("", "length"), stream("{}", "length")) == []
    assert judge(e, stream("{}", "length"), stream("", "length")) == []
    assert any("answer" in p for p in judge(e, stream("", "length", "true"), stream("{}", "length")))  # not a tail
    assert any("answer" in p for p in judge(e, stream("", "tool_calls"), stream("{}", "tool_calls")))  # not cut
