"""First-token reuse: the prefill engine's one sampled token is the answer's first token.

Without it, the prefill's token is dropped and decode runs one more forward over the last
prompt token to sample the same token again: the client waits for the prefill hop, the KV
pull and a decode step. With it, the gateway streams the prefill's token as soon as the
prefill hop returns, and decode continues from prompt + that token (max_tokens and
min_tokens one less): decode loads the prompt's KV (kv_transfer/connector.py caps the pull at
what the prefill computed), computes the reused token like any decode step, and samples the
second token.

What shapes token 1 is applied by the prefill engine (the request's full sampling settings,
max_tokens=1): temperature/top-p/top-k/min-p, stop token ids and EOS, one-character stop
strings, repetition penalty (vLLM applies it over prompt and output tokens alike, so the
token's move from output to prompt changes nothing), logprobs and top_logprobs. Where
decode could not continue exactly as one engine would, `reuse_blocker` names why and the
request takes the plain path (the prefill's token dropped, decode samples token 1 itself):

- a decoding constraint (JSON schema, regex, grammar, choice): decode's grammar would start
  from the second token without the first;
- presence or frequency penalties: they count output tokens only, and the reused token
  would count as prompt on decode;
- a seed with random sampling: decode's per-request generator would restart at token 2,
  so the answer would differ from one engine's with the same seed;
- a stop string of two or more characters: decode checks stop strings on its own output
  only, so one spanning token 1 and token 2 would be missed.

Sampling n > 1 takes the plain path too ("n"): each sample needs its own first token, and
router/pd/samples.py runs the samples as decode requests that share one prefill.

Text: decode's detokenizer starts from prompt + token 1; where token 1 ends inside a character
(byte tokens of an emoji or CJK character), its text would be wrong, and the gateway restates
it (router/pd/answer_text.py).

Call order (router/pd/path.py): `reuse_blocker(sampling)`; prefill with reuse → its first
RequestOutput; if that output finished the answer (stop, EOS, max_tokens 1) there is no
decode hop; else `continuation(request, first)` is the decode request, and
`FirstTokenOffset` restates decode's outputs as the client's (its cumulative logprob).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from typing import Any, Optional

from cluster.protocol import EngineRequest, new_token_ids


def reuse_blocker(sampling: Any) -> Optional[str]:
    """Why the prefill's token cannot be the first token of this request (None: it can);
    `sampling` is the request's vLLM SamplingParams."""
    if sampling.n > 1:
        return "n"
    if sampling.structured_outputs is not None:
        return "structured_output"
    if sampling.presence_penalty or sampling.frequency_penalty:
        return "penalties"
    if sampling.seed is not None and sampling.temperature > 0:
        return "seeded_sampling"
    if spanning_stop_strings(sampling):
        return "stop_strings"
    if sampling.bad_words:
        return "bad_words"  # a banned sequence spanning token 1 and 2 would not be seen by decode
    return None


def spanning_stop_strings(sampling: Any) -> bool:
    """Stop strings of two or more characters (vLLM's SamplingParams holds them as a list): one
    may span a cut between two engines, where neither engine's own check can find it."""
    return any(len(stop) > 1 for stop in sampling.stop)


def continuation(request: EngineRequest, first: Any) -> EngineRequest:
    """The decode request after the prefill produced `first` (a RequestOutput): the same
    request, its prompt extended by the first token(s), the length bounds reduced by as many,
    and no prompt logprobs (the prefill computed them over the real prompt)."""
    produced = list(new_token_ids(first))
    sampling = request.sampling.clone()
    sampling.max_tokens = sampling.max_tokens - len(produced)
    sampling.min_tokens = max(0, sampling.min_tokens - len(produced))
    sampling.prompt_logprobs = None
    return replace(request, prompt_token_ids=request.prompt_token_ids + tuple(produced), sampling=sampling)


@dataclass(frozen=True)
class FirstTokenOffset:
    """Decode counts the reused token as prompt; the client counts it as output: decode's
    cumulative logprob lacks the first token's."""

    first_cumulative_logprob: Optional[float]

    def apply(self, output: Any) -> Any:
        if self.first_cumulative_logprob is None:
            return output
        output = copy.copy(output)
        output.outputs = [replace(c, cumulative_logprob=None if c.cumulative_logprob is None
                                  else c.cumulative_logprob + self.first_cumulative_logprob)
                          for c in output.outputs]
        return output


def tokens_to_load(params: Optional[dict[str, Any]], vllm_count: int, num_computed_tokens: int) -> int:
    """vLLM's count of prompt tokens to pull over NIXL, capped at what the prefill computed
    (`remote_num_tokens` in its kv_transfer_params): with a reused first token the decode
    prompt is one token longer than the KV the prefill holds (kv_transfer/connector.py)."""
    if not params or not params.get("do_remote_prefill") or vllm_count <= 0:
        return vllm_count
    remote = params.get("remote_num_tokens")
    if not isinstance(remote, int) or remote <= 0:
        return vllm_count
    return max(0, min(vllm_count, remote - num_computed_tokens))
