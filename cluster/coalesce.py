"""Coalescing a stream: everything that is ready goes out as one item; nothing waits.

A token stream crosses two Ray hops (decode replica → gateway, gateway → Serve's HTTP
proxy), and each item costs a Ray message and Python work on both sides. When the reader is
slower than the engine for a moment (a busy core, a GC pause), per-token items queue up and
then arrive in a burst, each still paying its own way. `coalesced` reads the source in a
task of its own into a buffer; the reader takes the whole buffer each time it asks and gets
it merged into one item. So:

- no item waits for a later one: the reader gets whatever is there the moment it asks, and
  a lone token goes out alone;
- order is kept (one buffer, appended by one task);
- the reader leaving (aclose, cancellation) cancels the reading task and closes the source
  at once, which is what aborts the request in the engine;
- an error of the source reaches the reader after the items read before it.

Used by the decode replica over the engine's RequestOutputs (decode_workers/), and by the prefill
replica for a request it runs whole (prefill_workers/).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import AsyncIterator, Callable, Sequence, TypeVar

T = TypeVar("T")


async def coalesced(source: AsyncIterator[T], merge: Callable[[Sequence[T]], T]) -> AsyncIterator[T]:
    buffer: list[T] = []
    ready = asyncio.Event()
    ended: list[BaseException | None] = []  # [None]: the source is exhausted; [exc]: it failed

    async def read() -> None:
        try:
            async for item in source:
                buffer.append(item)
                ready.set()
        except Exception as exc:  # handed to the reader, after what came before it
            ended.append(exc)
        else:
            ended.append(None)
        ready.set()

    reader = asyncio.ensure_future(read())
    try:
        while True:
            await ready.wait()
            ready.clear()
            if buffer:
                items, buffer[:] = list(buffer), []
                yield items[0] if len(items) == 1 else merge(items)
            if ended and not buffer:
                if ended[0] is not None:
                    raise ended[0]
                return
    finally:
        if not reader.done():
            reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await reader
        aclose = getattr(source, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()
