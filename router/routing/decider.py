"""The P/D decider: remote prefill then decode, local prefill on the decode engine, or the
whole request on the prefill engine?

A remote prefill pays two hops and a KV transfer, and queues behind the prefill engine's other
prompts, to keep the prompt's computation off the decode engine, whose running streams would
otherwise wait for it (chunked: each step carries at most the engine's token budget). Neither
path always wins (TaiChi, 2025): aggregation wins under tight TTFT objectives, disaggregation
under tight per-token ones. So each request is decided from live state and the engines' cost
models (cost_model.py), against its tier's objectives:

- ttft_remote = the prefill engine's predicted time for its queue plus this prompt's uncached
  part (first-token reuse: the prefill's token is the first one);
- ttft_local = the chunks of the decode engine's queued local prompts and this prompt's
  uncached part, each step a decode step of the running batch plus the chunk's prompt tokens
  at the prefill slope;
- gap_local = the longest token gap the running streams see while those chunks run.

Local prefill keeps the running streams' promises when there are none, or when that gap stays
within the tier's every-gap bound (gap_s) and the decode engine's own step at the batch it
would run stays within the mean-ITL objective (itl_s): "the gap holds".

Rules, in order (the reason is the metric label):
1. mode "never": local ("never"); mode "always": remote ("always") unless rule 2.
2. uncached on decode < decode_only_below_tokens (a fixed threshold, 0 = off): local
   ("short_uncached"), as before adaptive existed.
3. adaptive, the gap holds, local is no slower than remote with an idle prefill engine, and
   the prompt's computation costs the decode engine less than the remote path's fixed
   overhead (the prefill line's intercept): local ("short_uncached"): the hops cost more
   than the prompt.
4. remote meets ttft_s and the prefill engine's queue takes at most REMOTE_QUEUE_SHARE of the
   slack an idle prefill engine would leave: remote ("prefill_ok"): the decode engine stays
   free for its streams. Past that share the prefill engine is the bottleneck: letting its
   queue spend the whole objective would leave both engines' prompts on one core, and no
   margin for the predictions' error.
5. local when the gap holds and local is faster ("prefill_queue" when an idle prefill engine
   would have met ttft_s, else "local_faster"): the two engines share the prompts.
6. remote otherwise: "prefill_ok" when it meets ttft_s; else why not local: "decode_itl_budget"
   (the decode engine's own step at its batch plus one is past itl_s), "decode_gap_budget"
   (the running streams' gap with the chunk is past gap_s), "overloaded" (local is slower too).
7. a remote verdict of rules 4-6 for a short answer (max_tokens <= whole_on_prefill_max_tokens)
   becomes "whole" ("short_output") when the prefill engine has no other prompt queued, and
   its chunk (a step with one chunk of a prompt that arrives meanwhile) keeps a stream's gap
   within gap_s, or within the gap the handoff itself puts between the first and second token
   of one request in ten (the decode engine's observed handoff times, cost_model.py; 300-500
   ms on the 2-core VM, past its every-gap bound, RESULTS.md section 8). The prompt is
   computed where remote would compute it, and the few tokens after it, at that engine's
   decode pace, cost it less than the decode hop and the KV transfer. With prompts queued,
   every step of that engine carries a chunk, and a whole answer's mean gap is the chunk's
   (measured: it cost more of the mean-ITL goodput than it gained on the every-gap one).
8. a remote verdict of rules 4-6 for any answer becomes "whole" ("decode_full") when the
   decode engine is at its bound (one more stream there puts its step past itl_s) while the
   prefill engine has room for a stream: the prompt meets ttft_s in its queue, its own step
   with one more stream stays within itl_s, and a step carrying one prompt chunk within
   gap_s. Without it, on one core per engine, every stream decodes on one core while the
   other only prefills; at the load where the decode core saturates, the prefill core still
   has time (RESULTS.md section 8: tandem's decode mean ITL p50 118-123 ms at its 124 ms
   bound while colocated engines, each doing both, ran at 68-72 ms). The prefill engine's
   step model is fitted from the gaps of the streams it runs, so once its chunks slow them
   past itl_s the rule stops sending more (routing.whole_on_prefill_when_decode_full, off by
   default: it never fired in RESULTS.md section 9's runs, where prefill saturated first).
9. a remote verdict of rules 4-6 reuses the prefill's sampled token as the answer's first
   (kv_transfer.first_token_reuse) only when that pays: the handoff (the decode engine's
   observed time to its first token after a remote prefill, one request in ten) then sits
   between the first and second token, so reuse keeps the TTFT objective when waiting for
   decode's first token would miss ttft_s, and otherwise only when that gap is within gap_s
   and the answer's mean gap with it within itl_s. Measured (RESULTS.md section 9): with reuse
   on every request the 8-token answers' gap after the first token was ~540 ms p50 on the
   2-core EPYC, 10 of 15 missed the mean ITL objective, while Ray Serve LLM's P/D, which never
   reuses, met both objectives for every request at the same load.

Pure: `decide` reads only its frozen inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Optional

from router.routing.cost_model import EngineCostModel
from router.routing.types import Path

Mode = Literal["adaptive", "always", "never"]
MIN_CHUNK_TOKENS = 16  # a decode engine whose batch fills its budget still prefills a little per step
REMOTE_QUEUE_SHARE = 0.5  # of the TTFT slack an idle prefill engine leaves, its queue may take (rule 4)


@dataclass(frozen=True)
class PDDecider:
    """The policy (from routing config). The dataclass default is `always`, today's behaviour
    for code that builds routers by hand; the cluster config defaults to adaptive."""

    decode_only_below_tokens: int = 0
    mode: Mode = "always"
    whole_on_prefill_max_tokens: int = 0  # rule 7; 0 = off
    whole_when_decode_full: bool = False  # rule 8

    def skip_prefill(self, prompt_tokens: int, cached_on_decode_tokens: int) -> bool:
        """The fixed threshold alone (rule 2)."""
        uncached = max(prompt_tokens - cached_on_decode_tokens, 0)
        return uncached < self.decode_only_below_tokens


@dataclass(frozen=True)
class RequestView:
    prompt_tokens: int
    cached_on_decode: int = 0  # leading prompt tokens the chosen decode engine holds
    cached_on_prefill: int = 0  # ... the chosen prefill engine holds
    max_tokens: Optional[int] = None  # the answer's bound; None: unknown


@dataclass(frozen=True)
class PrefillView:
    queued_tokens: int  # uncached prompt tokens queued or running on the chosen prefill engine
    model: EngineCostModel = EngineCostModel()
    chunk_budget_tokens: int = 2048  # the engine's max_num_batched_tokens per step (vLLM's default)
    running_seqs: int = 0  # requests running on it: its prefills and the streams it runs whole (rule 8)


@dataclass(frozen=True)
class DecodeView:
    running_seqs: int  # streams decoding on the chosen decode engine
    chunk_budget_tokens: int  # the engine's max_num_batched_tokens per step
    model: EngineCostModel = EngineCostModel()
    queued_tokens: int = 0  # uncached prompt tokens of local prefills sent to it, not yet at their first token


@dataclass(frozen=True)
class Objectives:
    ttft_s: float
    itl_s: float  # mean inter-token latency
    gap_s: float  # every token gap


@dataclass(frozen=True)
class Decision:
    path: Path
    reason: str
    ttft_remote_s: float
    ttft_local_s: float
    gap_local_s: float  # 0 with no running streams to delay
    reuse_first_token: bool = True  # rule 9: stream the prefill's token as the first (remote path)


def predict_remote_ttft(req: RequestView, prefill: PrefillView, queued: bool = True) -> float:
    uncached = max(req.prompt_tokens - req.cached_on_prefill, 0)
    return prefill.model.prefill_s((prefill.queued_tokens if queued else 0) + uncached)


def predict_local(req: RequestView, decode: DecodeView, per_token_s: float) -> tuple[float, float]:
    """(ttft, longest gap of the running streams) with the prompt chunked on the decode engine,
    behind the local prompts already queued there."""
    uncached = max(req.prompt_tokens - req.cached_on_decode, 0)
    ahead = max(decode.queued_tokens, 0)
    running = decode.running_seqs
    chunk = max(decode.chunk_budget_tokens - running, MIN_CHUNK_TOKENS)
    steps = max(math.ceil((ahead + uncached) / chunk), 1)
    step = decode.model.step_s(running + 1)  # this request joins the batch
    ttft = steps * step + per_token_s * (ahead + uncached)
    gap = 0.0 if running == 0 else decode.model.step_s(running) + per_token_s * min(uncached, chunk)
    return ttft, gap


def decide(policy: PDDecider, req: RequestView, prefill: PrefillView, decode: DecodeView,
           objectives: Objectives) -> Decision:
    per_token = prefill.model.per_token_s()
    ttft_remote = predict_remote_ttft(req, prefill)
    ttft_local, gap_local = predict_local(req, decode, per_token)

    def out(path: Path, reason: str, reuse_first_token: bool = True) -> Decision:
        return Decision(path, reason, ttft_remote, ttft_local, gap_local, reuse_first_token)

    if policy.mode == "never":
        return out("local", "never")
    if policy.skip_prefill(req.prompt_tokens, req.cached_on_decode):
        return out("local", "short_uncached")
    if policy.mode == "always":
        return out("remote", "always")
    verdict = _adaptive(req, prefill, decode, objectives, per_token, ttft_remote, ttft_local, gap_local)
    if verdict[0] == "remote" and _whole_fits(policy, req, prefill, decode, objectives):
        return out("whole", "short_output")
    if verdict[0] == "remote" and policy.whole_when_decode_full and _prefill_takes_stream(
            req, prefill, decode, objectives, ttft_remote):
        return out("whole", "decode_full")
    path, reason = verdict
    return out(path, reason, path != "remote" or _reuse_pays(req, decode, objectives, ttft_remote))


def _decode_at_bound(decode: DecodeView, objectives: Objectives) -> bool:
    """One more stream would put the decode engine's step past the mean-ITL objective."""
    return decode.running_seqs > 0 and decode.model.step_s(decode.running_seqs + 1) > objectives.itl_s


