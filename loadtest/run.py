"""What the users of one Locust run share: the load file, the tokenizer, the model id, the
trace (if any), the samples, and the clock. Made at test_start, read by every user.

Lifecycle (driven by loadtest/locustfile.py): `RunState.create` at test_start -> users call
`new_mix` / `add` -> `progress_line` every few seconds -> `finish` at test_stop writes the
report and returns the verdicts; the quitting listener turns them into the exit code.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import requests

from loadtest.measure.percentiles import percentile
from loadtest.measure.record import RequestRecord, Samples
from loadtest.measure.slo import Verdict, evaluate
from loadtest.spec import LoadSpec, TokenizerVocab
from loadtest.workloads import Mix, Trace, Vocab


def discover_model(host: str, api_key: str = "") -> str:
    """The first model the server lists; the error says what to do when it cannot be read."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        resp = requests.get(host.rstrip("/") + "/v1/models", headers=headers, timeout=10)
        resp.raise_for_status()
        return str(resp.json()["data"][0]["id"])
    except Exception as exc:
        raise RuntimeError(f"cannot list models at {host}/v1/models ({exc}); is the cluster up? "
                           "Or pass --model NAME") from None


@dataclass
class RunState:
    spec: LoadSpec
    vocab: Vocab
    model: str
    api_keys: dict[str, str]
    report_dir: Path
    trace: Optional[Trace] = None
    samples: Samples = field(default_factory=Samples)
    t0: float = field(default_factory=time.perf_counter)
    peak_users: int = 0
    _users: Any = field(default_factory=itertools.count)

    @classmethod
    def create(cls, options: Any, host: str) -> "RunState":
        spec = LoadSpec.load(Path(options.slo))
        vocab = TokenizerVocab(Path(options.tokenizer))
        keys = dict(spec.api_keys)
        if options.api_key:
            keys = {tier: options.api_key for tier in {*keys, "interactive", "batch"}}
        model = options.model or discover_model(host, next(iter(keys.values()), ""))
        trace = Trace.load(spec.workload.trace, vocab, spec.workload.seed) if spec.workload.trace else None
        return cls(spec, vocab, model, keys, Path(options.report_dir), trace)

    def new_mix(self) -> Mix:
        """A workload stream for the next user: user i always gets the same seeded sequence."""
        return Mix(self.spec.workload, self.vocab, next(self._users))

    def add(self, record: RequestRecord) -> None:
        self.samples.add(record)

    def progress_line(self, users: int) -> str:
        self.peak_users = max(self.peak_users, users)
        s = self.samples
        parts = [f"[{time.perf_counter() - self.t0:5.0f}s] users {users}",
                 f"requests {s.requests} ({s.errors} failed)"]
        for metric, label, unit in (("ttft_ms", "TTFT", "ms"), ("itl_ms", "ITL", "ms"), ("tokens_per_s", "tok/s", "")):
            vals = s.values(metric)
            if vals:
                parts.append(f"{label} p50 {percentile(vals, 50):.0f}{unit} p95 {percentile(vals, 95):.0f}{unit}")
        return "  ".join(parts)

    def verdicts(self) -> list[Verdict]:
        """The SLO's bounds, plus the stated user count: a run at fewer users proves nothing."""
        stated = Verdict(f"users >= {self.spec.users} (stated in {self.spec.name})", float(self.peak_users),
                         self.peak_users >= self.spec.users)
        return [stated, *evaluate(self.spec.slo, self.samples)]
