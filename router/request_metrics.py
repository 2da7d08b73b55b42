"""What each request looked like to its client, per tier: outcome, TTFT, inter-token latency,
end-to-end latency, tokens. The SLO dashboards and alerts are built on these.

`MeasuredBackend(backend)` wraps the gateway's outermost OpenAIBackend (the
admission control), so TTFT includes time queued for admission, and 429s are counted as the
outcome they are. The clock starts when the edge asks for the stream, after parsing and
tokenizing (microseconds to a few ms); HTTP-level failures before that (400, 401, 404, 413)
are counted by status code in `tandem_http_responses` instead.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, AsyncIterator, Collection, Optional, Sequence

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cluster.metrics import Counter, Histogram
from cluster.protocol import EngineRequest, finish_reason, new_token_ids
from router.backend import Backend
from router.openai.errors import OpenAIError

if TYPE_CHECKING:
    from vllm.outputs import RequestOutput

HTTP_RESPONSES = Counter(
    "tandem_http_responses", "HTTP responses of the gateway by route and status code.", ["route", "status"]
)
REQUESTS = Counter(
    "tandem_requests",
    "Generation requests by tier and outcome: ok (stop/length), rejected_429, error_<status>, "
    "error (engine or cluster failure), cancelled (client went away).",
    ["tier", "outcome"],
)
TTFT_SECONDS = Histogram("tandem_ttft_seconds", "Time to first token as the client sees it (incl. admission queue).",
                         ["tier"])
ITL_SECONDS = Histogram("tandem_itl_seconds", "Inter-token latency: the gap between streamed tokens, per token.",
                        ["tier"])
E2E_SECONDS = Histogram("tandem_e2e_seconds", "End-to-end latency of finished requests.", ["tier"])
PROMPT_TOKENS = Counter("tandem_prompt_tokens", "Prompt tokens of admitted requests.", ["tier"])
OUTPUT_TOKENS = Counter("tandem_output_tokens", "Tokens streamed to clients.", ["tier"])
# By LoRA adapter (model.lora_adapters; recorded only when adapters are configured): beside the
# per-tier series rather than a label on them, so a config without LoRA exports exactly what it
# did, and the per-token cost grows only where adapters are served. The `adapter` label is a
# configured name or "base" (adapter_label): a bounded set.
ADAPTER_REQUESTS = Counter("tandem_adapter_requests", "Generation requests by tier, LoRA adapter (or base) and "
                           "outcome, as tandem_requests.", ["tier", "adapter", "outcome"])
ADAPTER_TTFT_SECONDS = Histogram("tandem_adapter_ttft_seconds", "Time to first token by LoRA adapter (or base), "
                                 "as tandem_ttft_seconds.", ["tier", "adapter"])
ADAPTER_PROMPT_TOKENS = Counter("tandem_adapter_prompt_tokens", "Prompt tokens of admitted requests by LoRA "
                                "adapter (or base).", ["tier", "adapter"])
ADAPTER_OUTPUT_TOKENS = Counter("tandem_adapter_output_tokens", "Tokens streamed to clients by LoRA adapter (or "
                                "base).", ["tier", "adapter"])
BASE = "base"
OTHER_ADAPTER = "other"  # an adapter not in the config (none reach here today: they get a 404 at the edge)


OUTCOMES = ("ok", "error", "cancelled", "rejected_429")


def adapter_label(request: EngineRequest, adapters: Collection[str]) -> str:
    """The `adapter` label of a request (pure): its adapter's name when configured, "base" without
    one; any other name is "other", so a client's choice of name never makes a new series."""
    if request.adapter is None:
        return BASE
    return request.adapter.name if request.adapter.name in adapters else OTHER_ADAPTER


