"""loadtest/bench/vllm_bench.py's own logic: cells parse as written, a typo is refused with the
expected shape, vLLM's command line gets the workload, and the table shows every row."""

from __future__ import annotations

import pytest

from loadtest.bench import vllm_bench
from loadtest.bench.vllm_bench import Workload


def test_cells_parse_as_concurrency_input_and_output() -> None:
    assert vllm_bench.parse_cells("1x256/64, 32x1500/16:40", prompts=12) == [
        Workload(prompts=12, input_len=256, output_len=64, concurrency=1),
        Workload(prompts=40, input_len=1500, output_len=16, concurrency=32)]


def test_a_malformed_cell_names_the_expected_shape() -> None:
    with pytest.raises(ValueError, match=r"CONCURRENCYxINPUT/OUTPUT\[:PROMPTS\].*'8x256'"):
        vllm_bench.parse_cells("8x256", prompts=4)


def test_the_workload_reaches_vllms_arguments() -> None:
    args = Workload(prompts=7, input_len=100, output_len=9, concurrency=3, seed=5).args()
    pairs = dict(zip(args[::2], args[1::2]))
    assert pairs["--num-prompts"] == "7" and pairs["--random-input-len"] == "100"
    assert pairs["--random-output-len"] == "9" and pairs["--max-concurrency"] == "3" and pairs["--seed"] == "5"
    assert "--ignore-eos" in args and pairs["--dataset-name"] == "random"


def test_the_table_has_a_line_per_cell_and_system_with_completed_of_sent() -> None:
    result = {"completed": 40, "failed": 8, "mean_ttft_ms": 1234.4, "p99_ttft_ms": 3000.0,
              "output_throughput": 55.55, "median_itl_ms": 40.04}
    rows = [{"cell": "c8 256/64", "system": "tandem", "prompts": 48, "result": result},
            {"cell": "c8 256/64", "system": "vllm", "prompts": 48, "result": {**result, "completed": 48, "failed": 0}}]
    lines = vllm_bench.table(rows).splitlines()
    assert len(lines) == 4
    assert lines[2] == "| c8 256/64 | tandem | 40/48 | 8 | 1234 | 3000 | 55.5 | 40.0 |"
    assert "| vllm | 48/48 | 0 |" in lines[3]


def test_the_summary_keeps_why_each_failed_request_failed() -> None:
    result = {"completed": 2, "failed": 1, "errors": ["", "Traceback (most recent call last):\n  ...\n"
                                                          "aiohttp.ServerDisconnectedError: Server disconnected\n", ""]}
    assert vllm_bench.summary(result)["errors"] == ["aiohttp.ServerDisconnectedError: Server disconnected"]
    assert vllm_bench.summary({"completed": 1, "failed": 0})["errors"] == []
