"""The pure parts of the stream benchmark: CPU attribution by process kind, per-cell
summaries and the issue-14 targets. (Its SSE timing and percentiles are loadtest/measure/'s:
tests/unit/test_measure.py.)"""

import pytest

from loadtest.bench import procs
from loadtest.bench.procs import ProcRecord
from loadtest.bench.stream import parse_batches
from loadtest.bench.stream_report import SystemCell, summarize, targets
from loadtest.measure.record import RequestRecord


# ---------------------------------------------------------------- process kinds and CPU

@pytest.mark.parametrize("cmdline,kind", [
    ("ray::ServeReplica:tandem:Gateway", procs.GATEWAY),
    ("ray::ServeReplica:tandem:Gateway.handle_request_streaming", procs.GATEWAY),
    ("ray::ServeReplica:tandem:interactive-decode", procs.ENGINE_REPLICA),
    ("ray::ProxyActor", procs.PROXY),
    ("ray::ServeController.listen_for_change", procs.CONTROLLER),
    ("/venv/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet --raylet_socket_name=/tmp/x", procs.RAY_CORE),
    ("/venv/lib/python3.11/site-packages/ray/core/src/ray/gcs/gcs_server --gcs_server_port=1", procs.RAY_CORE),
    ("VLLM::EngineCore", procs.ENGINE_CORE),
    ("VLLM::Worker", procs.WORKER),
    ("VLLM::Worker_TP0", procs.WORKER),
    ("/venv/bin/python -m vllm.entrypoints.openai.api_server --model /m --port 8100", procs.API_SERVER),
    ("/venv/bin/python -u -m cluster.cli run --config cluster/configs/local.yaml", procs.DRIVER),
    ("ray::IDLE", procs.OTHER),
    ("/venv/bin/python /venv/lib/python3.11/site-packages/ray/dashboard/agent.py --node-ip-address=127.0.0.1", procs.OTHER),
    ("", procs.OTHER),
])
def test_classify_by_process_title(cmdline, kind):
    assert procs.classify(cmdline) == kind


def table(*rows):
    return {r[0]: ProcRecord(r[0], r[1], r[2], r[3], r[4]) for r in rows}


TREE = [
    (10, 1, "python -m cluster.cli run", 100.0),
    (11, 10, "/x/ray/core/src/ray/raylet/raylet --a", 101.0),
    (12, 11, "ray::ServeReplica:tandem:Gateway", 102.0),
    (13, 11, "ray::ServeReplica:tandem:interactive-decode", 103.0),
    (14, 13, "VLLM::EngineCore", 104.0),
    (15, 14, "VLLM::Worker", 105.0),
    (16, 11, "ray::ProxyActor", 106.0),
    (20, 1, "python -m vllm.entrypoints.openai.api_server", 107.0),
    (21, 20, "VLLM::EngineCore", 108.0),
]


def test_engine_processes_take_the_role_of_their_replica_and_trees_stay_apart():
    before = table(*[(p, pp, c, t, 1.0) for p, pp, c, t in TREE])
    assert procs.role_of(15, before) == "interactive-decode"
    assert procs.role_of(14, before) == "interactive-decode"
    assert procs.role_of(12, before) is None and procs.role_of(21, before) is None
    assert procs.descendants(10, before) == {10, 11, 12, 13, 14, 15, 16}
    assert procs.descendants(20, before) == {20, 21}
    assert procs.descendants(99, before) == set()


def test_cpu_delta_by_kind_counts_newborn_and_reused_pids_from_zero_and_skips_the_gone():
    before = table(*[(p, pp, c, t, 1.0) for p, pp, c, t in TREE if p != 16])
    after_rows = [(p, pp, c, t, 1.0 + 0.1 * p) for p, pp, c, t in TREE if p != 12]  # the gateway exited
    after_rows = [(p, pp, c, 999.0 if p == 15 else t, s) for p, pp, c, t, s in after_rows]  # pid 15 reused
    after = table(*after_rows)
    delta = procs.cpu_delta(before, after, procs.descendants(10, after) | {12})
    assert delta[(procs.ENGINE_CORE, "interactive-decode")] == pytest.approx(1.4)  # 2.4 - 1.0
    assert delta[(procs.WORKER, "interactive-decode")] == pytest.approx(2.5)  # new process: all of it
    assert delta[(procs.PROXY, None)] == pytest.approx(2.6)  # born in between
    assert (procs.GATEWAY, None) not in delta
    assert procs.by_kind(delta)[procs.ENGINE_REPLICA] == pytest.approx(1.3)  # 2.3 - 1.0
    named = procs.by_process(delta)
    assert named["vLLM worker [interactive-decode]"] == pytest.approx(2.5)
    assert named["Serve proxy"] == pytest.approx(2.6)
    assert sum(procs.by_kind(delta).values()) == pytest.approx(sum(delta.values()))


# ---------------------------------------------------------------- summaries and targets

