"""A KV transfer that cannot complete ends in a bounded wait and a recompute, never a hang.

The test takes a real prefill's handoff and hands the decode engine a corrupted copy:
- an unreachable side channel: a port on which nothing listens (vLLM's NIXL handshake is a
  ZMQ REQ with a 5 s receive timeout, vllm/.../nixl/base_worker.py `_nixl_handshake`);
- a wrong peer: the real prefill engine's side channel, but another engine id (the
  handshake answers, the ids differ, the handshake fails at once).
Either way decode must fail the KV load, recompute the prompt itself
(kv_load_failure_policy=recompute) and answer exactly the greedy text of a normal request.
"""

from __future__ import annotations

import dataclasses
import random
import time
import uuid

import pytest
from vllm import SamplingParams

from cluster.config import KVTransferConfig
from cluster.protocol import EngineRequest
from kv_transfer.nixl import claim_side_channel
from tests.support.integration_cluster import replica_stats


BOUND_S = 30  # handshake timeout (5 s) + recompute, with room for a busy 2-core machine
DECODE = "interactive-decode"


def handles():
    from ray import serve

    return (serve.get_deployment_handle("interactive-prefill", app_name="tandem"),
            serve.get_deployment_handle(DECODE, app_name="tandem"))


def decode_text(decode, request: EngineRequest, handoff) -> tuple[tuple[int, ...], str]:
    ids: list[int] = []
    text = ""
    for chunk in decode.options(stream=True).generate.remote(request, handoff):
        ids += chunk.outputs[0].token_ids
        text += chunk.outputs[0].text
    return tuple(ids), text


def unreachable(params: dict) -> dict:
    nobody = claim_side_channel("127.0.0.1", KVTransferConfig().side_channel_ports).port  # no engine, no listener
    return {**params, "remote_port": nobody, "remote_engine_id": f"ghost-{uuid.uuid4()}"}


def wrong_peer(params: dict) -> dict:
    return {**params, "remote_engine_id": f"ghost-{uuid.uuid4()}"}


@pytest.mark.parametrize("corrupt", [unreachable, wrong_peer])
def test_a_kv_transfer_that_cannot_complete_is_recomputed_within_a_bound(base_url, corrupt):
    prefill, decode = handles()
    rng = random.Random(time.time_ns())
    prompt = tuple(rng.randrange(5, 250) for _ in range(300))  # 2 full blocks and a partial one
    sampling = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    request = EngineRequest(f"faults-kv-{uuid.uuid4()}", prompt, sampling, tier="interactive")
    result = prefill.prefill.remote(request).result()
    handoff = dataclasses.replace(result.handoff, params=corrupt(result.handoff.params))  # the prefill's own, corrupted

    before = next(iter(replica_stats(DECODE, 1).values()))
    started = time.monotonic()
    ids, text = decode_text(decode, request, handoff)
    took = time.monotonic() - started
    after = next(iter(replica_stats(DECODE, 1).values()))

    # The reference: the same prompt computed on decode with no handoff at all.
    expected_ids, expected_text = decode_text(decode, EngineRequest(f"faults-kv-ref-{uuid.uuid4()}", prompt,
                                                                    sampling, tier="interactive"), None)
    recomputed = (after.prompt_tokens_computed + after.prompt_tokens_cached) - (
        before.prompt_tokens_computed + before.prompt_tokens_cached)
    print(f"\n{corrupt.__name__}: answered in {took:.2f} s; decode computed {recomputed:g} prompt tokens, "
          f"transferred {after.prompt_tokens_transferred - before.prompt_tokens_transferred:g}, "
          f"failed transfers +{after.kv_failed_transfers - before.kv_failed_transfers:g}")
    assert took < BOUND_S
    assert (ids, text) == (expected_ids, expected_text)
    assert len(ids) == 8
    assert after.prompt_tokens_transferred == before.prompt_tokens_transferred  # nothing came over NIXL
    assert recomputed >= len(prompt) - 1  # decode computed the prompt itself: a recompute
