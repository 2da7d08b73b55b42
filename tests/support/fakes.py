"""The one home of test fakes, so every unit suite fakes the same, small, honest things.

Fakes stand in for the engine side only in unit tests of the edge's own logic (HTTP
contract, validation, streaming, aborts); end-to-end tests use real engines.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator, Optional, Sequence

from cluster.engine.fake_kv_events import block_stored
from cluster.protocol import EngineRequest


def fake_output(request_id: str, text: str, token_ids: Sequence[int], finish_reason: Optional[str] = None,
                cumulative_logprob: Optional[float] = None) -> Any:
    """A vLLM RequestOutput DELTA as an engine yields it (finished when `finish_reason` is set)."""
    from vllm.outputs import CompletionOutput, RequestOutput

    completion = CompletionOutput(0, text, list(token_ids), cumulative_logprob, None, finish_reason=finish_reason)
    return RequestOutput(request_id, None, None, None, [completion], finish_reason is not None)


class FakeBackend:
    """Streams the prompt back, one token per output, deterministically.

    The reply is the prompt's own tokens: with a prompt of P tokens and max_tokens M the
    answer has min(P, M) tokens and finishes "stop" when the echo ends, "length" when M
    cuts it (with ignore_eos the echo repeats until M). Each token's text is "<id> ". Switches
    let a test make it fail, hang, or report an abnormal finish, and it records what the edge
    asked of it.
    """

    def __init__(self) -> None:
        self.ready = True
        self.health_details: dict[str, Any] = {"replicas": 1}
        self.health_raises = False
        self.fail_after: Optional[int] = None  # raise `fail_with` after this many outputs
        self.fail_with: BaseException = RuntimeError("fake engine exploded")
        self.hang_after: Optional[int] = None  # then wait forever (until cancelled)
        self.finish_reason: Optional[str] = None  # force the last output's finish reason
        self.requests: list[EngineRequest] = []
        self.aborted: list[str] = []
        self.closed: list[str] = []  # request ids whose generator was finalized

    def reply_tokens(self, request: EngineRequest) -> list[int]:
        prompt = list(request.prompt_token_ids)
        limit = request.sampling.max_tokens
        if request.sampling.ignore_eos:
            return [prompt[i % len(prompt)] for i in range(limit)]
        return prompt[:limit]

    async def generate(self, request: EngineRequest) -> AsyncIterator[Any]:
        self.requests.append(request)
        tokens = self.reply_tokens(request)
        cut = request.sampling.ignore_eos or request.sampling.max_tokens < len(request.prompt_token_ids)
        reason = self.finish_reason or ("length" if cut else "stop")
        try:
            for i, token in enumerate(tokens):
                if self.fail_after is not None and i == self.fail_after:
                    raise self.fail_with
                if self.hang_after is not None and i == self.hang_after:
                    await asyncio.Event().wait()
                await asyncio.sleep(0)
                last = i == len(tokens) - 1
                yield fake_output(request.request_id, f"{token} ", [token], reason if last else None)
            if not tokens:
                if self.fail_after == 0:
                    raise self.fail_with
                yield fake_output(request.request_id, "", [], reason)
        finally:
            self.closed.append(request.request_id)

    async def health(self) -> dict[str, Any]:
        if self.health_raises:
            raise RuntimeError("health probe crashed")
        return {"ready": self.ready, **self.health_details}

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)


def stored(*hashes: int) -> dict:
    """A BlockStored event as vLLM encodes it."""
    return block_stored(hashes, None, [], block_size=4)


def removed(*hashes: int) -> dict:
    return {"type": "BlockRemoved", "block_hashes": list(hashes), "medium": "CPU"}


class FakeServePool:
    """A Ray Serve handle to one engine pool of named fake replicas, for DisaggregatedBackend.

    It routes the way KVAwareRequestRouter does (router/routing/serve_router.py): a call goes
    to the replica pinned for its request id in the PoolDirectory, else to Serve's own pick
    (here: the replicas in turn). Every call is recorded as (method, request_id, replica).
    `prefill.remote` answers a handoff and, asked for it, a first token (or hangs with
    `hang_prefill`); the decode stream yields one token every 10 ms until cancelled or
    max_tokens, or raises `refuse` first; with `hang_decode` it yields nothing (no capacity),
    with `hang_abort` aborts never answer. `positional`: the stream's tokens are their positions
    in the sequence (prompt length, +1, ...), so an answer continued elsewhere on prompt + the
    tokens sent is the same answer; `die_after` (replica → n): that replica's streams raise
    Ray's ActorDiedError after n tokens, as a replica dying mid-answer does.
    """

    def __init__(self, directory: Any, replica_ids: Sequence[str], hang_prefill: bool = False) -> None:
        from router.routing.directory import ReplicaInfo

        self.directory = directory
        self.replica_ids = list(replica_ids)
        self.hang_prefill = hang_prefill
        directory.set_replicas([ReplicaInfo(r, 8) for r in self.replica_ids])
        self.calls: list[tuple[str, str, str]] = []
        self.refuse: Optional[BaseException] = None
        self.hang_decode = False
        self.positional = False
        self.die_after: dict[str, int] = {}
        self.hang_abort = False
        self.hang_stats = False
        self.stats_error: Optional[BaseException] = None
        self._turn = 0
        self.prefill = _FakeMethod(self, "prefill")
        self.abort = _FakeMethod(self, "abort")
        self.generate = _FakeMethod(self, "generate")
        self.stats = _FakeStats(self)

    def options(self, **_: Any) -> "FakeServePool":
        return self

    def route(self, method: str, request_id: str) -> str:
        replica = self.directory.take_pin(request_id)
        if replica is None:
            replica = self.replica_ids[self._turn % len(self.replica_ids)]
            self._turn += 1
        self.calls.append((method, request_id, replica))
        return replica

    def replica_of(self, method: str, request_id: str) -> list[str]:
        return [r for m, rid, r in self.calls if m == method and rid == request_id]


class _FakeMethod:
    def __init__(self, pool: FakeServePool, name: str) -> None:
        self.pool = pool
        self.name = name

    def remote(self, *args: Any) -> Any:
        request_id = args[0] if isinstance(args[0], str) else args[0].request_id
        replica = self.pool.route(self.name, request_id)
        if self.name == "generate":
            request = args[0]
            return _FakeStream(self.pool.refuse, self.pool.hang_decode, limit=request.sampling.max_tokens,
                               start=len(request.prompt_token_ids) if self.pool.positional else None,
                               die_after=self.pool.die_after.get(replica))
        return self._answer(request_id, first_token=len(args) > 1 and bool(args[1]))

    async def _answer(self, request_id: str, first_token: bool) -> Any:
        from cluster.protocol import PrefillResult

        if self.name == "abort":
            if self.pool.hang_abort:
                await asyncio.Event().wait()
            return None
        if self.pool.hang_prefill:
            await asyncio.Event().wait()
        from kv_transfer.handoff import EngineIdentity, Handoff

        first = fake_output(request_id, "a", [1]) if first_token else None
        params = {"do_remote_prefill": True, "remote_port": 1}
        handoff = Handoff.from_prefill(EngineIdentity("fake", "float32", "auto", 16), params)
        return PrefillResult(request_id, params, "fake", 3, first=first, handoff=handoff)


class _FakeStats:
    def __init__(self, pool: FakeServePool) -> None:
        self.pool = pool

    async def remote(self) -> dict:
        if self.pool.stats_error is not None:
            raise self.pool.stats_error
        if self.pool.hang_stats:
            await asyncio.Event().wait()
        return {}


class _FakeStream:
    def __init__(self, refuse: Optional[BaseException] = None, hang: bool = False, limit: int = 1 << 30,
                 start: Optional[int] = None, die_after: Optional[int] = None) -> None:
        self.cancelled = False
        self.refuse = refuse
        self.hang = hang
        self.left = limit
        self.next = start  # None: every token is 1
        self.yielded = 0
        self.die_after = die_after

    def cancel(self) -> None:
        self.cancelled = True

    def __aiter__(self) -> "_FakeStream":
        return self

    async def __anext__(self) -> Any:
        await asyncio.sleep(0.01)
        if self.hang:
            await asyncio.Event().wait()
        if self.refuse is not None:
            raise self.refuse
        if self.cancelled or self.left <= 0:
            raise StopAsyncIteration
        if self.die_after is not None:
            if self.die_after == 0:
                from ray.exceptions import ActorDiedError

                raise ActorDiedError()
            self.die_after -= 1
        self.left -= 1
        if self.next is None:
            return fake_output("fake", "a", [1], "length" if self.left == 0 else None)
        # Each token's logprob is -1: the stream's cumulative logprob is minus its tokens.
        token, self.next = self.next, self.next + 1
        self.yielded += 1
        return fake_output("fake", "a", [token], "length" if self.left == 0 else None,
                           cumulative_logprob=-float(self.yielded))


class RecordingRayGauge:
    """Stands in for a ray.util.metrics.Gauge inside cluster.metrics.Gauge: keeps every set."""

    def __init__(self) -> None:
        self.sets: list[tuple[float, dict[str, str]]] = []

    def set(self, value: float, tags: dict[str, str]) -> None:
        self.sets.append((value, dict(tags)))


class RecordingMetric:
    """Stands in for a cluster.metrics Counter/Histogram/Gauge: keeps every call, by labels."""

    def __init__(self) -> None:
        self.calls: list[tuple[dict[str, str], str, float]] = []

    def labels(self, *values: str, **labels: str) -> "RecordingMetric._Bound":
        return RecordingMetric._Bound(self, labels)

    def values(self, kind: str, **labels: str) -> list[float]:
        return [v for lbl, k, v in self.calls if k == kind and all(lbl.get(x) == y for x, y in labels.items())]

    class _Bound:
        def __init__(self, parent: "RecordingMetric", labels: dict[str, str]) -> None:
            self.parent, self.labels = parent, labels

        def inc(self, amount: float = 1.0) -> None:
            self.parent.calls.append((self.labels, "inc", amount))

        def observe(self, value: float) -> None:
            self.parent.calls.append((self.labels, "observe", value))

        def set(self, value: float) -> None:
            self.parent.calls.append((self.labels, "set", value))


class FakeGrafana:
    """A tiny Grafana HTTP API on 127.0.0.1 (http.server in a thread) for `tandem grafana-push`:
    the folder and dashboard routes the push uses, each request recorded as
    (method, path, Authorization header, JSON body). `status` makes every request answer that
    HTTP status with Grafana's error shape, e.g. 401 for a rejected token."""

    def __init__(self, token: str, status: int | None = None) -> None:
        import http.server
        import threading

        self.token, self.status = token, status
        self.requests: list[tuple[str, str, str, Any]] = []
        self.folders: dict[str, str] = {}  # uid -> title
        self.dashboards: dict[str, dict] = {}  # uid -> the stored POST body
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # keep test output clean
                pass

            def _answer(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                fake.requests.append((self.command, self.path, self.headers.get("Authorization", ""), body))
                status, answer = fake._route(self.command, self.path.split("?")[0],
                                             self.headers.get("Authorization", ""), body)
                self._answer(status, answer)

            do_GET = do_POST = do_PUT = _handle

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeGrafana":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _route(self, method: str, path: str, auth: str, body: Any) -> tuple[int, Any]:
        if self.status is not None:
            return self.status, {"message": f"fake Grafana answers {self.status}"}
        if auth != f"Bearer {self.token}":
            return 401, {"message": "invalid API key"}
        if (method, path) == ("GET", "/api/folders"):
            return 200, [{"id": i, "uid": uid, "title": title} for i, (uid, title) in enumerate(self.folders.items())]
        if (method, path) == ("POST", "/api/folders"):
            if body["title"] in self.folders.values():
                return 409, {"message": "a folder with the same name already exists"}
            self.folders[body["uid"]] = body["title"]
            return 200, {"uid": body["uid"], "title": body["title"]}
        if (method, path) == ("POST", "/api/dashboards/db"):
            uid = body["dashboard"]["uid"]
            if body.get("folderUid") not in self.folders:
                return 400, {"message": "folder not found"}
            if uid in self.dashboards and not body.get("overwrite"):
                return 412, {"message": "A dashboard with the same uid already exists", "status": "name-exists"}
            version = self.dashboards.get(uid, {}).get("version", 0) + 1
            self.dashboards[uid] = {**body, "version": version}
            return 200, {"uid": uid, "url": f"/d/{uid}/x", "status": "success", "version": version}
        return 404, {"message": "Not found"}
