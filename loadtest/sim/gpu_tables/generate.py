"""Offline: write vllm_llama31.json, GPU step-time tables from NVIDIA AIConfigurator's data.

Run with a venv that has AIConfigurator (never tandem's: it is not a dependency of tandem):

    python3 -m venv /work/aic-venv && /work/aic-venv/bin/pip install aiconfigurator==0.12.0
    /work/aic-venv/bin/python loadtest/sim/gpu_tables/generate.py

What it writes, per GPU (H100 SXM, H200 SXM) x model (Llama-3.1-8B, -70B) x TP (1, 2, 4, 8) x
GEMM precision (fp8, bfloat16), from AIConfigurator's op-level composition of its vLLM kernel
measurements (GEMM, attention, all-reduce microbenchmarks; perf data version = vLLM 0.24.0):
- `shared_ms[T]`: every op of one forward pass except attention (GEMMs, all-reduces, norms,
  activation, embedding, logits), for T tokens in the step, at exactly the GEMM table's
  measured M values (it measures both sides of each tile boundary, e.g. 1024 and 1025, and
  the step jumps there, so interpolating a coarser grid would smooth a real jump away);
- `decode_shared_ms[b]`: the same for a decode-only step (AIC's generation op list);
- `gen_attn_ms[b][s]`: decode attention, b sequences each reading s KV positions, on the
  attention table's measured batch x KV-length grid;
- `ctx_attn_ms[N]`: prefill attention of one fresh N-token prompt, on the measured grid.
AIConfigurator's end-to-end corrections for vLLM (a per-request dispatch overhead and a TTFT
queuing factor, both calibrated by NVIDIA against its silicon corpus) are NOT applied: the
engine model (engine.py) does the scheduling itself, and the silicon rows stay held out.

It also copies AIConfigurator's measured end-to-end samples of vLLM serving Llama-3.1 on
H100/H200 (`systems/silicon_sample.csv`) into the file: validate_gpu.py predicts them. Beside
each, AIC's own end-to-end estimate (`aic_ttft_ms`, `aic_tpot_ms`), a reference only.
"""

from __future__ import annotations

import csv
import datetime
import json
import logging
import sys
from importlib import metadata
from pathlib import Path

OUT = Path(__file__).resolve().parent / "vllm_llama31.json"
SYSTEMS = {"H100": "h100_sxm", "H200": "h200_sxm"}
MODELS = {"llama-3.1-8b": "meta-llama/Meta-Llama-3.1-8B", "llama-3.1-70b": "meta-llama/Meta-Llama-3.1-70B"}
TPS = (1, 2, 4, 8)
GEMMS = ("fp8", "bfloat16")
MAX_TOKENS = 16384  # 2x vLLM's default token budget on H100/H200-class GPUs (8192)


def _sig(x: float) -> float:
    return float(f"{x:.5g}")  # 5 significant digits: far below the data's own noise, keeps the file small


def _session(system: str, model_path: str, tp: int, gemm: str):
    from aiconfigurator.sdk.backends.factory import get_backend
    from aiconfigurator.sdk.config_builders import build_model_config
    from aiconfigurator.sdk.inference_session import InferenceSession
    from aiconfigurator.sdk.models import get_model
    from aiconfigurator.sdk.perf_database import get_database_view, get_latest_database_version

    version = get_latest_database_version(system=system, backend="vllm")
    db = get_database_view(system, "vllm", version, allow_missing_data=False, database_mode="SILICON",
                           transfer_policy=None)
    model_config = build_model_config(tp, 1, 1, None, None, gemm, None, None, None, None)
    model = get_model(model_path, model_config, "vllm")
    return InferenceSession(model, db, get_backend("vllm")), model, db, version, model_config


def _grids(system: str) -> tuple[list[int], list[int], list[int], list[int]]:
    """The measured axes of AIC's vLLM tables on this GPU: GEMM M, decode batch, decode KV length
    (its `step` + 1), prefill length."""
    import pandas as pd

    from aiconfigurator.sdk.perf_database import get_latest_database_version

    import aiconfigurator_core

    base = Path(aiconfigurator_core.__file__).parent / "systems" / "data" / system
    ver = get_latest_database_version(system=system, backend="vllm")
    gemm = pd.read_parquet(base / "gemm" / "vllm" / ver / "gemm_perf.parquet")
    gen = pd.read_parquet(base / "attention" / "vllm" / ver / "generation_attention_perf.parquet")
    ctx = pd.read_parquet(base / "attention" / "vllm" / ver / "context_attention_perf.parquet")
    ms = sorted(int(m) for m in gemm["m"].unique() if m <= MAX_TOKENS)
    bs = sorted(int(b) for b in gen["batch_size"].unique())
    ss = sorted(int(s) + 1 for s in gen["step"].unique())
    ns = sorted(int(n) for n in ctx["isl"].unique() if n <= MAX_TOKENS)
    return ms, bs, ss, ns