def declare_series(tiers: Sequence[str], adapters: Collection[str] = ()) -> None:
    """Create the gateway's per-tier counters at 0, so rates and alerts read 0 before the first
    event instead of "no data" (the observability test checks every used name is exported)."""
    from router import admission
    from router import path_metrics as disagg
    from router.openai.edge import READY_WAITS
    from router.pd import migration
    from router.routing import metrics as routing

    for tier in tiers:
        for outcome in OUTCOMES:
            REQUESTS.labels(tier=tier, outcome=outcome).inc(0)
            for adapter in (BASE, *adapters) if adapters else ():
                ADAPTER_REQUESTS.labels(tier=tier, adapter=adapter, outcome=outcome).inc(0)
        for path, reason in (("disaggregated", ""), ("decode_only", ""), ("router_error", ""),
                             ("fallback_recompute", "prefill_error"), ("fallback_recompute", "prefill_timeout"),
                             ("fallback_recompute", "bad_handoff")):
            disagg.ROUTES.labels(tier=tier, path=path, reason=reason).inc(0)
        disagg.DECODE_RETRIES.labels(tier=tier).inc(0)
        disagg.FIRST_TOKEN.labels(tier=tier, path="prefill", reason="").inc(0)
        routing.PD_DECISIONS.labels(tier=tier, path="remote", reason="prefill_ok").inc(0)
        for reason in ("no_first_token", "queue_full"):
            disagg.DECODE_REFUSED.labels(tier=tier, reason=reason).inc(0)
        for reason in ("queue_full", "queue_timeout", "expected_wait"):
            admission.REJECTED.labels(tier=tier, reason=reason).inc(0)
        routing.PROMPT_TOKENS.labels(tier=tier).inc(0)
        for reason in migration.FAILURES:
            disagg.MIGRATIONS.labels(tier=tier, reason=reason, result="continued").inc(0)
        for reason in migration.REFUSALS:
            disagg.MIGRATIONS.labels(tier=tier, reason=reason, result="refused").inc(0)
    routing.INDEX_ERRORS.inc(0)
    for result in ("served", "timed_out", "full", "off"):
        READY_WAITS.labels(result=result).inc(0)
    disagg.HEALTH_PROBES.inc(0)
    for kind in ("batch", "gap", "replayed", "reset", "index_down", "malformed", "rebuild",
                 "restarted"):  # router/kv_events.py, router/routing/service.py
        routing.KV_EVENTS.labels(kind=kind).inc(0)


def outcome_of(exc: Optional[BaseException], finish_reason: Optional[str]) -> str:
    """The `outcome` label of a finished request (pure; unit-tested)."""
    closed = isinstance(exc, (asyncio.CancelledError, GeneratorExit))
    if exc is None or closed and finish_reason is not None:
        # The edge closes the stream as soon as it sees the last chunk: that is a finish.
        return "ok" if finish_reason in ("stop", "length") else "error"
    if closed:
        return "cancelled"
    if isinstance(exc, OpenAIError):
        return "rejected_429" if exc.status == 429 else f"error_{exc.status}"
    return "error"


class MeasuredBackend:
    """An OpenAIBackend that records per-request metrics around another one."""

    def __init__(self, backend: Backend, adapters: Collection[str] = ()):
        self.backend = backend
        self.adapters = frozenset(adapters)  # model.lora_adapters' names; empty: no per-adapter series

    async def generate(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        tier = request.tier
        adapter = adapter_label(request, self.adapters) if self.adapters else None
        started = last = time.perf_counter()
        first = True
        finish: Optional[str] = None
        failure: Optional[BaseException] = None
        try:
            async for chunk in self.backend.generate(request):
                now = time.perf_counter()
                tokens = len(new_token_ids(chunk))
                if tokens:
                    if first:
                        TTFT_SECONDS.labels(tier=tier).observe(now - started)
                        PROMPT_TOKENS.labels(tier=tier).inc(len(request.prompt_token_ids))
                        if adapter is not None:
                            ADAPTER_TTFT_SECONDS.labels(tier=tier, adapter=adapter).observe(now - started)
                            ADAPTER_PROMPT_TOKENS.labels(tier=tier, adapter=adapter).inc(len(request.prompt_token_ids))
                        first = False
                        tokens_after_first = tokens - 1
                    else:
                        tokens_after_first = tokens
                    if tokens_after_first:
                        # A chunk of n tokens after a gap g: n gaps of g/n, as vLLM's own ITL counts them.
                        gap = (now - last) / tokens_after_first
                        for _ in range(tokens_after_first):
                            ITL_SECONDS.labels(tier=tier).observe(gap)
                    OUTPUT_TOKENS.labels(tier=tier).inc(tokens)
                    if adapter is not None:
                        ADAPTER_OUTPUT_TOKENS.labels(tier=tier, adapter=adapter).inc(tokens)
                    last = now
                finish = finish_reason(chunk) or finish
                yield chunk
        except BaseException as exc:
            failure = exc
            raise
        finally:
            outcome = outcome_of(failure, finish)
            REQUESTS.labels(tier=tier, outcome=outcome).inc()
            if adapter is not None:
                ADAPTER_REQUESTS.labels(tier=tier, adapter=adapter, outcome=outcome).inc()
            if outcome == "ok":
                E2E_SECONDS.labels(tier=tier).observe(time.perf_counter() - started)

    async def abort(self, request_id: str) -> None:
        await self.backend.abort(request_id)

    async def health(self) -> dict[str, Any]:
        return await self.backend.health()


# Paths are a label: only the API's own routes, so scanners cannot blow up the series count.
_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health")


def route_label(path: str) -> str:
    for route in _ROUTES:
        if path == route or path.startswith(route + "/"):
            return route
    return "other"


class HttpMetricsMiddleware:
    """Counts every HTTP response by route and status (pure ASGI: streaming stays untouched)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = route_label(scope.get("path", ""))

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                HTTP_RESPONSES.labels(route=route, status=str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, counting_send)
