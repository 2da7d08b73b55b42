"""What a pool call's answer means to the P/D path: the typed outcomes hops.py gives path.py,
and the readings of Serve's answers (a stream's first-token deadline, a full queue, an engine's
refusal, a prefill result) that hops.py applies."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, AsyncIterator, Literal, Mapping, Optional

from cluster.protocol import InvalidEngineRequest, PrefillResult, finish_reason
from kv_transfer.handoff import Handoff, HandoffMismatch
from router.openai.errors import bad_request

if TYPE_CHECKING:
    from vllm.outputs import RequestOutput

PrefillFailure = Literal["prefill_timeout", "bad_handoff", "prefill_error"]
WholeFailure = Literal["prefill_timeout", "prefill_queue_full", "prefill_error"]
PoolState = Literal["ready", "busy", "no answer", "down"]
# How decode outputs reach the gateway: one Ray item per engine step for all of this gateway's
# requests on a replica (channels.py), or one per output per request (each its own Serve stream).
DecodeStreams = Literal["per_step", "per_request"]


@dataclass(frozen=True)
class PrefillAnswer:
    """A prefill hop's outcome. `failed` None: the prompt's KV waits on the prefill replica for
    decode's pull through `handoff` (None when `first` already ended the answer), `first` is the
    answer's first token when it was asked for, `prompt_logprobs` when the request asked for
    them. Else `failed` says why decode computes the prompt itself, and the rest is None."""

    handoff: Optional[Handoff] = None
    first: Optional[RequestOutput] = None
    prompt_logprobs: Optional[list] = None
    failed: Optional[PrefillFailure] = None


@dataclass(frozen=True)
class Health:
    ready: bool  # every pool of every tier can take requests: ready or busy
    pools: Mapping[str, PoolState]  # deployment name → its state


class WholeFailed(Exception):
    """The whole request on prefill failed before its first token: decode computes it."""

    def __init__(self, reason: WholeFailure):
        super().__init__(reason)
        self.reason: WholeFailure = reason


class NoFirstToken(Exception):
    """The stream yielded no first token within its deadline."""



def answer_of(result: PrefillResult) -> PrefillAnswer:
    """What a prefill replica's result is worth to the path; raises when decode cannot use it."""
    first = result.first
    ended = None if first is None else finish_reason(first)
    if ended in ("error", "abort"):
        raise RuntimeError(f"the prefill engine ended the request with {ended!r}")
    handoff = None
    if ended is None:  # else: the answer ended on token 1
        handoff = result.handoff  # the prefill replica's, stamped; decode checks it
        if handoff is None:
            raise HandoffMismatch("the prefill replica returned no handoff")
    return PrefillAnswer(handoff, first, result.prompt_logprobs)


async def first_token_within(stream: Any, timeout_s: Optional[float]) -> AsyncIterator[RequestOutput]:
    """The stream, with a deadline on its first chunk only (later gaps are the engine's pace);
    None: no deadline."""
    it = stream.__aiter__()
    try:
        first = await asyncio.wait_for(it.__anext__(), timeout_s)
    except StopAsyncIteration:
        return
    except asyncio.TimeoutError:
        raise NoFirstToken() from None
    yield first
    async for chunk in it:
        yield chunk


def is_backpressure(exc: BaseException) -> bool:
    """Serve refused the call: the deployment's max_queued_requests is reached."""
    from ray.serve.exceptions import BackPressureError

    return isinstance(exc, BackPressureError) or isinstance(getattr(exc, "cause", None), BackPressureError)


def refused(exc: InvalidEngineRequest) -> Exception:
    """The engine refused the request: the same request would fail again, a 400."""
    cause = getattr(exc, "cause", exc)  # Ray wraps it; the cause holds the plain message
    return bad_request(f"The engine refused the request: {cause}")