def _reuse_pays(req: RequestView, decode: DecodeView, objectives: Objectives, ttft_remote: float) -> bool:
    """Rule 9: the prefill's token as the first saves the handoff's time on TTFT, and puts it as
    a gap between the first and second token. Worth it when that gap keeps the stream within
    its objectives, or when waiting for decode's first token would miss ttft_s."""
    handoff = decode.model.handoff_s()
    if ttft_remote + handoff > objectives.ttft_s:
        return True
    step = decode.model.step_s(decode.running_seqs + 1)
    gaps = (req.max_tokens or 0) - 1  # the answer's token gaps; unknown length: judge the gap alone
    mean = step + (handoff - step) / gaps if gaps > 0 else step
    return handoff <= objectives.gap_s and mean <= objectives.itl_s


def _prefill_takes_stream(req: RequestView, prefill: PrefillView, decode: DecodeView, objectives: Objectives,
                          ttft_remote: float) -> bool:
    """Rule 8's condition: the decode engine is at its bound and the prefill engine has room."""
    if not _decode_at_bound(decode, objectives):
        return False
    if ttft_remote > objectives.ttft_s:  # the prefill engine is the bottleneck too
        return False
    step = prefill.model.step_s(prefill.running_seqs + 1)
    uncached = max(req.prompt_tokens - req.cached_on_prefill, 0)
    chunk = min(prefill.queued_tokens + uncached, prefill.chunk_budget_tokens)
    return step <= objectives.itl_s and step + prefill.model.per_token_s() * chunk <= objectives.gap_s


