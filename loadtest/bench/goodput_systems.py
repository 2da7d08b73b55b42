"""The systems the goodput benchmark compares, each started afresh on the same two cores (or
two GPUs), and the unloaded calibration run. `serving(system, ...)` is a context manager that
yields the URLs the load goes to and stops everything on exit.

  tandem-adaptive   1 prefill + 1 decode engine through tandem's gateway; the decider picks
                    remote or local prefill per request (routing.disaggregation: adaptive)
  tandem-whole      tandem-adaptive, and a short answer (max_tokens <= 16) may run whole on the
                    prefill engine (routing.whole_on_prefill_max_tokens: 16)
  tandem-decode-full  tandem-adaptive with rule 8: while the decode engine is at its bound, streams
                    run whole on the prefill engine (routing.whole_on_prefill_when_decode_full)
  tandem-noreuse    tandem-adaptive with the decode engine's first token streamed as the first
                    (kv_transfer.first_token_reuse: false): no handoff gap after the first token
  tandem-noprog     tandem-adaptive without NIXL's progress thread (kv_transfer.
                    nixl_progress_poll_ms: null): a pull progresses on the prefill engine only
                    between its steps, as tandem ran until 2026-12-03
  tandem-always     the same, every request prefilled remotely (disaggregation: always)
  tandem-oldrelay   tandem-adaptive on the relay tandem had until 2026-12-03 (gateway.ingress:
                    serve, gateway.decode_streams: per_request: Serve's HTTP proxy in front, one
                    Ray item per token per request; RESULTS.md section 11), which every goodput
                    run recorded before then used
  colocated-mbt<N>  two plain vLLM api_servers, one core each, round-robin, chunked prefill
                    with max_num_batched_tokens N (one system per N of the sweep)
  single            one plain vLLM api_server on both cores
  rayllm-pd         Ray Serve LLM's own P/D (ray.serve.llm.build_pd_openai_app): the same Ray,
                    vLLM and NIXL, one prefill and one decode engine, one core each
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Iterator, Literal, Optional

from cluster.config import ClusterConfig
from loadtest.bench.engines import DirectEngines, DirectEngineSpec
from loadtest.measure.slo import Objective

GATEWAY_PORT = 8000
TANDEM_METRICS_PORT = 8080  # the local Ray's metrics export (the decider's verdicts are read there)
TANDEM_METRICS_URL = f"http://127.0.0.1:{TANDEM_METRICS_PORT}/metrics"
DIRECT_PORTS = (8101, 8102)
RAYLLM_PORT = 8200
NAMES = ("tandem-adaptive", "tandem-decode-full", "tandem-noreuse", "tandem-noprog", "tandem-oldrelay", "tandem-whole", "tandem-always",
         "colocated", "single", "rayllm-pd")
WHOLE_MAX_TOKENS = 16  # tandem-whole's routing.whole_on_prefill_max_tokens: the prefill-heavy answers (8) fit


@dataclass(frozen=True)
class System:
    name: str
    kind: Literal["tandem", "direct", "rayllm"]
    disaggregation: str = "adaptive"  # tandem only
    whole_on_prefill_max_tokens: int = 0  # tandem only
    whole_when_decode_full: bool = False  # tandem only
    first_token_reuse: bool = True  # tandem only
    nixl_progress_thread: bool = True  # tandem only
    old_relay: bool = False  # tandem only: Serve's proxy in front, a Ray item per token (tandem-oldrelay)
    engines: int = 2  # direct only: 2 colocated, 1 on both cores
    max_num_batched_tokens: Optional[int] = None  # None: the run's --max-num-batched-tokens


def systems_of(names: list[str], colocated_sweep: list[int]) -> list[System]:
    """The systems to run, in order; `colocated` is one system per max_num_batched_tokens."""
    out: list[System] = []
    for name in names:
        if name.startswith("tandem-"):
            mode = name.removeprefix("tandem-")
            if mode == "whole":
                out.append(System(name, "tandem", whole_on_prefill_max_tokens=WHOLE_MAX_TOKENS))
            elif mode == "decode-full":
                out.append(System(name, "tandem", whole_when_decode_full=True))
            elif mode == "noreuse":
                out.append(System(name, "tandem", first_token_reuse=False))
            elif mode == "noprog":
                out.append(System(name, "tandem", nixl_progress_thread=False))
            elif mode == "oldrelay":
                out.append(System(name, "tandem", old_relay=True))
            else:
                out.append(System(name, "tandem", disaggregation=mode))
        elif name == "colocated":
            out += [System(f"colocated-mbt{n}", "direct", engines=2, max_num_batched_tokens=n)
                    for n in colocated_sweep]
        elif name == "single":
            out.append(System("single", "direct", engines=1))
        elif name == "rayllm-pd":
            out.append(System(name, "rayllm"))
        else:
            raise ValueError(f"unknown system {name!r}; choose from {', '.join(NAMES)}")
    return out


def tandem_config(args, gpu: bool, system: System, objective: Objective) -> ClusterConfig:
    # Chunked prefill on, as in every baseline (vLLM's default): the budget may be under max_model_len.
    engine = {"kv_cache_memory_bytes": args.kv_cache_mib << 20, "max_num_seqs": args.max_num_seqs,
              "max_num_batched_tokens": args.max_num_batched_tokens, "enable_chunked_prefill": True}
    if args.engine_niceness is not None:
        engine["cpu_niceness"] = args.engine_niceness
    pool = {"num_gpus": 1, "num_cpus": 0} if gpu else {"num_cpus": 1}
    return ClusterConfig.model_validate({
        "model": {"path": str(args.model), "name": args.model.name, "dtype": args.dtype,
                  "max_model_len": args.max_model_len},
        "gateway": {"host": "127.0.0.1", "port": GATEWAY_PORT,
                    **({"ingress": "serve", "decode_streams": "per_request"} if system.old_relay else {})},
        "tiers": {"interactive": {
            "prefill": {"replicas": 1, "cpu_binding": ["0"], "engine": engine, **pool},
            "decode": {"replicas": 1, "cpu_binding": ["1"], "engine": engine, **pool},
            # The decider keeps requests within the tier's objectives: the calibrated ones.
            "slo": {"ttft_s": objective.ttft_ms / 1000, "itl_s": objective.mean_itl_ms / 1000,
                    "max_gap_s": None if objective.max_gap_ms is None else objective.max_gap_ms / 1000},
            # Generous bounds: the baselines have no admission control, so neither may tandem
            # turn load away here; a request that waits too long misses its objective instead.
            "admission": {"max_running": 1024, "max_queued": 4096, "queue_timeout_s": 600},
        }},
        "routing": {"disaggregation": system.disaggregation,
                    "whole_on_prefill_max_tokens": system.whole_on_prefill_max_tokens,
                    "whole_on_prefill_when_decode_full": system.whole_when_decode_full},
        "kv_transfer": {"first_token_reuse": system.first_token_reuse,
                        **({} if system.nixl_progress_thread else {"nixl_progress_poll_ms": None})},
        "ray": {"num_cpus": None if gpu else 2, "metrics_export_port": TANDEM_METRICS_PORT},
    })


def direct_specs(args, system: System, gpu: bool) -> list[DirectEngineSpec]:
    common = dict(model_path=args.model, served_name=args.model.name, dtype=args.dtype,
                  max_model_len=args.max_model_len, on_gpu=gpu, max_num_seqs=args.max_num_seqs,
                  max_num_batched_tokens=system.max_num_batched_tokens or args.max_num_batched_tokens)
    kv = args.kv_cache_mib << 20
    if system.engines == 2:
        return [DirectEngineSpec(**common, kv_cache_memory_bytes=kv, port=port, devices=dev)
                for port, dev in zip(DIRECT_PORTS, ("0", "1"))]
    # One engine with both cores (or GPUs) gets both engines' KV cache.
    return [DirectEngineSpec(**common, kv_cache_memory_bytes=2 * kv, port=DIRECT_PORTS[0],
                             devices="0,1" if gpu else "0-1")]


@contextlib.contextmanager
def serving(system: System, args, gpu: bool, objective: Objective,
            log: Callable[[str], None]) -> Iterator[list[str]]:
    if system.kind == "tandem":
        from cluster.local import LocalCluster

        cluster = LocalCluster(tandem_config(args, gpu, system, objective), progress=log)
        cluster.start()
        try:
            yield [cluster.url]
        finally:
            cluster.stop()
    elif system.kind == "direct":
        with DirectEngines(direct_specs(args, system, gpu), progress=log) as engines:
            yield engines.urls
    else:
        from loadtest.bench.rayllm_pd import RayLLMPD

        with RayLLMPD(args, gpu, RAYLLM_PORT, log) as url:
            yield [url]


def one_core_engine(args, gpu: bool) -> DirectEngines:
    """The calibration engine: one plain vLLM engine on one core (a colocated engine's share)."""
    spec = direct_specs(args, System("calibration", "direct", engines=2), gpu)[0]
    return DirectEngines([spec])
