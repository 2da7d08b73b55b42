"""Migration: a decode stream that breaks after the client has seen tokens is continued on
another replica instead of ending the answer with an error event (issue 29, item 1).

The continuation is a new request of the prompt + every token already sent to the client,
max_tokens and min_tokens reduced by them, the same sampling otherwise, through the normal path
(router/pd/path.py routes it again, without the replica that failed: remote, local, or whole on
a prefill replica when no other decode replica is known). The client sees one stream: the
continuation's outputs follow the sent ones under the request's own id, their cumulative
logprob restated as the whole answer's (vLLM counts the sent tokens as prompt now), their text
the uncut answer's where the cut split a character (answer_text.py), so vLLM's serving code
builds one answer and one usage from them.

What may migrate (`refusal` says why not; a refused request fails as before, counted):
- greedy (temperature 0) and unseeded random sampling: continuing is exactly what one engine
  would do (greedy), or an honest draw from the same distribution (unseeded);
- not seeded random sampling: the new engine's generator would restart, so the answer would not
  be the one this seed gives ("seeded_sampling");
- not structured output: the grammar's state lives in the engine, and a restarted grammar
  would reject or corrupt the rest (Dynamo turned it off after broken JSON) ("structured_output");
- not presence/frequency penalties, bad_words, watermarking, repetition detection or a thinking
  budget: each reads the output tokens so far, and the sent ones are prompt on the new engine
  ("penalties", "bad_words", "engine_state"). Repetition penalty, top-k/p, min-p, logit bias,
  allowed tokens and stop token ids look at each step alone (or at prompt and output alike);
- stop strings: the gateway checks them after the cut, on the whole answer's text, as vLLM's
  output processor would (answer_text.py); the continuation carries none. Refused only where the
  gateway has no tokenizer to check them with ("stop_strings": unit tests over fake pools);
- not vLLM extra args (`vllm_xargs`) other than FakeEngine's test knobs (`fake_*`): they are
  what a custom logits processor reads, which may keep state ("extra_args");
- at most `limit` times per request (kv_transfer.migration_limit; "limit", 0: off).

n > 1: each sample migrates as its own request (router/pd/samples.py).

Pure: no Serve, no Ray import; the state machine is stepped by unit tests (test_migration.py).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from typing import Any, Optional

from cluster.protocol import EngineRequest
from router.openai.errors import OpenAIError
from router.path_metrics import MIGRATIONS
from kv_transfer.first_token import spanning_stop_strings
from router.pd.answer_text import AnswerText, text_after_cut, without_stop_strings

REFUSALS = ("seeded_sampling", "structured_output", "penalties", "bad_words", "engine_state", "stop_strings",
            "extra_args", "limit", "nothing_left")
FAILURES = ("replica_died", "stream_lost", "stream_ended", "error")
# The extra args no logits processor reads: tandem's own, and FakeEngine's knobs (tests).
_OWN_EXTRA_ARGS = ("kv_transfer_params",)
_RAY_ACTOR_ERRORS = ("RayActorError", "ActorDiedError", "ActorUnavailableError")


def refusal(sampling: Any) -> Optional[str]:
    """Why a request with these vLLM SamplingParams may not be continued elsewhere (None: it
    may); the module docstring gives each rule's reason."""
    if sampling.seed is not None and sampling.temperature > 0:
        return "seeded_sampling"
    if sampling.structured_outputs is not None:
        return "structured_output"
    if sampling.presence_penalty or sampling.frequency_penalty:
        return "penalties"
    if sampling.bad_words:
        return "bad_words"
    if any(getattr(sampling, name, None) for name in ("watermarking", "repetition_detection",
                                                      "thinking_token_budget")):
        return "engine_state"
    extra = sampling.extra_args or {}
    if any(k not in _OWN_EXTRA_ARGS and not k.startswith("fake_") for k in extra):
        return "extra_args"
    return None


def continuation(request: EngineRequest, sent: list[int], attempt: int) -> EngineRequest:
    """The request that continues `request` after `sent` tokens reached the client: its own id
    (`<id>-m<attempt>`: the engines and the KV handoff key their state by id, and the failed
    attempt's may still be known to a prefill engine), the prompt extended by the sent tokens,
    max_tokens and min_tokens reduced by as many, no prompt logprobs (sent with the first
    output) and no kv_transfer_params of an earlier hop."""
    sampling = request.sampling.clone()
    if sampling.max_tokens is not None:
        sampling.max_tokens = sampling.max_tokens - len(sent)
    sampling.min_tokens = max(0, sampling.min_tokens - len(sent))
    sampling.prompt_logprobs = None
    if sampling.extra_args and "kv_transfer_params" in sampling.extra_args:
        sampling.extra_args = {k: v for k, v in sampling.extra_args.items() if k != "kv_transfer_params"}
    return replace(request, request_id=f"{request.request_id}-m{attempt}",
                   prompt_token_ids=request.prompt_token_ids + tuple(sent), sampling=sampling)


