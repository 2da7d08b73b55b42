"""The Locust user: streams `/v1/completions` and measures what a person waiting for tokens
feels. Locust's own response time for a streamed request is the time to the response
headers, so TTFT, every inter-token gap, end-to-end latency and the stream's decode rate are
measured here and fired as Locust request events (request types TTFT, ITL, E2E, TOK/S; the
"ms" columns of TOK/S hold tokens per second), so they appear in Locust's stats, CSV and UI.

Lifecycle: `on_start` takes the run's shared state (`environment.tandem`, made at test_start
by loadtest/locustfile.py) and a seeded workload stream; each task sends one request, records
it, fires the events and feeds the answer back to the workload (agent conversations).
"""

from __future__ import annotations

import time
from typing import Optional

import gevent
from locust import HttpUser, constant, task
from locust.exception import StopUser

from loadtest.meter import StreamMeter
from loadtest.run import RunState
from loadtest.measure.record import RequestRecord
from loadtest.workloads import Mix, Request


class TandemUser(HttpUser):
    """One simulated client, closed-loop (the next request leaves when the answer is done).

    `api_keys` maps a tier to the API key sent as `Authorization: Bearer <key>`; the load
    file's `api_keys` and `--api-key` fill it, and a subclass may set it directly.
    """

    wait_time = constant(0)
    api_keys: dict[str, str] = {}

    def on_start(self) -> None:
        run = getattr(self.environment, "tandem", None)
        if run is None:  # test_start failed (its error is logged): nothing to run against
            raise StopUser()
        self.run: RunState = run
        self.mix: Optional[Mix] = None if self.run.trace else self.run.new_mix()

    @task
    def send(self) -> None:
        if self.run.trace is not None:
            due, req = self.run.trace.take()
            delay = self.run.t0 + due - time.perf_counter()
            if delay > 0:
                gevent.sleep(delay)
        else:
            assert self.mix is not None
            req = self.mix.next()
        self.run.peak_users = max(self.run.peak_users, self.environment.runner.user_count)
        record, output_ids = self.stream(req)
        self.run.add(record)
        self.fire(record)
        if self.mix is not None:
            self.mix.observe(output_ids)

    def headers(self, tier: str) -> dict[str, str]:
        key = {**self.run.api_keys, **self.api_keys}.get(tier, "")
        return {"Authorization": f"Bearer {key}"} if key else {}

    def stream(self, req: Request) -> tuple[RequestRecord, list[int]]:
        body = {
            "model": self.run.model,
            "prompt": list(req.prompt_ids),
            "max_tokens": req.output_tokens,
            "ignore_eos": True,  # exact output lengths
            "return_token_ids": True,  # exact token counts per chunk
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        t_send = time.perf_counter()
        meter = StreamMeter(req, t_send, self.run.t0)
        with self.client.post("/v1/completions", json=body, headers=self.headers(req.tier), stream=True,
                              catch_response=True, name=f"/v1/completions [{req.workload}]") as resp:
            if resp.status_code != 200:
                error = f"HTTP {resp.status_code}: {resp.text[:300]}"
                resp.failure(error)
                return meter.record(time.perf_counter(), error, resp.status_code), []
            error = ""
            try:
                for line in resp.iter_lines(chunk_size=None):  # None: every chunk as it arrives
                    if not meter.feed(line, time.perf_counter()):
                        break
            except Exception as exc:  # a dropped connection or a malformed event: a failed request
                error = f"{type(exc).__name__}: {exc}"
            record = meter.record(time.perf_counter(), error)
            if record.ok:
                resp.success()
            else:
                resp.failure(record.error)
        return record, meter.ids

    def fire(self, r: RequestRecord) -> None:
        if not r.ok:
            return  # the HTTP request event already carries the failure
        fire = self.environment.events.request.fire
        events = [("TTFT", r.ttft_ms), ("E2E", r.e2e_ms), ("TOK/S", r.tokens_per_s)]
        events += [("ITL", g) for g in r.itl_ms]
        for kind, value in events:
            if value is not None:
                fire(request_type=kind, name=r.workload, response_time=value, response_length=0,
                     exception=None, context={})
