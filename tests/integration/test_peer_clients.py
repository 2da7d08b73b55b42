"""Real peer clients, run unmodified against the test cluster (issue 15): guidellm 0.8.1
(synthetic data, synchronous profile, its streaming chat defaults, which ask for
`stream_options.continuous_usage_stats`) and the OpenAI Agents SDK (its chat-completions model and
its default, the Responses model, with and without a function tool).

Both live in .venv-peers (`make peers-venv`, which `make test` runs first): their pins clash
with .venv's (tests/peers/requirements.txt says which). Each runs as its own process, as a user
would run it; the assertions read what the client itself reports (guidellm's JSON report, the
agents script's JSON), not only its exit code.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.support.integration_cluster import MODEL_NAME

REPO = Path(__file__).resolve().parents[2]
PEERS_VENV = REPO / ".venv-peers"
AGENTS_CHECK = REPO / "tests" / "peers" / "agents_check.py"
GUIDELLM_REQUESTS = 4
PROMPT_TOKENS = 64
OUTPUT_TOKENS = 16
AGENT_RUNS = {"chat_completions", "chat_completions_tool", "responses", "responses_tool"}


def peer_executable(name: str) -> Path:
    path = PEERS_VENV / "bin" / name
    if not path.exists():
        pytest.fail(f"{path} is missing: run `make peers-venv` (`make test` runs it before pytest)",
                    pytrace=False)
    return path


def client_env() -> dict[str, str]:
    """The client's environment: offline (no hub is reachable; the tokenizer is a local folder),
    and without the PYTHONPATH that points the tests at this repo's code."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def run_guidellm(server_url: str, tokenizer_dir: Path, out_dir: Path) -> tuple[subprocess.CompletedProcess, Path]:
    """guidellm's documented command line (shared/DESIGN.md), with a JSON report in out_dir."""
    report = out_dir / "benchmarks.json"
    cmd = [
        str(peer_executable("guidellm")), "run",
        "--backend", f"kind=openai_http,target={server_url},model={MODEL_NAME}",
        "--profile", "kind=synchronous",
        "--constraint", f"kind=max_requests,count={GUIDELLM_REQUESTS}",
        "--data", f"kind=synthetic_text,prompt_tokens={PROMPT_TOKENS},output_tokens={OUTPUT_TOKENS}",
        "--tokenizer", f"kind=hf_auto,model={tokenizer_dir}",
        "--output", f"kind=json,path={report}",
        "--disable-console-interactive",
    ]
    done = subprocess.run(cmd, cwd=out_dir, env=client_env(), capture_output=True, text=True, timeout=600)
    return done, report


def guidellm_summary(report: Path) -> dict:
    """The one benchmark's request counts by status, and the errored requests' messages."""
    benchmarks = json.loads(report.read_text())["benchmarks"]
    assert len(benchmarks) == 1, f"a synchronous profile runs one benchmark, the report has {len(benchmarks)}"
    bench = benchmarks[0]
    made = bench["scheduler_metrics"]["requests_made"]
    errored = bench["requests"]["errored"]
    return {"counts": {k: made[k] for k in ("successful", "errored", "incomplete", "total")},
            "errors": [r["info"]["error"] for r in errored], "successful": bench["requests"]["successful"],
            "errored": len(errored)}


# What guidellm 0.8.1 sends with these settings (its report's request_args, recorded against vLLM's
# server; the report keeps no body for errored requests).
GUIDELLM_BODY = {"model": MODEL_NAME, "stream": True,
                 "stream_options": {"include_usage": True, "continuous_usage_stats": True},
                 "max_completion_tokens": OUTPUT_TOKENS, "ignore_eos": True,
                 "messages": [{"role": "user", "content": [{"type": "text", "text": "Finish medical want."}]}]}


def replay(server_url: str) -> str:
    """guidellm's error names only the HTTP status; the server's answer to a body like its own says why."""
    import httpx

    response = httpx.post(f"{server_url}/v1/chat/completions", json=GUIDELLM_BODY, timeout=120)
    return f"a body like guidellm's ({json.dumps(GUIDELLM_BODY)}) gets: {response.status_code} {response.text[:1000]}"


def run_agents_check(openai_base_url: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    cmd = [str(peer_executable("python")), str(AGENTS_CHECK), "--base-url", openai_base_url,
           "--model", MODEL_NAME]
    done = subprocess.run(cmd, env=client_env(), capture_output=True, text=True, timeout=600)
    try:
        return done, json.loads(done.stdout)
    except json.JSONDecodeError:
        return done, None


def _tail(done: subprocess.CompletedProcess) -> str:
    return f"rc {done.returncode}\nstdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"


def test_guidellm_synchronous_streaming_chat(base_url, tiny_model_dir, tmp_path):
    done, report = run_guidellm(base_url, tiny_model_dir, tmp_path)
    assert done.returncode == 0, _tail(done)
    assert report.exists(), f"guidellm wrote no report at {report}\n{_tail(done)}"
    summary = guidellm_summary(report)
    counts = summary["counts"]
    # guidellm 0.8.1 can leave the last request out of its report when its max_requests constraint
    # ends the run (seen once: 4 generated by its scheduler, 3 in requests_made, none errored or
    # incomplete): its own bookkeeping, so one missing request is allowed, never a failed one.
    answered_all = counts["errored"] == 0 and counts["incomplete"] == 0 and counts["successful"] == counts["total"]
    if not (answered_all and GUIDELLM_REQUESTS - 1 <= counts["total"] <= GUIDELLM_REQUESTS):
        why = replay(base_url) if summary["errored"] else ""
        pytest.fail(f"guidellm's report: {counts}, expected {GUIDELLM_REQUESTS} successful, none errored or "
                    f"incomplete\nerrors: {summary['errors']}\n{why}", pytrace=False)
    # guidellm asks for exactly output_tokens (ignore_eos) and counts what the stream's usage says.
    output_tokens = [r["output_tokens"] for r in summary["successful"]]
    assert output_tokens == [OUTPUT_TOKENS] * counts["successful"], output_tokens


def test_openai_agents_sdk(base_url):
    done, results = run_agents_check(f"{base_url}/v1")
    assert results is not None, f"agents_check.py printed no JSON\n{_tail(done)}"
    assert set(results) == AGENT_RUNS, results
    failed = {name: r["error"] for name, r in results.items() if not r["ok"]}
    assert not failed, failed
    assert all(isinstance(r["final_output"], str) for r in results.values()), results
    assert done.returncode == 0, _tail(done)


def test_vllm_benchmark_completes_at_concurrency_8_what_vllm_completes(base_url, direct_vllm_url, tiny_model_dir):
    """vLLM's own serving benchmark, unmodified (loadtest/bench/vllm_bench.py), against the test
    cluster and the plain vLLM server on the same workload (issue 28): tandem queues what it
    cannot start yet, as vLLM does, so nothing fails and it completes what vLLM completes."""
    from loadtest.bench import vllm_bench

    workload = vllm_bench.Workload(prompts=32, input_len=128, output_len=16, concurrency=8)
    results = {name: vllm_bench.summary(vllm_bench.run(url, MODEL_NAME, tiny_model_dir, workload, timeout_s=600))
               for name, url in (("vllm", direct_vllm_url), ("tandem", base_url))}
    print(f"\nvLLM's benchmark, {workload}: {json.dumps(results)}")
    assert results["vllm"]["failed"] == 0 and results["vllm"]["completed"] == workload.prompts, results
    assert results["tandem"]["failed"] == 0, results
    assert results["tandem"]["completed"] == results["vllm"]["completed"], results
