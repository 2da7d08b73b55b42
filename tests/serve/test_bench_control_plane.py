"""CI's smoke of the control-plane benchmark (loadtest/bench/control_plane.py): the whole
command, end to end, on a tiny cell (tandem only, 4 streams, a 2 s window, 16 tokens per
answer). It checks the JSON's shape and that tokens were delivered without an error, never
the figures (those are the benchmark's, on a quiet machine).

Why here: it runs tandem's real Serve graph with FakeEngine, as this folder's tests do, but
as the benchmark runs it, in processes of its own: the benchmark starts its own local Ray in a
child process (its own driver, free ports for the gateway and metrics, Ray's own ports
chosen by Ray), so it does not touch this folder's Ray session, which may still be up (the
package fixture ends after the folder's last test: this file's name puts it last). The only
thing both clusters want is the dashboard agent's fixed HTTP port (52365); the second agent
serves without HTTP, which neither cluster uses. A start that Ray abandons on a busy machine
(ray-project/ray#65983) is retried by the benchmark itself.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.conftest import REPO, TEST_STATE


TANDEM_KINDS = {"gateway", "Serve proxy", "prefill replica", "decode replica", "Serve controller", "Ray core",
                "other", "total"}


def run_benchmark(args: list[str], timeout_s: float) -> subprocess.CompletedProcess:
    """The benchmark as a user runs it; past the timeout it gets SIGTERM (it stops every
    process it started) before anything is killed."""
    proc = subprocess.Popen([sys.executable, "-m", "loadtest.bench.control_plane", *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        pytest.fail(f"the benchmark ran past {timeout_s} s:\n{out[-4000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


@pytest.mark.usefixtures("own_ray")
def test_control_plane_benchmark_smoke(tmp_path, tiny_model_dir):
    out = tmp_path / "control_plane.json"
    done = run_benchmark(
        ["--systems", "tandem", "--streams", "4", "--warmup-s", "1", "--duration-s", "2", "--max-tokens", "16",
         "--settle-s", "0", "--model-dir", str(tiny_model_dir), "--state-dir", str(TEST_STATE / "bench-control-plane"),
         # The overrides' plumbing, with values that change nothing measured.
         "--set", "gateway.health_interval_s=2", "--ray-env", "RAY_DEDUP_LOGS=0", "--out", str(out)],
        timeout_s=240)
    assert done.returncode == 0, done.stdout[-4000:]
    assert "[control_plane] tandem    4 streams: measuring" in done.stdout  # progress lines

    result = json.loads(out.read_text())
    assert result["benchmark"] == "control_plane" and "raw HTTP/1.1" in result["client"]
    assert result["failed"] == [] and result["machine"]["cores"] >= 1
    system = result["systems"]["tandem"]
    assert system["kind"] == "tandem" and system["pace_ms"] == 20
    assert system["ray_env"] == {"RAY_DEDUP_LOGS": "0"} and system["overrides"] == ["gateway.health_interval_s=2"]
    assert system["config"]["gateway"]["health_interval_s"] == 2
    assert system["processes"]["gateway"] == 1 and system["processes"]["decode replica"] == 1

    (cell,) = system["cells"]
    assert cell["streams"] == 4 and cell["demanded_tok_s"] == 200.0
    assert cell["tokens"] > 0 and cell["delivered_tok_s"] > 0 and cell["content_events"] > 0
    requests = cell["requests"]
    assert requests["errors"] == 0 and requests["errors_outside_window"] == 0, requests["error_samples"]
    assert requests["completed"] + requests["completed_outside_window"] > 0
    assert cell["token_gap"]["n"] > 0 and {"p50_ms", "p99_ms", "max_ms"} <= set(cell["token_gap"])
    assert {"p50_ms", "p99_ms"} <= set(cell["ttft"]) or cell["ttft"]["n"] == 0
    assert set(cell["cpu_ms_per_token"]) == TANDEM_KINDS and set(cell["cores_busy"]) == TANDEM_KINDS
    assert cell["cpu_ms_per_token"]["total"] > 0 and cell["cpu_ms_per_token"]["gateway"] > 0
    assert cell["load_generator"]["cpu_ms_per_token"] > 0
    assert out.with_suffix(".png").stat().st_size > 0
