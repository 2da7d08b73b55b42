"""What tracing costs the gateway per request (issue 33): the edge (vLLM's app behind tandem's
middleware) in-process, over admission and a two-hop path (prefill, then a decode stream of
`--tokens` tokens) that does no work, with tracing off, and on at sampling 1.0 and 0.01. Spans go
through the BatchSpanProcessor into an exporter that encodes them as OTLP protobuf and drops the
bytes (an OTLP exporter's CPU without its network). CPU is the process's (every thread, the
span processor's included) per request, modes interleaved in rounds, the median round reported.

    .venv/bin/python -m loadtest.bench.tracing_edge [--requests 200] [--rounds 5] [--tokens 16] [--out FILE]

`--modes off` runs without importing the tracing code, so the same file measures a tree
without tracing (PYTHONPATH=<that tree>) for the "off costs nothing" comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, AsyncIterator, Optional

TIER = "interactive"
MODEL = "tiny-llama"


class DroppingOtlpExporter:
    """Encodes each batch as OTLP protobuf (what the OTLP exporters send) and drops it."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Any) -> Any:
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
        from opentelemetry.sdk.trace.export import SpanExportResult

        encode_spans(spans).SerializeToString()
        self.spans += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class NoWorkHops:
    """A prefill answer at once, then a decode stream of `tokens` one-token outputs."""

    def __init__(self, tokens: int) -> None:
        self.tokens = tokens

    async def prefill(self, request: Any, pick: Any, first_token: bool) -> Any:
        from router.pd.answers import PrefillAnswer

        return PrefillAnswer()

    async def decode(self, request: Any, handoff: Any, pick: Any, *, route: str) -> AsyncIterator[Any]:
        from vllm.outputs import CompletionOutput, RequestOutput

        for i in range(self.tokens):
            last = i == self.tokens - 1
            done = CompletionOutput(0, "", [7], None, None, "length" if last else None)
            yield RequestOutput(request.request_id, None, None, None, [done], finished=last)


class TwoHops:
    """The P/D path's shape (router/pd/path.py) over `hops`: prefill, then decode."""

    def __init__(self, hops: Any) -> None:
        self.hops = hops

    async def generate(self, request: Any) -> AsyncIterator[Any]:
        await self.hops.prefill(request, None, False)
        async for output in self.hops.decode(request, None, None, route="disaggregated"):
            yield output

    async def abort(self, request_id: str) -> None:
        pass

    async def health(self) -> dict:
        return {"ready": True}


async def build(mode: str, tokens: int, model_dir: Path) -> tuple[Any, Any]:
    from cluster.config import AdmissionConfig
    from cluster.models import make_tiny_llama
    from router.admission import AdmissionControl
    from router.openai.app import build_openai_app, vllm_config_of, vllm_server_args
    from router.openai.context import Caller
    from router.openai.engine_client import PDEngineClient
    from router.request_metrics import MeasuredBackend

    args = vllm_server_args(model_path=make_tiny_llama(model_dir), served_name=MODEL, dtype="float32",
                            max_model_len=256)
    path = TwoHops(NoWorkHops(tokens))
    admission = AdmissionControl(path, {TIER: AdmissionConfig(max_running=64, max_queued=64)})
    outer: Any = MeasuredBackend(admission)
    tracing = exporter = None
    if mode != "off":
        from cluster.config import TracingConfig
        from cluster.tracing import Tracing
        from router.tracing import TracingEdge, instrument_gateway

        exporter = DroppingOtlpExporter()
        cfg = TracingConfig(enabled=True, exporter="file", file_dir="/nonexistent", sampling_ratio=float(mode))
        tracing = Tracing.from_config(cfg, "gateway", exporter=exporter)
        outer = instrument_gateway(tracing, backend=path, router=None, admission=admission, outer=outer)
    client = PDEngineClient(vllm_config_of(args), outer, TIER)
    app = await build_openai_app(client, args, authenticate=lambda headers: Caller(TIER), health_probe=path.health,
                                 health_interval_s=0.0)
    if tracing is not None:
        app = TracingEdge(app, tracing)
    return app, (tracing, exporter)


async def run_round(app: Any, requests: int) -> float:
    import httpx

    body = {"model": MODEL, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 16,
            "stream": True}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        started = time.process_time()
        for _ in range(requests):
            r = await client.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
        return (time.process_time() - started) / requests


async def main_async(args: argparse.Namespace) -> dict:
    model_dir = Path(tempfile.gettempdir()) / "tandem-bench-tiny-llama"
    apps = {mode: await build(mode, args.tokens, model_dir) for mode in args.modes}
    for mode, (app, _) in apps.items():  # warm-up: first requests build caches
        await run_round(app, 20)
    cpu: dict[str, list[float]] = {mode: [] for mode in args.modes}
    for _ in range(args.rounds):
        for mode, (app, (tracing, _)) in apps.items():
            cpu[mode].append(await run_round(app, args.requests))
            if tracing is not None:
                tracing.provider.force_flush()  # the export's CPU lands in this round
    result = {"requests_per_round": args.requests, "rounds": args.rounds, "tokens": args.tokens, "modes": {}}
    base = statistics.median(cpu[args.modes[0]])
    for mode in args.modes:
        median = statistics.median(cpu[mode])
        spans = apps[mode][1][1].spans if apps[mode][1][1] is not None else 0
        result["modes"][mode] = {"cpu_ms_per_request": round(median * 1e3, 3), "ratio": round(median / base, 3),
                                 "rounds_ms": [round(c * 1e3, 3) for c in cpu[mode]], "spans_exported": spans}
    return result


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--modes", nargs="+", default=["off", "1.0", "0.01"],
                        help="off, or a sampling ratio (the first mode is the ratios' base)")
    parser.add_argument("--out", type=Path, help="write the result as JSON here too")
    args = parser.parse_args(argv)
    result = asyncio.run(main_async(args))
    print(f"{'mode':>6} {'CPU ms/request':>15} {'ratio':>6}  spans")
    for mode, row in result["modes"].items():
        print(f"{mode:>6} {row['cpu_ms_per_request']:>15.3f} {row['ratio']:>6.3f}  {row['spans_exported']}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
