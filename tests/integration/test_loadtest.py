"""Locust against the real cluster (gateway -> prefill -> NIXL -> decode, tiny model): a short
headless run with the CPU-sized SLO passes and writes its report; the same kind of run with
an impossible SLO exits non-zero and names the bound it missed. Locust runs as a subprocess,
exactly as a user runs it (`python -m loadtest`)."""

from __future__ import annotations

import asyncio
import csv
import subprocess
import sys
from pathlib import Path

import httpx

from loadtest.bench.loadgen import stream_one
from loadtest.bench.workload import ScheduledRequest
from tests.support.integration_cluster import MODEL_NAME

REPO = Path(__file__).resolve().parents[2]


def loadtest(base_url: str, tokenizer: Path, slo: str, report: Path, duration: int) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "loadtest", "--host", base_url, "--slo", str(REPO / "loadtest/slo" / slo),
           "--tokenizer", str(tokenizer), "--report-dir", str(report), "--duration", str(duration)]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=duration + 120)


def test_headless_run_meets_the_cpu_slo(base_url, tiny_model_dir, tmp_path):
    out = loadtest(base_url, tiny_model_dir, "cpu-tiny.yaml", tmp_path, duration=20)
    log = out.stdout + out.stderr
    assert out.returncode == 0, log
    assert "SLO PASSED" in out.stdout and "PASS  ttft_ms p95" in out.stdout
    assert "requests" in out.stdout and "TTFT p50" in out.stdout  # progress lines were shown
    with (tmp_path / "requests.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert rows and all(r["ok"] == "1" for r in rows), [r["error"] for r in rows if r["ok"] != "1"]
    # Every kind of the mix ran, with exact token counts (the meter fails a miscounted stream).
    assert {r["workload"] for r in rows} >= {"chat", "agent"}
    assert all(float(r["ttft_ms"]) > 0 and int(r["output_tokens"]) > 0 for r in rows)
    for name in ("index.html", "latency.png", "summary.csv", "slo.csv", "locust_stats.csv", "locust.html"):
        assert (tmp_path / name).stat().st_size > 0, name
    # Our events reached Locust's own stats (and so its CSV and web UI).
    locust_stats = (tmp_path / "locust_stats.csv").read_text()
    assert all(kind in locust_stats for kind in ("TTFT", "ITL", "E2E", "TOK/S"))


def test_impossible_slo_fails_the_run_and_names_the_bound(base_url, tiny_model_dir, tmp_path):
    out = loadtest(base_url, tiny_model_dir, "impossible.yaml", tmp_path, duration=8)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "FAIL  ttft_ms p50 <= 0.001" in out.stdout
    assert "PASS  itl_ms p95 <= 2000" in out.stdout  # only the impossible bound failed
    assert "SLO FAILED" in out.stdout and "SLO FAILED" in (tmp_path / "index.html").read_text()


def test_the_benchmarks_client_reads_exact_tokens_through_the_gateway(base_url):
    """loadtest/measure/'s stream_async as the goodput and overhead benchmarks send it
    (loadtest/bench/loadgen.py): two token-id prompts in a row on one connection pool."""
    async def go():
        async with httpx.AsyncClient(timeout=120) as client:
            return [await stream_one(client, base_url, MODEL_NAME,
                                     ScheduledRequest(i, 0.0, "bench", tuple(range(100 + i, 140 + i)), 8))
                    for i in range(2)]

    for r in asyncio.run(go()):
        assert r.ok, r.error
        assert (r.status, r.output_tokens, r.prompt_tokens, r.workload) == (200, 8, 40, "bench")
        assert 0 < r.ttft_ms <= r.e2e_ms and r.mean_itl_ms > 0 and len(r.token_gaps_ms) == r.tokens - 1
