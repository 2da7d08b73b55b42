"""The answer's text across a cut: where one engine's answer is continued by another.

Two places hand an answer from one engine to another, each time as a new engine request whose
prompt is the old prompt + the tokens already sent to the client: first-token reuse (the
prefill engine's token is the first, decode continues; kv_transfer/first_token.py) and
migration (a broken decode stream continues elsewhere; migration.py). The tokens continue
exactly; the text may not. vLLM's incremental detokenizers hold back a token's piece while it
is not yet whole UTF-8 (an emoji or a CJK character split over byte tokens) and emit it with a
later token. A new engine primed with those bytes in its *prompt* does not know they were never
emitted: measured with vLLM 0.32's FastIncrementalDetokenizer (tokenizers' DecodeStream), its
first text then repeats the prompt (the whole rendered prompt, system message included) or
drops the held-back bytes, in 95% of such cuts; in 0 of 2,730 cuts where the last token sent
had emitted whole text (tests/unit/test_answer_text.py replays both kinds).

So, per cut:
- `clean_cut(last_output)`: the last token sent emitted whole text; the continuing engine's
  own text is exact and passes through untouched (nearly every cut in English text; no work).
- otherwise `AnswerText`: vLLM's own incremental detokenizer, built in the gateway as the engine
  that began the answer built it (its prompt, its sampling settings) and stepped through the
  tokens already sent; each output of the continuing engine gets its text from it, from the
  token ids alone. One detokenizer step per token (~1 µs in DecodeStream) on the gateway, for
  that request only.

Stop strings after a cut: where the text is restated anyway, or a stop string of two or more
characters could span the cut, they are the gateway's: `AnswerText` checks them all
(`checks_stops`), the continuation is sent without them (`without_stop_strings`),
and `restate` finds them as vLLM's output processor does, across the cut too (the detokenizer
holds back the text a stop string may start with, and has the tokens before the cut): the output
that completes one finishes the answer (finish_reason "stop", stop_reason the string, the text
and tokens after it dropped), and the caller closes the continuation, which aborts it. The new
engine must not check them itself: after an unclean cut its own text may hold the prompt's.
First-token reuse still takes the plain path for stop strings of two or more characters
(kv_transfer/first_token.py); one-character ones are checked here when its cut is unclean.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import replace
from typing import Any, Optional, Sequence

from vllm.v1.engine import EngineCoreRequest
from vllm.v1.engine.detokenizer import IncrementalDetokenizer

from cluster.protocol import EngineRequest
from kv_transfer.first_token import spanning_stop_strings

_INCOMPLETE = "\ufffd"  # what a detokenizer shows for bytes that are not (yet) whole UTF-8


def clean_cut(last_output: Any) -> bool:
    """Whether an engine started from prompt + the tokens sent so far (the last of them in
    `last_output`, a DELTA RequestOutput as the client got it) detokenizes the rest of the
    answer exactly as the engine that sent them would: its one new token emitted whole text.
    An output of several tokens cannot tell which token emitted what: not clean."""
    sample = last_output.outputs[0]
    return len(sample.token_ids) == 1 and sample.text != "" and not sample.text.endswith(_INCOMPLETE)


class AnswerText:
    """The text of an answer continued after an unclean cut, as one uncut engine would have
    sent it. `request`: the answer's first engine request (its prompt and sampling settings);
    `sent`: every token the client has had; `tokenizer`: the served model's, as vLLM's
    renderer holds it. Then `restate(output)` for each output of the continuing engine, in
    order."""

    def __init__(self, tokenizer: Any, request: EngineRequest, sent: Sequence[int]) -> None:
        # vLLM's own detokenizer, built from the request as its output processor builds it.
        # (UPSTREAM.md: EngineCoreRequest's required fields and from_new_request are a seam.)
        core = EngineCoreRequest(request_id=request.request_id, prompt_token_ids=list(request.prompt_token_ids),
                                 mm_features=None, sampling_params=request.sampling, pooling_params=None,
                                 arrival_time=0.0, lora_request=None, cache_salt=None, data_parallel_rank=None)
        self._detok = IncrementalDetokenizer.from_new_request(tokenizer, core)
        # Whether the request has stop strings, checked here (the continuation carries none).
        self.checks_stops = bool(request.sampling.stop)
        self.stopped = False  # a stop string found here ended the answer: the caller closes its engine stream
        self._detok.update(list(sent), stop_terminated=False)
        self._detok.get_next_output_text(finished=False, delta=True)  # what the client already has

    def restate(self, output: Any) -> Any:
        """`output` with the text this answer's own detokenizer gives its tokens; finished at
        a stop string it completes (module docstring)."""
        sample = output.outputs[0]
        # vLLM's output processor excludes an EOS or stop token from the text (engine-side stop:
        # reason None or the token id); a stop *string* the detokenizer finds itself.
        engine_stop = sample.finish_reason == "stop" and not isinstance(sample.stop_reason, str)
        before = self._detok.num_output_tokens()
        stop = self._detok.update(list(sample.token_ids), stop_terminated=engine_stop)
        finished = bool(output.finished) or stop is not None
        text = self._detok.get_next_output_text(finished=finished, delta=True)
        output = copy.copy(output)
        if stop is None:
            output.outputs = [replace(sample, text=text), *output.outputs[1:]]
            return output
        kept = self._detok.num_output_tokens() - before  # tokens after the stop string's are dropped
        logprobs = sample.logprobs[:kept] if sample.logprobs is not None else None
        output.outputs = [replace(sample, text=text, token_ids=list(sample.token_ids)[:kept], logprobs=logprobs,
                                  finish_reason="stop", stop_reason=stop), *output.outputs[1:]]
        output.finished = True
        self.stopped = True
        return output


def text_after_cut(tokenizer: Any, request: EngineRequest, sent: Sequence[int],
                   last_output: Any) -> Optional[AnswerText]:
    """What restates the continuing engine's text after a cut (None: its own text is exact and
    no stop string can span the cut, or there is no text to restate: no tokenizer, or the
    request asked for none)."""
    if tokenizer is None or not request.sampling.detokenize:
        return None
    if clean_cut(last_output) and not spanning_stop_strings(request.sampling):
        return None
    return AnswerText(tokenizer, request, sent)


def without_stop_strings(request: EngineRequest) -> EngineRequest:
    """The continuation as sent to its engine when the gateway checks the stop strings."""
    sampling = request.sampling.clone()
    sampling.stop = []
    sampling.output_text_buffer_length = 0  # what vLLM derived from the stop strings
    return dataclasses.replace(request, sampling=sampling)
