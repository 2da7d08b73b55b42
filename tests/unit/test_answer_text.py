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


def test_a_stop_string_is_found_across_the_cut_as_the_engine_finds_it(tokenizer):
    prompt = tokenizer.encode("a b", add_special_tokens=False)
    tokens = tokenizer.encode("🤖 x. y", add_special_tokens=False)
    params = sampling(stop=["."])

    def until_stop(engine: Engine, tokens: list[int]) -> str:
        """The engine's text up to its stop string (it finishes there)."""
        text = ""
        for t in tokens:
            stop = engine.detok.update([t], stop_terminated=False)
            text += engine.detok.get_next_output_text(finished=stop is not None, delta=True)
            if stop is not None:
                return text
        raise AssertionError("no stop string")

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
