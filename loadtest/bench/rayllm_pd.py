"""Ray Serve LLM's own prefill/decode disaggregation, the nearest peer of tandem: the same Ray,
vLLM and NIXL, built with `ray.serve.llm.build_pd_openai_app` as its docs show, one prefill
and one decode engine, one core (or GPU) each, in a Ray instance of this process.

    with RayLLMPD(args, gpu, port, log) as url: ...   # an OpenAI server at url

Tuning given to it that tandem's engines also get: each engine bound to its own core
(VLLM_CPU_OMP_THREADS_BIND), UCX over TCP/shared memory, and vLLM's NIXL CPU-host fix that
tandem's plugin applies (kv_transfer/cpu_patch.py: a progress thread that sleeps instead of
spinning, no thread moved to the other engine's core) — without it the prefill engine computes on decode's core.
"""

from __future__ import annotations

import time
from typing import Callable

import httpx

from cluster.config import KVTransferConfig
from kv_transfer.cpu_patch import PROGRESS_POLL_ENV
from kv_transfer.nixl import NixlEndpoint, nixl_env

APP_NAME = "rayllm-pd"


def llm_config(args, gpu: bool, device: str) -> dict:
    """One engine's LLMConfig (as a dict, the form Ray Serve LLM's docs use)."""
    env = {"UCX_TLS": "tcp,self,sm", "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    if gpu:
        bundles = [{"GPU": 1, "CPU": 1}]
    else:
        bundles = [{"CPU": 1}]
        patch_env = nixl_env(KVTransferConfig(), NixlEndpoint("127.0.0.1", 0), on_gpu=False)  # the same patch values
        env.update(VLLM_CPU_OMP_THREADS_BIND=device, TANDEM_NIXL_CPU_PATCH=patch_env["TANDEM_NIXL_CPU_PATCH"],
                   **{PROGRESS_POLL_ENV: patch_env[PROGRESS_POLL_ENV]})
    return {
        "model_loading_config": {"model_id": args.model.name, "model_source": str(args.model)},
        "engine_kwargs": {
            "dtype": args.dtype, "max_model_len": args.max_model_len, "enforce_eager": True,
            "kv_cache_memory_bytes": args.kv_cache_mib << 20, "max_num_seqs": args.max_num_seqs,
            "max_num_batched_tokens": args.max_num_batched_tokens,
            "kv_transfer_config": {"kv_connector": "NixlConnector", "kv_role": "kv_both",
                                   "kv_buffer_device": "cuda" if gpu else "cpu"},
        },
        "placement_group_config": {"bundles": bundles},
        "deployment_config": {"num_replicas": 1},
        "runtime_env": {"env_vars": env},
    }


class RayLLMPD:
    def __init__(self, args, gpu: bool, port: int, log: Callable[[str], None], ready_timeout_s: float = 600):
        self.args, self.gpu, self.port, self.log, self.ready_timeout_s = args, gpu, port, log, ready_timeout_s

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> str:
        import ray
        from ray import serve

        try:
            from ray.serve.llm import build_pd_openai_app
        except ImportError as exc:
            raise RuntimeError(f"Ray Serve LLM needs the ray[llm] extra's dependencies ({exc}): "
                               "run `make bench-rayllm` first") from exc

        # Logical CPUs: each engine's placement group and server actor and the ingress take
        # one each (with 4 the ingress never got scheduled); the engines are bound to cores
        # 0 and 1 by VLLM_CPU_OMP_THREADS_BIND, as tandem's are.
        ray.init(address="local", num_cpus=8, include_dashboard=False, _node_ip_address="127.0.0.1", logging_level="warning")
        try:
            serve.start(http_options={"host": "127.0.0.1", "port": self.port})
            app = build_pd_openai_app({
                "prefill_config": llm_config(self.args, self.gpu, "0"),
                "decode_config": llm_config(self.args, self.gpu, "1"),
            })
            self.log("[rayllm-pd] deploying ray.serve.llm.build_pd_openai_app (1 prefill + 1 decode engine)")
            serve.run(app, name=APP_NAME, route_prefix="/", blocking=False)
            self._wait_ready()
        except BaseException:
            self._stop()
            raise
        return self.url

    def _wait_ready(self) -> None:
        """Ready when a one-token completion answers (the /v1/models list comes up earlier)."""
        from ray import serve

        deadline = time.monotonic() + self.ready_timeout_s
        body = {"model": self.args.model.name, "prompt": "hello", "max_tokens": 1}
        last = ""
        while time.monotonic() < deadline:
            status = serve.status().applications.get(APP_NAME)
            if status is not None and status.status in ("DEPLOY_FAILED", "UNHEALTHY"):
                raise RuntimeError(f"Ray Serve LLM's P/D app is {status.status}: {status.message[-2000:]}")
            try:
                resp = httpx.post(f"{self.url}/v1/completions", json=body, timeout=60)
                if resp.status_code == 200:
                    return
                last = f"{resp.status_code} {resp.text[:300]}"
            except httpx.HTTPError as exc:
                last = repr(exc)
            time.sleep(2)
        raise TimeoutError(f"Ray Serve LLM's P/D app not ready in {self.ready_timeout_s:.0f} s; last answer: {last}")

    def __exit__(self, *exc) -> None:
        self._stop()

    def _stop(self) -> None:
        import ray
        from ray import serve

        try:
            serve.shutdown()
        finally:
            ray.shutdown()
