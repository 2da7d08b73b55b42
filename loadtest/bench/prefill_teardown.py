"""A prefill replica torn down while decodes have yet to pull its KV, on real engines (issue 29,
item 2's prefill half): the replica's teardown with the lease drain (prefill_workers/
lease_drain.py) against the teardown before it (the engine shut down at once).

    .venv/bin/python -m loadtest.bench.prefill_teardown [--prompts 3] [--pull-after 1.0]

Per mode a fresh producer engine (VLLMEngine, NIXL) inside a PrefillWorker object (the class
Serve instantiates, without Serve), one consumer engine in a child process (vLLM's metric
registry is per process) that lives through both modes. The producer prefills `--prompts`
prompts of 300 random tokens and stamps their handoffs; then its teardown starts, and
`--pull-after` seconds later (a decode engine's queue) the consumer decodes each handoff.
Recorded per request: prompt tokens pulled over NIXL (the part of the prompt the consumer's
prefix cache, warm from the plain run, lacks), failed transfers, the
decode's time, and whether the greedy tokens equal those of a plain run; per mode how long
the teardown took. Writes JSON (results/prefill_teardown.json).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import random
import time
import uuid
from pathlib import Path

from cluster.config import EngineConfig, KVTransferConfig
from cluster.engine.base import EngineSpec
from cluster.engine.replica import EngineReplica
from cluster.protocol import EngineRequest
from kv_transfer.nixl import claim_side_channel
from loadtest.bench.tandem_run import machine

RESULTS = Path(__file__).resolve().parent / "results"
MAX_TOKENS = 8


def _spec(model: Path, role: str, core: str, worker_id: str) -> EngineSpec:
    kv = KVTransferConfig()
    return EngineSpec(model_path=model, served_name="m", dtype="float32", max_model_len=1024,
                      engine=EngineConfig.model_validate({"kv_cache_memory_bytes": 128 << 20, "max_num_seqs": 8}),
                      kv_role=role, kv=kv, nixl=claim_side_channel("127.0.0.1", kv.side_channel_ports),
                      cpu_binding=core, on_gpu=False, worker_id=worker_id)


def _request(rid: str, prompt: tuple[int, ...]) -> EngineRequest:
    from vllm import SamplingParams

    return EngineRequest(rid, prompt, SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True),
                         tier="interactive")


def _consumer(conn, model: Path) -> None:
    """The decode engine, in its own process: (rid, prompt, params) in, what it did out."""
    from cluster.engine.vllm import VLLMEngine

    engine = VLLMEngine(_spec(model, "kv_consumer", "1", "decode"))
    engine.start()
    conn.send("ready")

    async def one(rid, prompt, params):
        before = engine.stats()
        started = time.monotonic()
        tokens = [t async for out in engine.generate(_request(rid, prompt), params) for t in out.outputs[0].token_ids]
        after = engine.stats()
        return {"tokens": tokens, "decode_s": round(time.monotonic() - started, 3),
                "pulled": after.prompt_tokens_transferred - before.prompt_tokens_transferred,
                "failed_transfers": after.kv_failed_transfers - before.kv_failed_transfers}

    loop = asyncio.new_event_loop()  # one loop for the engine's life: AsyncLLM binds its output task to it
    while (job := conn.recv()) is not None:
        conn.send(loop.run_until_complete(one(*job)))
    engine.shutdown()
    loop.close()


def _producer(model: Path, worker_id: str):
    from cluster.engine.vllm import VLLMEngine
    from prefill_workers.deployment import PrefillWorker

    worker = object.__new__(PrefillWorker.func_or_class)  # the class Serve instantiates, without Serve
    worker.engine = VLLMEngine(_spec(model, "kv_producer", "0", worker_id))
    worker.info = worker.engine.start()
    return worker


async def _mode(name: str, model: Path, conn, prompts, reference, pull_after: float) -> dict:
    worker = _producer(model, f"prefill-{name}")
    handoffs = []
    for i, prompt in enumerate(prompts):
        request = _request(f"{name}-{i}-{uuid.uuid4().hex[:8]}", prompt)
        result = await worker.engine.prefill(request)
        handoffs.append((request.request_id, worker.handoff(result, request).params))
    held = worker.engine.stats().kv_cache_usage

    async def teardown() -> float:
        started = time.monotonic()
        if name == "drain":
            await worker.__del__()
        else:
            EngineReplica.__del__(worker)  # the teardown before the drain: the engine stops at once
        return time.monotonic() - started

    torn = asyncio.create_task(teardown())
    await asyncio.sleep(pull_after)
    decodes = []
    for (rid, params), prompt, expected in zip(handoffs, prompts, reference):
        conn.send((rid, prompt, params))
        out = await asyncio.to_thread(conn.recv)
        decodes.append({"request": rid, "same_tokens": out.pop("tokens") == expected, **out})
    teardown_s = await torn
    return {"mode": name, "producer_kv_usage_before_teardown": held, "teardown_s": round(teardown_s, 3),
            "requests": decodes,
            # The consumer's prefix cache keeps the reference run's full blocks of each prompt, so only
            # the rest moves over NIXL: a pull is a transfer that moved tokens and did not fail.
            "pulled_ok": sum(d["pulled"] > 0 and d["failed_transfers"] == 0 for d in decodes),
            "failed_transfers": sum(d["failed_transfers"] for d in decodes),
            "same_tokens": sum(d["same_tokens"] for d in decodes)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=Path(".tandem/models/SmolLM2-135M-Instruct"))
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--pull-after", type=float, default=1.0)
    parser.add_argument("--out", type=Path, default=RESULTS / "prefill_teardown.json")
    args = parser.parse_args(argv)
    rng = random.Random(0)
    prompts = [tuple(rng.randrange(5, 250) for _ in range(300)) for _ in range(args.prompts)]
    ctx = multiprocessing.get_context("spawn")
    conn, child_conn = ctx.Pipe()
    child = ctx.Process(target=_consumer, args=(child_conn, args.model.resolve()))
    child.start()
    assert conn.recv() == "ready"
    reference = []
    for i, prompt in enumerate(prompts):  # the plain run: the consumer computes the prompt itself
        conn.send((f"ref-{i}-{uuid.uuid4().hex[:8]}", prompt, None))
        reference.append(conn.recv()["tokens"])
    modes = []
    for name in ("no-drain", "drain"):
        print(f"[prefill_teardown] {name}: producer starting", flush=True)
        modes.append(asyncio.run(_mode(name, args.model.resolve(), conn, prompts, reference, args.pull_after)))
        m = modes[-1]
        print(f"[prefill_teardown] {name}: teardown {m['teardown_s']} s, pulled over NIXL {m['pulled_ok']}/"
              f"{len(prompts)}, failed transfers {m['failed_transfers']}, same tokens {m['same_tokens']}/"
              f"{len(prompts)}, decode s {[d['decode_s'] for d in m['requests']]}", flush=True)
    conn.send(None)
    child.join(60)
    report = {"benchmark": "prefill_teardown", "machine": machine(), "model": str(args.model),
              "prompt_tokens": 300, "max_tokens": MAX_TOKENS, "pull_after_s": args.pull_after, "modes": modes}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"[prefill_teardown] wrote {args.out}")
    drain = modes[-1]
    return 0 if drain["pulled_ok"] == len(prompts) and drain["same_tokens"] == len(prompts) else 1


if __name__ == "__main__":
    raise SystemExit(main())