def test_summary_counts_tokens_cpu_per_token_and_idle_burn():
    cell = SystemCell()
    cell.records = [RequestRecord(ttft_ms=200.0, token_gaps_ms=(100.0, 100.0), prompt_tokens=60, usage_tokens=3),
                    RequestRecord(ttft_ms=250.0, token_gaps_ms=(200.0, 200.0), prompt_tokens=61, usage_tokens=3),
                    RequestRecord(error="HTTP 500: x")]
    cell.models_ms = [5.0, 7.0, 9.0]
    cell.busy_s, cell.idle_cpu_s, cell.idle_s = 2.0, 0.5, 1.0
    cell.add_cpu({"vLLM worker [d]": 0.6}, {procs.WORKER: 0.6})
    cell.add_cpu({"gateway": 0.3}, {procs.GATEWAY: 0.3})
    s = summarize(cell, expected_tokens=3)
    assert (s["streams"], s["errors"], s["tokens"], s["token_count_mismatches"]) == (3, 1, 6, 0)
    assert s["ttft"]["p50_ms"] == 225.0
    assert s["token_gap"]["max_ms"] == 200.0 and s["token_gap"]["n"] == 4
    assert s["itl"]["p50_ms"] == 150.0
    assert s["cpu_s_per_token"]["total"] == pytest.approx(0.15)
    assert s["cpu_s_per_token"][procs.WORKER] == pytest.approx(0.1)
    assert list(s["cpu_s_per_token"])[:2] == ["total", procs.WORKER]  # largest first
    assert s["cpu_cores_busy"] == pytest.approx(0.45)
    assert s["idle_cpu_cores_while_other_runs"] == 0.5
    assert s["prompt_tokens_mean"] == 60.5
    assert s["models_latency"]["p50_ms"] == 7.0 and s["models_latency"]["p99_ms"] == 9.0  # 8.96: between ranks


def fake_result(t_gap_p99, d_gap_p99, t_models_p99, t_ttft, d_ttft, ready):
    def side(p99, mx, ttft, itl, models):
        return {"token_gap": {"p99_ms": p99, "max_ms": mx}, "ttft": {"p50_ms": ttft}, "itl": {"p50_ms": itl},
                "models_latency": {"p99_ms": models}}

    return {"cells": {
        "short_c1": {"prompt": "short", "concurrency": 1,
                     "tandem": side(t_gap_p99, 100.0, t_ttft, 60.0, 9.0), "direct": side(d_gap_p99, 60.0, d_ttft, 58.0, 8.0)},
        "long_c4": {"prompt": "long", "concurrency": 4,
                    "tandem": side(t_gap_p99, 130.0, 3000.0, 70.0, t_models_p99),
                    "direct": side(d_gap_p99, 60.0, 2000.0, 65.0, 8.0)},
    }, "readiness": {"tandem": {"ready_line_s": ready}, "direct": {"spawn_to_ready_s": 30.0}}}


def test_targets_met_and_missed_at_their_limits():
    rows = targets(fake_result(t_gap_p99=85.0, d_gap_p99=60.0, t_models_p99=50.0, t_ttft=430.0, d_ttft=400.0,
                               ready=60.0))
    by = {(r["target"].split(" <=")[0], r["cell"]): r for r in rows}
    assert by[("token gap p99", "short_c1")]["met"] and by[("token gap p99", "short_c1")]["limit"] == 85.0
    assert by[("token gap max", "short_c1")]["met"]  # 100 <= 2 x 60
    assert by[("token gap max", "long_c4")]["met"] is False  # 130 > 120
    assert by[("ITL p50", "short_c1")]["met"]  # 60 <= 60.9
    assert by[("ITL p50", "long_c4")]["met"] is False  # 70 > 68.25
    assert by[("GET /v1/models p99", "long_c4")]["met"]
    assert ("GET /v1/models p99", "short_c1") not in by  # only while 4 streams run
    assert by[("TTFT p50 short", "short_c1")]["met"]  # 430 <= 400 + 30
    assert not any(r["target"].startswith("TTFT p50 long") for r in rows)  # long runs at c4 only here
    assert by[("ready (its 'ready' line)", "start")]["met"]
    missed = {(r["target"].split(" <=")[0], r["cell"]): r["met"]
              for r in targets(fake_result(85.1, 60.0, 50.1, 430.1, 400.0, 61.0))}
    assert missed[("token gap p99", "short_c1")] is False and missed[("token gap p99", "long_c4")] is False
    assert missed[("GET /v1/models p99", "long_c4")] is False
    assert missed[("TTFT p50 short", "short_c1")] is False
    assert missed[("ready (its 'ready' line)", "start")] is False


def test_missing_figures_give_no_verdict():
    result = {"cells": {"short_c1": {"prompt": "short", "concurrency": 1, "tandem": {}, "direct": {}}},
              "readiness": {}}
    assert all(r["met"] is None for r in targets(result))


def test_parse_batches():
    assert parse_batches("1:6,4:3") == {1: 6, 4: 3}


def test_machine_busy_counts_user_nice_system_and_irqs_not_idle_and_steal_apart():
    from collections import namedtuple

    T = namedtuple("T", "user nice system idle iowait irq softirq steal")
    busy, steal = procs.machine_busy_s(T(10, 1, 5, 100, 2, 0.5, 0.5, 3), T(12, 1.5, 6, 130, 9, 0.5, 1.0, 4))
    assert busy == pytest.approx(4.0) and steal == pytest.approx(1.0)


def test_reaper_kills_what_it_saw_still_running_and_spares_a_reused_pid():
    import subprocess
    import sys

    seen = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        now = procs.snapshot()
        reaper = procs.Reaper()
        reaper.note(now, {seen.pid})
        reaper.seen[other.pid] = now[other.pid].create_time - 5  # the pid of a process long gone
        said = []
        reaper.reap(said.append, sweep_children=False)  # never sweep pytest's own children
        assert seen.wait(10) == -9
        assert other.poll() is None
        assert said == [f"[stream] killed 1 leftover process(es): {procs.OTHER}"]
        reaper.reap(said.append, sweep_children=False)  # nothing left: nothing said
        assert len(said) == 1
    finally:
        for proc in (seen, other):
            proc.kill()
            proc.wait(10)
