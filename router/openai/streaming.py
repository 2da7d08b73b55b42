"""Driving a backend stream to the client, with the guarantee that abandoned work is aborted.

A decode that nobody will read still occupies a KV cache and a batch slot, so every way a
request can end early (client disconnect seen by Starlette, a failed socket write, a task
cancelled at shutdown, a backend error) must end in `backend.abort(request_id)`. The
cleanup runs shielded from cancellation: under anyio a cancelled scope would otherwise
cancel the abort call itself.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from typing import Any, AsyncIterator, Awaitable, Callable, Optional, TypeVar

import anyio
from fastapi import Request
from starlette.requests import ClientDisconnect
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from cluster.protocol import EngineRequest, TokenChunk
from router.openai.backend import OpenAIBackend
from router.openai.errors import OpenAIError, internal_error
from router.openai.responses import (
    DONE,
    Accumulator,
    ResponseContext,
    ToolResult,
    check_finish_reason,
    error_event,
    sse,
    stream_chunk,
    usage_chunk,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected before we had anything to send."""


async def open_stream(backend: OpenAIBackend, request: EngineRequest) -> AsyncIterator[TokenChunk]:
    """Call `backend.generate`, accepting an async generator or a coroutine returning one."""
    it: Any = backend.generate(request)
    if inspect.isawaitable(it):
        it = await it
    return it  # type: ignore[no-any-return]


async def finish(backend: OpenAIBackend, it: Any, request_id: str, finished: bool) -> None:
    """Abort unfinished work and close the backend iterator, immune to cancellation."""
    with anyio.CancelScope(shield=True):
        if not finished:
            try:
                await backend.abort(request_id)
            except Exception:  # the abort is best effort; the client is gone anyway
                logger.warning("abort of %s failed", request_id, exc_info=True)
        aclose = getattr(it, "aclose", None)
        if aclose is not None:
            try:
                await aclose()
            except Exception:
                logger.debug("closing the stream of %s failed", request_id, exc_info=True)


async def _wait_disconnect(request: Request) -> None:
    """Returns when the client goes away (the body is already read, so only that is left)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def race_disconnect(request: Request, make: Callable[[], Awaitable[T]]) -> T:
    """Await `make()`, but raise `ClientGone` (after cancelling it) if the client leaves first.

    Used before any byte is sent (non-streaming answers, and the wait for a stream's first
    token), where Starlette itself does not watch for disconnects.
    """
    work: asyncio.Task[T] = asyncio.ensure_future(make())
    watch = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (watch, work):
            if not task.done():
                task.cancel()
        with anyio.CancelScope(shield=True):
            await asyncio.gather(watch, work, return_exceptions=True)
    if work.done() and not work.cancelled():
        return work.result()  # also when both finished at once: the answer wins
    raise ClientGone()


class StreamGuard:
    """Runs a request's end-of-life cleanup exactly once, from whichever path gets there.

    The event generator's `finally` usually does it; `SSEResponse` does it too, for the
    case where the response is torn down before the generator ever started (an async
    generator that never ran has no `finally` to run).
    """

    def __init__(self, backend: OpenAIBackend, request_id: str, it: Any = None) -> None:
        self.backend = backend
        self.request_id = request_id
        self.it = it
        self.finished = False
        self._closed = False

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await finish(self.backend, self.it, self.request_id, self.finished)


class SSEResponse(StreamingResponse):
    """A StreamingResponse that always closes its generator, however sending ends.

    With ASGI spec 2.4 servers a dead socket surfaces as an exception from `send`, which
    leaves the generator suspended (its `finally`, and so the abort, would run only when
    the garbage collector gets to it); closing it here makes the abort immediate.
    """

    def __init__(self, content: AsyncIterator[bytes], guard: StreamGuard, **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self.guard = guard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            if _spec_version(scope) < (2, 4):
                await super().__call__(scope, receive, send)  # Starlette watches receive()
            else:
                await self._stream_watching_disconnect(scope, receive, send)
        except ClientDisconnect:
            pass  # the client hung up (spec 2.4 servers): nobody is left to tell
        finally:
            with anyio.CancelScope(shield=True):
                aclose = getattr(self.body_iterator, "aclose", None)
                if aclose is not None:
                    await aclose()
                await self.guard.close()

    async def _stream_watching_disconnect(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Spec 2.4 servers report a hang-up only on the next send; a stalled engine may
        not send for a long time, so listen for `http.disconnect` ourselves as well."""
        async with anyio.create_task_group() as group:

            async def watch() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                group.cancel_scope.cancel()

            group.start_soon(watch)
            await super().__call__(scope, receive, send)
            group.cancel_scope.cancel()


def _spec_version(scope: Scope) -> tuple[int, ...]:
    raw = str(scope.get("asgi", {}).get("spec_version", "2.0"))
    try:
        return tuple(int(p) for p in raw.split("."))
    except ValueError:
        return (2, 0)


async def sse_events(
    guard: StreamGuard,
    first: Optional[TokenChunk],
    ctx: ResponseContext,
    acc: Accumulator,
    edge_request_id: str,
    parse_tools: Optional[Callable[[Accumulator], ToolResult]] = None,
) -> AsyncIterator[bytes]:
    """The SSE body: deltas, the optional usage chunk, `[DONE]`; errors become one event.

    With `parse_tools` the answer may hold tool calls, which only parse whole: the deltas
    are held back and the parsed answer goes out as one delta with the finish reason."""
    try:
        if ctx.chat:
            yield sse(stream_chunk(ctx, "", first=True))
        first_content = not ctx.chat
        chunk = first
        while chunk is not None:
            offset = acc.text_length
            acc.add(chunk)
            if chunk.finish_reason is not None:
                guard.finished = True
            check_finish_reason(chunk.finish_reason, edge_request_id)
            if parse_tools is not None:
                if chunk.finish_reason is not None:
                    result = parse_tools(acc)
                    yield sse(stream_chunk(ctx, "", acc.token_ids, result.finish_reason, False, acc.logprobs,
                                           tools=result))
            elif chunk.text or chunk.finish_reason is not None or (ctx.return_token_ids and chunk.token_ids):
                yield sse(stream_chunk(ctx, chunk.text, chunk.token_ids, chunk.finish_reason, first_content,
                                       chunk.logprobs, offset))
                first_content = False
            if chunk.finish_reason is not None:
                break
            chunk = await anext(guard.it, None)
        if not guard.finished:
            logger.error("stream %s ended without a finish reason", guard.request_id)
            raise internal_error(edge_request_id)
        if ctx.include_usage:
            yield sse(usage_chunk(ctx, acc))
        yield DONE
    except OpenAIError as exc:
        yield error_event(exc)
        yield DONE
    except Exception:
        logger.exception("stream %s (request %s) failed", guard.request_id, edge_request_id)
        yield error_event(internal_error(edge_request_id))
        yield DONE
    finally:
        await guard.close()
