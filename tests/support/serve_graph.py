"""tests/serve's Serve graph, as data and helpers: its config (FakeEngine in every replica,
1 prefill and 2 decode replicas, the prefill pool autoscaling quickly) and how tests reach
its replicas. The fixtures that start and stop it are in tests/serve/conftest.py."""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import TEST_STATE

MODEL_NAME = "tiny-llama"
DECODE_REPLICAS = 2  # two, so pinning (n > 1 samples, where a stream runs) is observable
PREFILL_TIMEOUT_S = 2.0  # short: the prefill-timeout test waits it out
AUTOSCALING_LOG = TEST_STATE / "serve-autoscaling-decisions.jsonl"
# Every process of the graph writes its spans here (observability.tracing, exporter file), one
# file per process; sampling 0: only a request that sends a sampled traceparent is traced
# (tests/serve/test_tracing.py), so the other tests run as without tracing.
TRACES_DIR = TEST_STATE / "serve-traces"
# The prefill pool autoscales 1..2, quickly, on queued prompt tokens (test_autoscaling.py);
# one 17-token prompt waiting out the prefill timeout (3.5 s) is far below the target, and no
# other test here queues 128 tokens for the 1 s upscale delay. A 1 s window and 1 s downscale
# delay: the scale-down follows idleness within ~2 s (the test's load leaves no doubt either way).
PREFILL_AUTOSCALING = {"min_replicas": 1, "max_replicas": 2, "target_queued_prompt_tokens": 128,
                       "upscale_delay_s": 1, "downscale_delay_s": 1, "cooldown_s": 2,
                       "look_back_s": 1, "metrics_interval_s": 0.5, "decision_log": str(AUTOSCALING_LOG)}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve_config(model_dir: Path, gateway_port: int, metrics_port: int):
    from cluster.config import ClusterConfig

    engine = {"kv_cache_memory_bytes": 16 << 20, "max_num_seqs": 8, "block_size": 16}
    pool = {"num_cpus": 0, "engine": engine}
    return ClusterConfig.model_validate({
        "model": {"path": str(model_dir), "name": MODEL_NAME, "dtype": "float32", "max_model_len": 512},
        "gateway": {"host": "127.0.0.1", "port": gateway_port},
        "tiers": {"interactive": {"prefill": {"replicas": 1, "autoscaling": PREFILL_AUTOSCALING, **pool},
                                  "decode": {"replicas": DECODE_REPLICAS, **pool}}},
        "kv_transfer": {"prefill_timeout_s": PREFILL_TIMEOUT_S},
        "routing": {"disaggregation": "always"},  # every request takes the P/D path
        "ray": {"num_cpus": 2, "metrics_export_port": metrics_port},
        "observability": {"tracing": {"enabled": True, "exporter": "file", "file_dir": str(TRACES_DIR),
                                      "sampling_ratio": 0.0}},
    })


@dataclass(frozen=True)
class ServeGraph:
    url: str
    cfg: object
    vocab_size: int


def migrations_continued(graph: ServeGraph) -> float:
    """Answers continued after their stream broke (tandem_migrations_total, result continued),
    read from the graph's Ray metrics port."""
    import httpx

    from tests.support.integration_cluster import metric

    text = httpx.get(f"http://127.0.0.1:{graph.cfg.ray.metrics_export_port}/metrics", timeout=30).text
    return metric("ray_tandem_migrations_total", text, result="continued")



def replica_stats(pool: str, replicas: int) -> dict:
    """{worker_id: FakeEngineStats} of every replica of a pool ("prefill", "decode"): a handle
    call lands on a replica Serve picks, so this asks until it has heard from each."""
    from ray import serve

    from cluster.types import APP_NAME, PoolId

    handle = serve.get_deployment_handle(PoolId("interactive", pool).deployment_name, app_name=APP_NAME)
    seen: dict = {}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        stats = handle.stats.remote().result()
        seen[stats.worker_id] = stats
        if len(seen) == replicas:
            return seen
    raise AssertionError(f"heard from {sorted(seen)} only, expected {replicas} replicas of {pool}")


class Stream(threading.Thread):
    """One streamed greedy completion through the gateway, on a connection of its own (or the
    given client's): each chunk's text and when it came, the finish reason, and what went wrong
    (an error event, a status other than 200, a broken connection) instead of raising."""

    def __init__(self, graph: ServeGraph, prompt: list[int], max_tokens: int, token_s: float, client=None) -> None:
        super().__init__(daemon=True)
        self.graph, self.prompt, self.max_tokens, self.token_s = graph, prompt, max_tokens, token_s
        self.client = client  # an httpx.Client: its open connection (None: a new one)
        self.texts: list[str] = []
        self.times: list[float] = []
        self.finish = None
        self.error = None
        self.sent_at = 0.0

    def run(self) -> None:
        import httpx

        self.sent_at = time.monotonic()
        body = {"model": MODEL_NAME, "prompt": self.prompt, "max_tokens": self.max_tokens, "temperature": 0,
                "stream": True, "vllm_xargs": {"fake_token_s": self.token_s}}
        try:
            send = httpx.stream if self.client is None else self.client.stream
            with send("POST", f"{self.graph.url}/v1/completions", json=body, timeout=120) as r:
                assert r.status_code == 200, r.status_code
                for line in r.iter_lines():
                    if not line.startswith("data: {"):
                        continue
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        self.error = chunk["error"]
                    for choice in chunk.get("choices", ()):
                        if choice["text"]:
                            self.texts.append(choice["text"])
                            self.times.append(time.monotonic())
                        self.finish = choice.get("finish_reason") or self.finish
        except Exception as exc:  # noqa: BLE001 - reported by the test
            self.error = repr(exc)
