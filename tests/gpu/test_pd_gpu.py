"""The whole P/D path on NVIDIA GPUs: gateway → prefill engine → NIXL (VRAM, UCX cuda_ipc or
RDMA) → decode engine, with real vLLM (the CUDA build), Ray Serve and nixl-cu13.

The cluster is the GPU default `tandem run` serves on this host (cluster/configs/gpu.yaml, laid
out one engine per GPU: on one GPU prefill and decode share it), with the tiny test model in
float32 and ports of its own. Marked `gpu`, so tests/conftest.py skips it where torch sees no
GPU. Needs the GPU install (cluster/bootstrap.sh on a GPU host, or the deploy/docker GPU image):
vllm, ray[serve], the NIXL backend matching torch's CUDA. Run: pytest -m gpu tests/gpu/test_pd_gpu.py
(about 2-4 minutes).
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


def gpu_config(model_dir, gpus):
    """The GPU default as `tandem run` lays it out on `gpus` (cluster.hardware.GPUs), serving the
    tiny model: float32 (greedy output equal to transformers), its short context."""
    from cluster.config import ClusterConfig
    from cluster.gpu_default import GPU_CONFIG, lay_out_on_gpus

    overrides = {
        "model": {"path": str(model_dir), "name": MODEL_NAME, "dtype": "float32", "max_model_len": 512,
                  "tool_parser": None},
        "gateway": {"host": "127.0.0.1", "port": GATEWAY_PORT},
        "ray": {"metrics_export_port": METRICS_PORT},
    }
    return lay_out_on_gpus(ClusterConfig.load_checked(GPU_CONFIG, overrides), gpus)


@pytest.fixture(scope="module")
def gpu_cluster(tiny_model_dir):
    from cluster.hardware import gpus_here
    from cluster.local import LocalCluster

    local = LocalCluster(gpu_config(tiny_model_dir, gpus_here()), cache_dir=TEST_STATE / "gpu-cache")
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
