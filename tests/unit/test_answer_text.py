"""The answer's text across a cut (router/pd/answer_text.py), replayed with vLLM's own
incremental detokenizer as each engine runs it: the engine that began the answer emits the
tokens before the cut, one per output; a new engine whose prompt is prompt + those tokens emits
the rest. The client's text must equal one uncut engine's, at every cut.

Prompts and answers of byte tokens (the tiny Llama's ids 3-258 are its byte fallback) split
characters at most cuts; the CI failure this guards against (a decode replica killed
mid-answer, tests/integration/test_faults_replicas.py) was one such cut."""

from __future__ import annotations

import random

import pytest
from vllm import SamplingParams
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.sampling_params import RequestOutputKind
from vllm.tokenizers import get_tokenizer
from vllm.v1.engine import EngineCoreRequest
from vllm.v1.engine.detokenizer import IncrementalDetokenizer
from ray.exceptions import ActorDiedError

from cluster.protocol import EngineRequest
from router.pd import migration as migration_module
from router.pd.answer_text import AnswerText, clean_cut, text_after_cut
from router.pd.migration import Migration
from tests.support.fakes import RecordingMetric


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return get_tokenizer(str(tiny_model_dir))


def sampling(**kw) -> SamplingParams:
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True, **kw)
    params.output_kind = RequestOutputKind.DELTA
    return params


class Engine:
    """One engine's detokenization of one request: vLLM's IncrementalDetokenizer, one token per
    DELTA output, as the engine replicas send them."""

    def __init__(self, tokenizer, rid: str, prompt: list[int], params: SamplingParams) -> None:
        core = EngineCoreRequest(request_id=rid, prompt_token_ids=prompt, mm_features=None,
                                 sampling_params=params, pooling_params=None, arrival_time=0.0,
                                 lora_request=None, cache_salt=None, data_parallel_rank=None)
        self.rid, self.prompt = rid, prompt
        self.detok = IncrementalDetokenizer.from_new_request(tokenizer, core)

    def output(self, token: int, finished: bool = False) -> RequestOutput:
        self.detok.update([token], stop_terminated=False)
        return self.output_after_update(token, finished)

    def output_after_update(self, token: int, finished: bool = False) -> RequestOutput:
        """The DELTA output of a token this engine's detokenizer has just been given."""
        text = self.detok.get_next_output_text(finished=finished, delta=True)
        sample = CompletionOutput(index=0, text=text, token_ids=[token], cumulative_logprob=None,
                                  logprobs=None, finish_reason="length" if finished else None)
        return RequestOutput(request_id=self.rid, prompt=None, prompt_token_ids=self.prompt,
                             prompt_logprobs=None, outputs=[sample], finished=finished)


def answer(tokenizer, prompt, tokens, params, rid="r", cut: bool = False) -> list[RequestOutput]:
    """An engine's outputs for `tokens`; the last finishes the answer, unless the stream is `cut`."""
    engine = Engine(tokenizer, rid, prompt, params)
    return [engine.output(t, finished=not cut and i == len(tokens) - 1) for i, t in enumerate(tokens)]


def cases(n: int, seed: int = 0):
    rng = random.Random(seed)
    for _ in range(n):
        prompt = [rng.randrange(3, 259) for _ in range(rng.randrange(4, 40))]  # byte tokens
        tokens = [rng.randrange(3, 538) for _ in range(24)]  # bytes and merged tokens
        yield prompt, tokens, rng.randrange(1, len(tokens) - 1)


def test_after_every_cut_the_client_gets_the_uncut_engines_text(tokenizer):
    params = sampling()
    unclean = naive_wrong = 0
    for prompt, tokens, cut in cases(300):
        uncut = "".join(o.outputs[0].text for o in answer(tokenizer, prompt, tokens, params))
        before = answer(tokenizer, prompt, tokens[:cut], params, cut=True)
        after = answer(tokenizer, prompt + tokens[:cut], tokens[cut:], params, rid="r-m1")
        request = EngineRequest("r", tuple(prompt), params, tier="t")
        text = text_after_cut(tokenizer, request, tokens[:cut], before[-1])
        restated = after if text is None else [text.restate(o) for o in after]
        client = "".join(o.outputs[0].text for o in before + restated)
        assert client == uncut, (prompt, tokens, cut)
        naive = "".join(o.outputs[0].text for o in before + after)
        unclean += text is not None
        naive_wrong += naive != uncut
        if text is None:  # a clean cut: the new engine's own text is exact
            assert naive == uncut
    # The replay exercised the fault: many cuts split a character, and passing the new engine's
    # text through would have been wrong there.
    assert unclean > 50 and naive_wrong > 50, (unclean, naive_wrong)


def test_a_cut_inside_a_character_is_not_clean_and_a_whole_character_is(tokenizer):
    emoji = tokenizer.encode("🤖", add_special_tokens=False)
    assert len(emoji) > 1  # the tiny vocabulary spells it in bytes
    engine = Engine(tokenizer, "r", tokenizer.encode("hi", add_special_tokens=False), sampling())
    outputs = [engine.output(t) for t in emoji]
    assert not clean_cut(outputs[0])
    assert clean_cut(outputs[-1]) and outputs[-1].outputs[0].text == "🤖"
    several = outputs[-1]
    several.outputs[0].token_ids = emoji  # which token emitted what is unknown
    assert not clean_cut(several)


def until_stop(engine: Engine, tokens: list[int]) -> str:
    """The engine's text up to its stop string (it finishes there)."""
    text = ""
    for t in tokens:
        stop = engine.detok.update([t], stop_terminated=False)
        text += engine.detok.get_next_output_text(finished=stop is not None, delta=True)
        if stop is not None:
            return text
    raise AssertionError("no stop string")