def table(system: str, model_path: str, tp: int, gemm: str, grids) -> dict:
    from aiconfigurator.sdk.config import RuntimeConfig
    from aiconfigurator.sdk.step_estimate import MixedStepInput

    sess, model, db, version, mc = _session(system, model_path, tp, gemm)
    backend = sess._backend
    ms, bs, ss, ns = grids

    def mixed(tokens: int) -> dict:
        # One fresh prompt of `tokens` tokens, no decodes: its components split attention off.
        return sess.run_mixed(RuntimeConfig(isl=tokens, osl=1, batch_size=1), MixedStepInput(tokens, 0)).component_latency_ms

    def decode(b: int, s: int) -> tuple[float, float]:
        # AIC's decode step reads KV at s = isl + osl // 2 + 1: isl = s - 1, osl = 1 gives s.
        total, _, per_op, _, _ = backend._get_genonly_step_latency(
            model, db, RuntimeConfig(isl=s - 1, osl=1, batch_size=b), b, s - 1, 1)
        return total, per_op["generation_attention"]

    shared = [_sig(mixed(t)["shared_non_attention"]) for t in ms]
    ctx_attn = [_sig(mixed(n)["context_attention"]) for n in ns]
    gen_attn, decode_shared = [], []
    for b in bs:
        row = []
        for s in ss:
            total, attn = decode(b, s)
            row.append(_sig(attn))
            if s == ss[0]:
                decode_shared.append(_sig(total - attn))
        gen_attn.append(row)
    return {
        "gpu_system": system, "aic_model": model_path, "tp": tp, "gemm": gemm,
        "kv_cache": mc.kvcache_quant_mode.name, "fmha": mc.fmha_quant_mode.name, "comm": mc.comm_quant_mode.name,
        "layers": int(model._num_layers), "perf_data_version": version,
        "tokens": ms, "shared_ms": shared, "decode_batch": bs, "decode_shared_ms": decode_shared,
        "kv_len": ss, "gen_attn_ms": gen_attn, "prompt_len": ns, "ctx_attn_ms": ctx_attn,
    }


def silicon_rows() -> list[dict]:
    """AIConfigurator's measured serving samples of vLLM + Llama-3.1 on H100/H200 (agg: one engine
    per TP group serving both phases), verbatim but for the columns the validation needs."""
    import aiconfigurator_core

    path = Path(aiconfigurator_core.__file__).parent / "systems" / "silicon_sample.csv"
    gpus = {v: k for k, v in SYSTEMS.items()}
    out = []
    for r in csv.DictReader(path.open()):
        if r["backend"] != "vllm" or r["system"] not in gpus or "Llama-3.1" not in r["model_path"] or r["mode"] != "agg":
            continue
        model = "llama-3.1-70b" if "70B" in r["model_path"] else "llama-3.1-8b"
        out.append({"id": r["id"], "gpu": gpus[r["system"]], "model": model, "model_path": r["model_path"],
                    "backend_version": r["backend_version"] or None, "gemm": r["gemm_quant_mode"] or "bfloat16",
                    "tp": int(r["tp_size"]), "pp": int(r["pp_size"]), "isl": int(r["isl"]), "osl": int(r["osl"]),
                    "concurrency": int(r["batch_size"]), "ttft_ms": _sig(float(r["silicon_ttft_ms"])),
                    "tpot_ms": _sig(float(r["silicon_tpot_ms"])), "source": r["silicon_data_source"]})
    return sorted(out, key=lambda r: r["id"])


def aic_estimates(rows: list[dict]) -> None:
    """AIConfigurator's own end-to-end estimate of each measured row (its `estimate` command, agg
    mode), beside it for reference: its vLLM corrections were fitted to these rows, so this is
    not a held-out figure; it shows what AIC itself makes of the same kernel data."""
    from aiconfigurator.cli.api import cli_estimate

    for r in rows:
        print(f"[gen] AIC estimate {r['id']}", file=sys.stderr, flush=True)
        try:
            e = cli_estimate(MODELS[r["model"]], SYSTEMS[r["gpu"]], backend_name="vllm", batch_size=r["concurrency"],
                             isl=r["isl"], osl=r["osl"], tp_size=r["tp"], gemm_quant_mode=r["gemm"])
            r["aic_ttft_ms"], r["aic_tpot_ms"] = _sig(float(e.ttft)), _sig(float(e.tpot))
        except Exception as exc:  # an OOM verdict or an unsupported point: no estimate, say why
            r["aic_ttft_ms"] = r["aic_tpot_ms"] = None
            r["aic_error"] = str(exc)[:200]


def main() -> int:
    logging.disable(logging.WARNING)  # AIC logs every fallback table it loads; none of them is queried here
    tables = []
    for gpu, system in SYSTEMS.items():
        grids = _grids(system)
        for model, path in MODELS.items():
            for tp in TPS:
                for gemm in GEMMS:
                    print(f"[gen] {gpu} {model} tp{tp} {gemm}", file=sys.stderr, flush=True)
                    tables.append({"gpu": gpu, "model": model, **table(system, path, tp, gemm, grids)})
    rows = silicon_rows()
    aic_estimates(rows)

    out = {
        "what": "seconds per vLLM engine step, in ms, composed by NVIDIA AIConfigurator from its measured vLLM "
                "kernel data (GEMM, attention, all-reduce); plus its measured serving samples (held out)",
        "provenance": {
            "tool": "aiconfigurator", "version": metadata.version("aiconfigurator"),
            "core_version": metadata.version("aiconfigurator-core"),
            "data": "aiconfigurator_core/systems/data/{h100_sxm,h200_sxm}/{gemm,attention,comm}/vllm/<perf_data_version>/ "
                    "and systems/silicon_sample.csv",
            "method": "InferenceSession.run_mixed (shared_non_attention, context_attention components) and "
                      "backend._get_genonly_step_latency (generation_attention), database_mode=SILICON, no "
                      "end-to-end corrections",
            "generated": datetime.date.today().isoformat(),
            "generator": "loadtest/sim/gpu_tables/generate.py",
            "license": "Apache-2.0 (derived from NVIDIA AIConfigurator's data; see NOTICE beside this file)",
        },
        "tables": tables,
        "silicon": rows,
    }
    OUT.write_text(json.dumps(out, separators=(",", ":"), sort_keys=True) + "\n")
    print(f"[gen] {len(tables)} tables, {len(rows)} silicon rows -> {OUT} ({OUT.stat().st_size} bytes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
