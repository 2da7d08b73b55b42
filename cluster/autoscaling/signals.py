"""Replica side of autoscaling: what each engine replica reports to Ray Serve.

Lifecycle: one `ReplicaSignals` per engine replica. The prefill deployment wraps each prompt in
`pending_prompt(n)` while it waits for and runs its prefill. Ray Serve calls the replica's
`record_autoscaling_stats()` every record period; that calls `sample()`, which reads vLLM's own
Prometheus metrics in this process. Latencies go out as per-period sums and counts: Serve
averages each metric over its look-back window, and the ratio of two averages is the
request-weighted mean latency over the window (0/0 when nothing finished: no signal).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator, Optional

from cluster import vllm_metrics as vm  # the vLLM metric names, one table

# Metric names on the wire between replicas and the policy.
QUEUED_PROMPT_TOKENS = "queued_prompt_tokens"
RUNNING_SEQS = "running_seqs"
KV_USAGE = "kv_usage"
TTFT_SUM, TTFT_COUNT = "ttft_s_sum", "ttft_count"
ITL_SUM, ITL_COUNT = "itl_s_sum", "itl_count"

# Signal → the vLLM sample it is the per-period increment of.
_COUNTERS = {
    TTFT_SUM: vm.TTFT_SUM,
    TTFT_COUNT: vm.TTFT_COUNT,
    ITL_SUM: vm.ITL_SUM,
    ITL_COUNT: vm.ITL_COUNT,
}

MetricsReader = Callable[[], dict[tuple[str, Optional[str]], float]]


def read_vllm_metrics() -> dict[tuple[str, Optional[str]], float]:
    from cluster.engine.metrics import read_vllm_metrics as read  # the one reader (replicas pass engine.metrics)

    return read()


class ReplicaSignals:
    def __init__(self, read_metrics: MetricsReader = read_vllm_metrics):
        self._read = read_metrics
        self._queued_prompt_tokens = 0
        self._last: dict[str, float] = {}

    @contextmanager
    def pending_prompt(self, num_tokens: int) -> Iterator[None]:
        """Counts a prompt as queued until its prefill returns (or fails)."""
        self._queued_prompt_tokens += num_tokens
        try:
            yield
        finally:
            self._queued_prompt_tokens -= num_tokens

    @property
    def queued_prompt_tokens(self) -> int:
        """Prompt tokens now waiting for or in their prefill (also a routing stat)."""
        return self._queued_prompt_tokens

    def sample(self) -> dict[str, float]:
        values = self._read()
        out = {
            QUEUED_PROMPT_TOKENS: float(self._queued_prompt_tokens),
            RUNNING_SEQS: values.get(vm.REQUESTS_RUNNING, 0.0) + values.get(vm.REQUESTS_WAITING, 0.0),
            KV_USAGE: values.get(vm.KV_CACHE_USAGE, 0.0),
        }
        for name, sample in _COUNTERS.items():
            total = values.get(sample, 0.0)
            # The first sample has no previous one: report 0, not the lifetime total.
            out[name] = max(0.0, total - self._last.get(name, total))
            self._last[name] = total
        return out
