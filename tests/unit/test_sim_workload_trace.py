"""`tandem plan --workload TRACE` (loadtest/sim/workload_trace.py) and the control-plane cores
the plan reports (plan_control.py): the trace format read back, bad lines named, a replay
deterministic, the cores consistent with the CPU each run counted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cluster.cli import main
from loadtest.sim.plan_control import best_run, line, need
from loadtest.sim.workload_trace import KIND, TraceError, TraceRequest, read_trace

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "loadtest" / "sim" / "configs" / "gpu-example.yaml"
GOODPUT = ROOT / "loadtest" / "bench" / "results" / "prefill_steps" / "goodput.json"

LINES = [
    {"arrival_s": 0.0, "prompt_tokens": 300, "output_tokens": 8},
    {"arrival_s": 0.1, "prompt_tokens": 200, "output_tokens": 16, "prefix_group": "sys", "prefix_tokens": 128},
    {"arrival_s": 0.1, "prompt_tokens": 400, "output_tokens": 4, "prefix_group": "sys", "prefix_tokens": 160},
    {"arrival_s": 0.25, "prompt_tokens": 64, "output_tokens": 32},
    {"arrival_s": 0.4, "prompt_tokens": 500, "output_tokens": 8, "prefix_group": "other", "prefix_tokens": 0},
]


def _write(path: Path, lines) -> Path:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def _trace(tmp_path: Path, n: int = 24) -> Path:
    """n light requests over ~1 s, a third sharing a 256-token prefix."""
    lines = [{"arrival_s": round(0.05 * i, 3), "prompt_tokens": 512 if i % 2 else 256, "output_tokens": 16 + 8 * (i % 3),
              **({"prefix_group": "sys", "prefix_tokens": 256} if i % 3 == 0 else {})} for i in range(n)]
    return _write(tmp_path / "trace.jsonl", lines)


def test_a_trace_round_trips_into_the_simulators_schedule(tmp_path):
    path = _write(tmp_path / "t.jsonl", LINES[:2] + [""] + LINES[2:])  # a blank line is skipped
    trace = read_trace(path)
    assert trace.requests == (TraceRequest(0.0, 300, 8), TraceRequest(0.1, 200, 16, "sys", 128),
                              TraceRequest(0.1, 400, 4, "sys", 160), TraceRequest(0.25, 64, 32),
                              TraceRequest(0.4, 500, 8, "other", 0))
    assert trace.span_s == 0.4 and trace.rate_rps == pytest.approx(5 / 0.4)
    one = trace.load(1.0, seed=0)
    assert one.duration_s == 0.4 and one.rate_rps == 12.5 and one.speed == 1.0
    assert [(r.index, r.at_s, len(r.prompt), r.max_tokens, r.kind) for r in one.schedule] == \
        [(i, x.arrival_s, x.prompt_tokens, x.output_tokens, KIND) for i, x in enumerate(trace.requests)]
    # The group's requests share its prefix (a longer one extends a shorter), and nothing else.
    a, b = one.schedule[1].prompt, one.schedule[2].prompt
    assert a[:128] == b[:128] and a[128:] != b[128:160]
    assert one.schedule[0].prompt[:128] != a[:128]
    # --rates are replay speeds: twice as fast, half the window, the same prompts.
    two = trace.load(2.0, seed=0)
    assert [r.at_s for r in two.schedule] == [r.at_s / 2 for r in one.schedule]
    assert two.duration_s == 0.2 and two.rate_rps == 25.0
    assert [r.prompt for r in two.schedule] == [r.prompt for r in one.schedule]
    assert trace.load(1.0, seed=0) == one and trace.load(1.0, seed=1).schedule[0].prompt != one.schedule[0].prompt
    assert trace.describe()["prefix_groups"] == 2 and trace.kinds()[0] == (0.2, 64, 32)


@pytest.mark.parametrize("bad,message", [
    ("{not json", "not JSON"),
    ("[1, 2]", "a request is a JSON object"),
    ('{"arrival_s": 0.2, "prompt_tokens": 10}', "missing output_tokens"),
    ('{"arrival_s": 0.2, "prompt_tokens": 10, "output_tokens": 5, "arrival": 1}', "unknown field(s) arrival"),
    ('{"arrival_s": -1, "prompt_tokens": 10, "output_tokens": 5}', "arrival_s must be a finite number"),
    ('{"arrival_s": "soon", "prompt_tokens": 10, "output_tokens": 5}', "arrival_s must be a finite number"),
    ('{"arrival_s": 0.05, "prompt_tokens": 10, "output_tokens": 5}', "before the previous request's 0.1"),
    ('{"arrival_s": 0.2, "prompt_tokens": 0, "output_tokens": 5}', "prompt_tokens must be an integer >= 1"),
    ('{"arrival_s": 0.2, "prompt_tokens": 10, "output_tokens": 2.5}', "output_tokens must be an integer >= 1"),
    ('{"arrival_s": 0.2, "prompt_tokens": 10, "output_tokens": true}', "output_tokens must be an integer >= 1"),
    ('{"arrival_s": 0.2, "prompt_tokens": 10, "output_tokens": 5, "prefix_group": "a"}', "go together"),
    ('{"arrival_s": 0.2, "prompt_tokens": 10, "output_tokens": 5, "prefix_group": "", "prefix_tokens": 1}',
     "non-empty string"),
    ('{"arrival_s": 0.2, "prompt_tokens": 10, "output_tokens": 5, "prefix_group": "a", "prefix_tokens": 11}',
     "exceeds prompt_tokens 10"),
    ('{"arrival_s": 0.2, "prompt_tokens": 1000000, "output_tokens": 5}', "past the 131072 tokens"),
])
def test_a_bad_line_is_named_with_its_file_and_line(tmp_path, bad, message):
    path = _write(tmp_path / "bad.jsonl", ['{"arrival_s": 0.1, "prompt_tokens": 10, "output_tokens": 5}', bad])
    with pytest.raises(TraceError) as err:
        read_trace(path)
    assert str(err.value).startswith(f"{path}:2: ") and message in str(err.value)


def test_the_cli_reports_a_bad_trace_in_one_line_not_a_traceback(tmp_path):
    path = _write(tmp_path / "bad.jsonl", [LINES[0], '{"arrival_s": 1, "prompt_tokens": -3, "output_tokens": 5}'])
    with pytest.raises(SystemExit, match=r"bad\.jsonl:2: prompt_tokens must be an integer >= 1, got -3"):
        main(["plan", "--config", str(EXAMPLE), "--workload", str(path), "--out", str(tmp_path / "o")])
    for empty in ([], [{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 5}]):
        with pytest.raises(TraceError, match="no requests|must span some time"):
            read_trace(_write(tmp_path / "empty.jsonl", empty))
    with pytest.raises(SystemExit, match="--duration applies to --workload mix"):
        main(["plan", "--config", str(EXAMPLE), "--workload", str(_trace(tmp_path)), "--duration", "5"])
    with pytest.raises(SystemExit, match="--rates auto is for --workload mix"):
        main(["plan", "--config", str(EXAMPLE), "--workload", str(_trace(tmp_path)), "--rates", "auto"])


def _args(*argv: str):
    import argparse
    from loadtest.sim.plan_cli import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(["--config", str(EXAMPLE), *argv])


@pytest.mark.parametrize("flag, value", [("--long", "4096:32"), ("--short", "64:256"), ("--prefill-share", "0.5"),
                                         ("--max-requests", "100"), ("--duration", "5")])
def test_a_mix_only_flag_beside_a_trace_is_refused_by_name(tmp_path, flag, value):
    from loadtest.sim.plan_inputs import workload

    with pytest.raises(SystemExit) as err:
        workload(_args("--workload", str(_trace(tmp_path)), flag, value))
    text = str(err.value)
    assert text.startswith(f"{flag} applies to --workload mix only: with the trace ") and f"drop {flag}," in text


def test_the_mix_flags_default_where_the_mix_is_built_and_a_trace_alone_reads_fine(tmp_path):
    from loadtest.sim.plan_inputs import describe, workload

    assert describe(workload(_args())) == {"mix": {"long": "2048:64", "short": "128:512", "prefill_share": 0.7}}
    mix = workload(_args("--long", "4096:32", "--prefill-share", "0.25"))
    assert describe(mix) == {"mix": {"long": "4096:32", "short": "128:512", "prefill_share": 0.25}}
    assert len(workload(_args("--workload", str(_trace(tmp_path)), "--rates", "2", "--seed", "3")).requests) == 24
    # A default value passed explicitly is still a flag the trace would drop: refused too, all named at once.
    with pytest.raises(SystemExit, match="--long, --prefill-share apply to --workload mix only"):
        workload(_args("--workload", str(_trace(tmp_path)), "--long", "2048:64", "--prefill-share", "0.7"))


def test_a_goodput_record_is_refused_with_the_mix_that_replays_it():
    # Its per-request records hold no arrival time and no prompt length: nothing to replay from.
    with pytest.raises(TraceError) as err:
        read_trace(GOODPUT)
    text = str(err.value)
    assert "no arrival time and no prompt length" in text
    assert "--workload mix --long 512:8 --short 64:128 --prefill-share 0.7 --rates 0.5,1 --duration 30 --seed 0" in text


def _plan(tmp_path: Path, out: str, *extra: str) -> tuple[dict, bytes]:
    rc = main(["plan", "--config", str(EXAMPLE), "--workload", str(_trace(tmp_path)), "--rates", "1,3",
               "--bandwidths-gbps", "10", *extra, "--out", str(tmp_path / out)])
    assert rc == 0
    raw = (tmp_path / out / "plan.json").read_bytes()
    return json.loads(raw), raw


def test_a_trace_replay_is_deterministic_and_its_control_plane_cores_add_up(tmp_path, capsys):
    first, raw1 = _plan(tmp_path, "a", "--control-cores", "0.6")
    _, raw2 = _plan(tmp_path, "b", "--control-cores", "0.6")
    assert raw1 == raw2  # same trace, same seed: the same bytes
    out = capsys.readouterr().out
    assert first["label"] == "SIMULATED" and first["workload"]["trace"]["requests"] == 24
    rows = first["rows"]
    assert sorted({r["replay_speed"] for r in rows}) == [1.0, 3.0]
    assert sorted({r["rate_rps"] for r in rows}) == first["workload"]["rates_rps"] == [round(24 / 1.15, 3), round(3 * 24 / 1.15, 3)]
    assert all(r["goodput_rps"] > 0 for r in rows)
    for r in rows:
        cp = r["control_plane"]
        cost = cp["cost"]
        # The cores are the CPU counted: tokens and requests at the measured cost, over the run's span.
        assert cp["cpu_s"] == pytest.approx(cp["tokens"] * cost["per_token_cpu_s"] +
                                            cp["requests"] * cost["per_request_cpu_s"], abs=1e-3)
        assert cp["mean_cores"] == pytest.approx(cost["baseline_cores"] + cp["cpu_s"] / cp["span_s"], abs=2e-3)
        assert cp["tokens"] >= 24 * 16 and cp["saturated"] == (cp["peak_cores_1s"] > 0.6)
        assert "control_plane-issue27.json" in cost["source"]
    for system, n in first["control_plane_need"].items():
        mine = [r for r in rows if r["system"] == system]
        assert n["peak_cores_1s"] == max(r["control_plane"]["peak_cores_1s"] for r in mine)
        past = [r["rate_rps"] for r in mine if r["control_plane"]["peak_cores_1s"] > 0.6]
        assert n["exceeds_cores"] == bool(past) and n["exceeds_from_rate_rps"] == (min(past) if past else None)
    assert first["control_plane_need"]["adaptive"]["exceeds_cores"]  # 0.35 baseline + tokens: past 0.6
    assert "past --control-cores 0.6" in out and "control-plane cores needed" in out


def test_a_gpu_budget_plan_on_a_trace_states_the_recommendations_control_plane(tmp_path, capsys):
    argv = ["plan", "--config", str(EXAMPLE), "--gpus", "2xH200", "--model", "llama-3.1-8b", "--tp", "1",
            "--workload", str(_trace(tmp_path)), "--modes", "adaptive", "--bandwidths-gbps", "10,100"]
    assert main(argv + ["--out", str(tmp_path / "o")]) == 0
    raw = (tmp_path / "o" / "plan.json").read_bytes()
    result = json.loads(raw)
    rec = result["recommendation"]
    assert result["workload"]["duration_from"].startswith("the trace")
    assert result["search"]["ladder"] == [1] and result["search"]["ladder_unit"] == "replay speeds of the trace"
    assert {r["replay_speed"] for r in result["rows"] if r["replay_speed"] != 1.0} <= {0.5, 0.25, 0.125, 0.75, 0.375}
    mine = [r for r in result["rows"] if r["candidate"] == rec["candidate"]]
    at = best_run(mine)
    assert at["rate_rps"] == rec["capacity_rps"] and at["meets"]  # the run the score came from
    cp = rec["control_plane"]
    assert cp == result["control_plane_need"][rec["candidate"]] == need(mine, 4.0, at)
    assert cp["at_best"]["peak_cores_1s"] == at["control_plane"]["peak_cores_1s"]
    assert cp["per_token_cpu_ms"] > 0 and "control_plane-issue27.json" in cp["source"]
    assert set(result["control_plane_need"]) == set(rec["ranking"])
    out = capsys.readouterr().out
    assert f"the recommended {rec['candidate']} needs peak" in out and "within --control-cores 4" in out
    assert main(argv + ["--out", str(tmp_path / "again")]) == 0
    assert (tmp_path / "again" / "plan.json").read_bytes() == raw  # same trace and seed: the same bytes
    assert main(argv + ["--seeds", "1", "--out", str(tmp_path / "one")]) == 0
    assert (tmp_path / "one" / "plan.json").read_bytes() == raw  # --seeds 1 is the default, not another plan
    assert result["workload"]["seeds"] == [0] and result["search"]["seeds"] == 1
    assert result["recommendation"]["noise"]["estimate"].startswith("fixed: 5%")
    assert not any("by_seed" in r for r in result["rows"])
    # Two seeds (0 and 1: the trace's token ids and the simulation's draws): twice, the same bytes.
    seeded = []
    for out in ("s1", "s2"):
        assert main(argv + ["--seeds", "2", "--out", str(tmp_path / out)]) == 0
        seeded.append((tmp_path / out / "plan.json").read_bytes())
    assert seeded[0] == seeded[1] and seeded[0] != raw
    two = json.loads(seeded[0])
    assert two["workload"]["seeds"] == [0, 1] and two["search"]["seeds"] == 2
    assert two["search"]["runs"] == 2 * two["search"]["loads_run"]
    assert two["search"]["max_runs_per_candidate_and_link"] == 2 * two["search"]["max_loads_per_candidate_and_link"]
    assert all([b["seed"] for b in r["by_seed"]] == [0, 1] for r in two["rows"])
    # A different seed set is another plan: its first seed moves.
    assert main(argv + ["--seed", "5", "--seeds", "2", "--out", str(tmp_path / "s5")]) == 0
    assert json.loads((tmp_path / "s5" / "plan.json").read_bytes())["workload"]["seeds"] == [5, 6]


def test_need_reads_the_busiest_run_and_the_first_load_past_the_cores():
    def row(rate, bw, meets, peak, mean):
        return {"rate_rps": rate, "bandwidth_gbps": bw, "meets": meets,
                "control_plane": {"peak_cores_1s": peak, "mean_cores": mean,
                                  "cost": {"per_token_cpu_s": 0.0005, "baseline_cores": 0.35, "source": "s"}}}

    rows = [row(1, 10, True, 1.0, 0.8), row(2, 10, True, 3.0, 2.0), row(4, 10, False, 5.0, 3.0),
            row(1, 100, True, 1.1, 0.8), row(2, 100, True, 3.1, 2.1), row(4, 100, True, 5.5, 3.5)]
    at = best_run(rows)
    assert (at["rate_rps"], at["bandwidth_gbps"]) == (2, 10)  # the capacity at the worst link
    n = need(rows, 4.0, at)
    assert (n["peak_cores_1s"], n["mean_cores"], n["at_rate_rps"], n["at_bandwidth_gbps"]) == (5.5, 3.5, 4, 100)
    assert n["exceeds_cores"] and n["exceeds_from_rate_rps"] == 4 and n["per_token_cpu_ms"] == 0.5
    assert n["at_best"] == {"rate_rps": 2, "bandwidth_gbps": 10, "peak_cores_1s": 3.0, "mean_cores": 2.0,
                            "exceeds_cores": False, "meets_slo": True}
    assert not need(rows, 6.0)["exceeds_cores"] and need(rows, 6.0)["exceeds_from_rate_rps"] is None
    # No load met at its worst link: the run is that link's lowest load, and the line says so.
    missed = [row(2, 10, False, 1, 1), row(1, 10, False, 1, 1)]
    assert best_run(missed)["rate_rps"] == 1
    assert "at its lowest load, which missed the SLO (1 req/s" in line(need(missed, 4.0, best_run(missed)))


def test_the_example_trace_is_also_a_load_test_trace():
    """One trace format: the load tests' reader (loadtest/workloads.py) takes the simulator's file too."""
    from loadtest.workloads import parse_trace
    example = Path(__file__).resolve().parents[2] / "loadtest" / "sim" / "configs" / "trace-example.jsonl"
    sim = read_trace(example)
    load_test = parse_trace(example.read_text().splitlines(), str(example))
    assert [(e.arrival_s, e.prompt_tokens, e.output_tokens) for e in load_test] == \
        [(r.arrival_s - sim.requests[0].arrival_s, r.prompt_tokens, r.output_tokens) for r in sim.requests]
