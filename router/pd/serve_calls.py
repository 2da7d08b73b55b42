"""Each call the gateway makes to a pool is a request of its own in Ray Serve's router.

Serve's handle copies the caller's request context into every call it makes, its internal
request id included, so every hop of one HTTP request carries the proxy's id for it. Serve's
request router (2.60, request_router.py) indexes the requests waiting for a replica by that
id: two calls of one HTTP request waiting on one pool at once (a list of prompts, n > 1
samples) collide there, and one of them can wait forever (found by the compat corpus'
`"prompt": [[...], [...]]`: a prefill hop stuck until its timeout, a decode hop until the
client gave up). `remote(method, *args)` makes the call with an internal id of its own; the
request id that logs show (the client's) stays.
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from typing import Any, Iterator


@contextlib.contextmanager
def own_request_id() -> Iterator[None]:
    """A fresh Serve internal request id for the handle calls made inside (`.remote()`
    reads the context when it is called, not when it is awaited)."""
    from ray.serve import context

    current = context._get_serve_request_context()
    token = context._serve_request_context.set(dataclasses.replace(current, _internal_request_id=str(uuid.uuid4())))
    try:
        yield
    finally:
        context._serve_request_context.reset(token)


def remote(method: Any, *args: Any) -> Any:
    """`method.remote(*args)` (a deployment handle's method, streaming or not) as a request of
    its own: the DeploymentResponse or response generator, to await or iterate."""
    with own_request_id():
        return method.remote(*args)