def test_a_stop_string_is_found_across_the_cut_as_the_engine_finds_it(tokenizer):
    prompt = tokenizer.encode("a b", add_special_tokens=False)
    tokens = tokenizer.encode("🤖 x. y", add_special_tokens=False)
    params = sampling(stop=["."])

    uncut = until_stop(Engine(tokenizer, "r", prompt, params), tokens)
    cut = 1  # inside the emoji
    request = EngineRequest("r", tuple(prompt), params, tier="t")
    text = AnswerText(tokenizer, request, tokens[:cut])
    after = Engine(tokenizer, "r-m1", prompt + tokens[:cut], params)
    client = ""
    for t in tokens[cut:]:
        output = after.output(t)
        output = text.restate(output)
        client += output.outputs[0].text
        if "." in tokenizer.decode(tokens[:tokens.index(t) + 1]):
            break
    assert client == uncut == "🤖 x"  # the one-character stop string, excluded as vLLM excludes it


def test_a_migrated_answer_keeps_its_text_step_by_step(tokenizer, monkeypatch):
    monkeypatch.setattr(migration_module, "MIGRATIONS", RecordingMetric())
    params = sampling()
    for prompt, tokens, cut in cases(40, seed=7):
        request = EngineRequest("r", tuple(prompt), params, tier="t")
        migration = Migration(request, limit=2, tokenizer=tokenizer)
        uncut = "".join(o.outputs[0].text for o in answer(tokenizer, prompt, tokens, params))
        client = "".join(migration.sent(o).outputs[0].text
                         for o in answer(tokenizer, prompt, tokens[:cut], params, cut=True))
        following = migration.failed(ActorDiedError())
        assert following is not None and list(following.prompt_token_ids) == prompt + tokens[:cut]
        second = min(cut + 5, len(tokens) - 1)  # and a second cut, on the continuation
        continued = answer(tokenizer, list(following.prompt_token_ids), tokens[cut:second], params, "r-m1", cut=True)
        client += "".join(migration.sent(o).outputs[0].text for o in continued)
        following = migration.failed(ActorDiedError())
        assert following is not None and list(following.prompt_token_ids) == prompt + tokens[:second]
        last = answer(tokenizer, list(following.prompt_token_ids), tokens[second:], params, "r-m2")
        client += "".join(migration.sent(o).outputs[0].text for o in last)
        assert migration.finished and client == uncut, (prompt, tokens, cut)


@pytest.mark.parametrize("include", [False, True])
def test_a_migrated_answer_stops_at_a_stop_string_that_spans_the_cut(tokenizer, monkeypatch, include):
    """Every cut of an answer whose stop string is several tokens long: the continuation is
    sent without stop strings, and the gateway finds the string across the cut, finishes the
    answer there (finish_reason stop, the string as stop_reason) with one uncut engine's text."""
    monkeypatch.setattr(migration_module, "MIGRATIONS", RecordingMetric())
    prompt = tokenizer.encode("say it", add_special_tokens=False)
    tokens = tokenizer.encode(" and so 🤖 the very END of it all", add_special_tokens=False)
    params = sampling(stop=["very END"], include_stop_str_in_output=include)
    uncut = until_stop(Engine(tokenizer, "r", prompt, params), tokens)
    assert uncut.endswith("the very END" if include else "the ")
    spanning = 0
    for cut in range(1, len(tokens) - 1):
        request = EngineRequest("r", tuple(prompt), params, tier="t")
        migration = Migration(request, limit=1, tokenizer=tokenizer)
        first = Engine(tokenizer, "r", prompt, params)
        client, sent_text = "", ""
        for t in tokens[:cut]:
            if first.detok.update([t], stop_terminated=False) is not None:
                break  # the first engine found it before the cut: no migration to test here
            output = first.output_after_update(t)
            client += migration.sent(output).outputs[0].text
        else:
            following = migration.failed(ActorDiedError())
            assert following is not None and following.sampling.stop == []
            spanning += "very END" in tokenizer.decode(tokens[:cut + 3]) and "very END" not in tokenizer.decode(tokens[:cut])
            second = Engine(tokenizer, "r-m1", list(following.prompt_token_ids), following.sampling)
            last = None
            for t in tokens[cut:]:
                last = migration.sent(second.output(t))
                client += last.outputs[0].text
                if migration.finished:
                    assert migration.stopped_here  # the continuation's engine checks none: the gateway ended it
                    break
            assert last is not None and last.finished, cut
            assert last.outputs[0].finish_reason == "stop" and last.outputs[0].stop_reason == "very END"
            assert client == uncut, (cut, client, uncut)
    assert spanning >= 2  # some cuts fell inside the stop string


def test_without_a_tokenizer_a_stop_string_that_could_span_the_cut_is_refused(monkeypatch):
    metric = RecordingMetric()
    monkeypatch.setattr(migration_module, "MIGRATIONS", metric)
    for stop, continued in ((["END"], False), (["."], True)):
        migration = Migration(EngineRequest("r", (5, 6, 7), sampling(stop=stop), tier="t"), limit=1)
        output = RequestOutput(request_id="r", prompt=None, prompt_token_ids=[5, 6, 7], prompt_logprobs=None,
                               outputs=[CompletionOutput(index=0, text="x", token_ids=[9], cumulative_logprob=None,
                                                         logprobs=None)], finished=False)
        migration.sent(output)
        assert (migration.failed(ActorDiedError()) is not None) == continued
    assert [labels["reason"] for labels, kind, _ in metric.calls if kind == "inc"] == ["stop_strings", "replica_died"]