def failure_of(exc: Optional[BaseException]) -> str:
    """What broke the stream, as the counter's reason (None: it ended without finishing)."""
    if exc is None:
        return "stream_ended"
    if any(c.__name__ in _RAY_ACTOR_ERRORS for c in type(exc).__mro__):
        return "replica_died"
    if type(exc).__name__ == "ChannelLost":  # router/pd/channels.py: the replica's step stream failed
        return "stream_lost"
    return "error"


@dataclass
class Migration:
    """One request's answer across its attempts. Each output of the current attempt goes
    through `sent` on its way to the client; when the attempt fails (`failed(exc)`) or ends
    unfinished (`failed(None)`), `failed` gives the continuation to run next, or None: the
    failure is the request's (raise it). `exclude` lists the replicas the failed attempts ran on
    (path.py adds each attempt's picks through `ran_on`). `tokenizer`: the served model's
    (None: outputs keep the engine's text; FakeEngine tests)."""

    request: EngineRequest
    limit: int
    tokenizer: Any = None
    tokens: list[int] = field(default_factory=list)  # every token sent to the client
    attempts: int = 0  # continuations started
    finished: bool = False
    exclude: set[str] = field(default_factory=set)  # Serve replica ids of failed attempts
    _running: set[str] = field(default_factory=set)  # the current attempt's replica ids
    _cumulative: Optional[float] = None  # the sent tokens' cumulative logprob
    _offset: Optional[float] = None  # added to the current attempt's cumulative logprobs
    _last: Any = None  # the last output sent
    _text: Optional[AnswerText] = None  # the current attempt's text, where its engine's is not exact
    outcome: Optional[tuple[str, str]] = None  # the last `failed` call's (result, reason), as counted; None: not counted

    @property
    def stopped_here(self) -> bool:
        """A stop string the gateway found after a cut ended the answer (answer_text.py): the
        continuation's engine, which checks none, must be closed."""
        return self._text is not None and self._text.stopped

    @property
    def current_id(self) -> str:
        return self.request.request_id if not self.attempts else f"{self.request.request_id}-m{self.attempts}"

    def ran_on(self, *replica_ids: Optional[str]) -> None:
        self._running.update(r for r in replica_ids if r)

    def sent(self, output: Any) -> Any:
        """The attempt's output as the client's: the request's own id; after a cut, the
        cumulative logprob of the whole answer, and the uncut answer's text. Records its tokens
        as sent."""
        if self._text is not None:
            output = self._text.restate(output)
        if self._offset is not None:
            output = copy.copy(output)
            output.outputs = [replace(c, cumulative_logprob=None if c.cumulative_logprob is None
                                      else c.cumulative_logprob + self._offset) for c in output.outputs]
        if self.attempts:  # a continuation's engine knows it as <id>-m<k>; the client, by its own id
            output.request_id = self.request.request_id
        for c in output.outputs[:1]:  # one sample per engine request
            self.tokens.extend(c.token_ids)
            self._cumulative = c.cumulative_logprob
        self.finished = self.finished or bool(output.finished)
        self._last = output
        return output

    def failed(self, exc: Optional[BaseException]) -> Optional[EngineRequest]:
        """The continuation after the current attempt broke (`exc`; None: it ended unfinished),
        counted; None where it may not continue (nothing sent yet: the failure is the request's,
        as before migration existed; a client error; or a refusal, counted with its reason)."""
        self.outcome = None
        if isinstance(exc, OpenAIError) or not self.tokens or self.finished:
            return None
        tier = self.request.tier
        sampling = self.request.sampling
        reason = refusal(sampling)
        if reason is None and spanning_stop_strings(sampling) and (self.tokenizer is None or not sampling.detokenize):
            reason = "stop_strings"  # nothing here could check them across the cut
        if reason is None and self.attempts >= self.limit:
            reason = "limit"
        max_tokens = self.request.sampling.max_tokens
        if reason is None and max_tokens is not None and max_tokens - len(self.tokens) <= 0:
            reason = "nothing_left"
        if reason is not None:
            MIGRATIONS.labels(tier=tier, reason=reason, result="refused").inc()
            self.outcome = ("refused", reason)
            return None
        self.outcome = ("continued", failure_of(exc))
        MIGRATIONS.labels(tier=tier, reason=self.outcome[1], result="continued").inc()
        self.attempts += 1
        self.exclude |= self._running
        self._running = set()
        self._offset = self._cumulative
        self._text = text_after_cut(self.tokenizer, self.request, self.tokens, self._last)
        following = continuation(self.request, self.tokens, self.attempts)
        return without_stop_strings(following) if self._text is not None and self._text.checks_stops else following