def _whole_fits(policy: PDDecider, req: RequestView, prefill: PrefillView, decode: DecodeView,
                objectives: Objectives) -> bool:
    if req.max_tokens is None or not 0 < req.max_tokens <= policy.whole_on_prefill_max_tokens:
        return False
    if prefill.queued_tokens > 0:
        return False
    # Its tokens share the prefill engine's steps with other prompts' chunks.
    gap = prefill.model.step_s(1) + prefill.model.per_token_s() * prefill.chunk_budget_tokens
    return gap <= max(objectives.gap_s, decode.model.handoff_s())


def _adaptive(req: RequestView, prefill: PrefillView, decode: DecodeView, objectives: Objectives, per_token: float,
              ttft_remote: float, ttft_local: float, gap_local: float) -> tuple[Path, str]:
    """Rules 3-6."""
    step_ok = not _decode_at_bound(decode, objectives)
    gap_ok = step_ok and (decode.running_seqs == 0 or gap_local <= objectives.gap_s)
    overhead_s = prefill.model.prefill.coefficients()[0]
    uncached_local = max(req.prompt_tokens - req.cached_on_decode, 0)
    ttft_idle = predict_remote_ttft(req, prefill, queued=False)
    if gap_ok and per_token * uncached_local <= overhead_s and ttft_local <= ttft_idle:
        return ("local", "short_uncached")
    slack = objectives.ttft_s - ttft_idle
    if ttft_remote <= objectives.ttft_s and ttft_remote - ttft_idle <= REMOTE_QUEUE_SHARE * slack:
        return ("remote", "prefill_ok")
    if gap_ok and ttft_local < ttft_remote:
        return ("local", "prefill_queue" if ttft_idle <= objectives.ttft_s else "local_faster")
    if ttft_remote <= objectives.ttft_s:
        return ("remote", "prefill_ok")
    if not step_ok:
        return ("remote", "decode_itl_budget")
    return ("remote", "decode_gap_budget" if not gap_ok else "overloaded")
