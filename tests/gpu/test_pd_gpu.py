"""The whole P/D path on NVIDIA GPUs: gateway → prefill engine → NIXL (VRAM, UCX cuda_ipc or
RDMA) → decode engine, with real vLLM (the CUDA build), Ray Serve and nixl-cu13.

One GPU: both engines share it (half a GPU each); two or more: one each. Marked `gpu`, so
tests/conftest.py skips it where torch sees no GPU. Needs the GPU install (cluster/bootstrap.sh
on a GPU host, or the deploy/docker GPU image): vllm, ray[serve], the NIXL backend matching
torch's CUDA. Run: pytest -m gpu tests/gpu/test_pd_gpu.py (about 2-4 minutes).
"""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import TEST_STATE
from tests.support.kv_checks import assert_prompt_kv_moved

pytestmark = pytest.mark.gpu

GATEWAY_PORT = 8795  # clear of the integration cluster's 8765-8767
METRICS_PORT = 8796
MODEL_NAME = "tiny-llama"
MAX_TOKENS = 12
PROMPT = "Disaggregation moves the finished KV cache from the prefill engine to decode. " * 6


def gpu_config(model_dir, gpus: int):
    from cluster.config import ClusterConfig

    share = 1 if gpus >= 2 else 0.5
    engine = {"kv_cache_memory_bytes": "1G", "max_num_seqs": 8}
    return ClusterConfig.model_validate({
        "model": {"path": str(model_dir), "name": MODEL_NAME, "dtype": "float32", "max_model_len": 512},
        "gateway": {"host": "127.0.0.1", "port": GATEWAY_PORT},
        "tiers": {"interactive": {
            "prefill": {"replicas": 1, "num_cpus": 1, "num_gpus": share, "engine": engine},
            "decode": {"replicas": 1, "num_cpus": 1, "num_gpus": share, "engine": engine},
        }},
        # VRAM buffers; UCX picks among all transports (cuda_ipc on one host, rc across hosts).
        "kv_transfer": {"buffer_device": "cuda", "ucx_tls": "all", "ucx_net_devices": None},
        "ray": {"num_cpus": 4, "metrics_export_port": METRICS_PORT},
    })


@pytest.fixture(scope="module")
def gpu_cluster(tiny_model_dir):
    import torch

    from cluster.local import LocalCluster

    local = LocalCluster(gpu_config(tiny_model_dir, torch.cuda.device_count()), cache_dir=TEST_STATE / "gpu-cache")
    local.start(ready_timeout_s=600)
    yield local
    local.stop()


def _decode_stats():
    from ray import serve

    return serve.get_deployment_handle("interactive-decode", app_name="tandem").stats.remote().result()


def test_the_plan_on_this_host_is_cuda_buffers_and_the_matching_nixl():
    from cluster import doctor

    facts = doctor.gather()
    chosen = doctor.plan(facts)
    assert facts.gpus and chosen.kv_buffer_device == "cuda"
    assert facts.nixl_backend == chosen.nixl_package.replace("-", "_"), doctor.report(facts, chosen)


def test_prompt_kv_moves_over_nixl_from_gpu_to_gpu(gpu_cluster):
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 4, "temperature": 0}
    assert_prompt_kv_moved(gpu_cluster.url, body, _decode_stats)


def test_greedy_output_equals_transformers_on_the_gpu(gpu_cluster, tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    body = {"model": MODEL_NAME, "prompt": "The quick brown fox jumps over the lazy dog because",
            "max_tokens": MAX_TOKENS, "temperature": 0, "return_token_ids": True}
    resp = httpx.post(f"{gpu_cluster.url}/v1/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    out = resp.json()

    torch.backends.cuda.matmul.allow_tf32 = False  # float32 as vLLM computes it
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).cuda().eval()
    prompt_ids = out["prompt_token_ids"]
    with torch.no_grad():
        generated = model.generate(torch.tensor([prompt_ids], device="cuda"), max_new_tokens=MAX_TOKENS,
                                   do_sample=False, pad_token_id=tokenizer.pad_token_id)
    expected = generated[0, len(prompt_ids):].tolist()
    if tokenizer.eos_token_id in expected:
        expected = expected[: expected.index(tokenizer.eos_token_id) + 1]
    assert out["choices"][0]["token_ids"] == expected


def test_health_lists_both_gpu_pools(gpu_cluster):
    health = httpx.get(f"{gpu_cluster.url}/health", timeout=30)
    assert health.status_code == 200
    assert {"interactive-prefill", "interactive-decode"} <= set(health.json()["pools"])
