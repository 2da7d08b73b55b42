"""The gateway's request path built in a test process over a running cluster's real Serve
handles (tests/serve's FakeEngine graph, tests/integration's vLLM cluster), with a router of
the test's choosing, and the decider's verdicts recorded. For tests whose cluster's own
gateway runs another policy (both clusters disaggregate always).

Call order: `record_verdicts(monkeypatch)` before the first request; `in_process_path(...)`;
inside the test's event loop `await ready(path)` (and `await prefill_idle(path)` where the
test needs a prefill engine that reports nothing queued) before sending; `path.router.close()`
at the end."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

TIER = "interactive"


def record_verdicts(monkeypatch) -> list:
    """Every Decision the KVRouter's decider returns from now on, in order."""
    from router.routing import service

    verdicts = []
    real_decide = service.decide

    def recording(*args, **kwargs):
        verdicts.append(real_decide(*args, **kwargs))
        return verdicts[-1]

    monkeypatch.setattr(service, "decide", recording)
    return verdicts


@dataclass(frozen=True)
class InProcessPath:
    backend: object  # DisaggregatedBackend
    router: object  # KVRouter
    handles: object  # TierPools
    directories: dict


def in_process_path(*, decider, objectives, prefill_timeout_s: float, **router_args) -> InProcessPath:
    from ray import serve

    from cluster.types import APP_NAME, PoolId, TierPools
    from router.pd.path import DisaggregatedBackend
    from router.routing.directory import pool_directory
    from router.routing.service import KVRouter

    dirs = {(TIER, pool): pool_directory(PoolId(TIER, pool)) for pool in ("prefill", "decode")}
    handles = TierPools(
        prefill=serve.get_deployment_handle(PoolId(TIER, "prefill").deployment_name, app_name=APP_NAME),
        decode=serve.get_deployment_handle(PoolId(TIER, "decode").deployment_name, app_name=APP_NAME))
    router = KVRouter(directories=dirs, index=None, weights={"load": 1.0}, decider=decider, subscribe=False,
                      objectives={TIER: objectives}, **router_args)
    backend = DisaggregatedBackend(pools={TIER: handles}, prefill_timeout_s=prefill_timeout_s, router=router)
    return InProcessPath(backend, router, handles, dirs)


async def ready(path: InProcessPath, prefill_replicas: int = 1, timeout_s: float = 60) -> None:
    """Until this process's Serve routers list the pools (they publish once a handle is used)."""
    await path.handles.prefill.stats.remote()
    await path.handles.decode.stats.remote()
    deadline = time.monotonic() + timeout_s
    while not (len(path.router.workers(TIER, "prefill")) >= prefill_replicas and path.router.workers(TIER, "decode")):
        assert time.monotonic() < deadline, "the Serve routers did not publish both pools"
        await asyncio.sleep(0.25)


async def prefill_idle(path: InProcessPath, timeout_s: float = 60) -> None:
    """Until every prefill replica's last routing stats report no queued prompt (a test before
    may have left one there)."""
    deadline = time.monotonic() + timeout_s
    while any(info.stats.queued_prompt_tokens for info in path.directories[(TIER, "prefill")].replicas()):
        assert time.monotonic() < deadline, "the prefill replicas still report queued prompts"
        await asyncio.sleep(0.25)


def fake_pd_path(decider, objectives, prefill_timeout_s: float = 5.0, prefill_chunk_budget: int = 2048):
    """The same path over fake Serve pools (tests/support/fakes.py FakeServePool), one replica each, an
    idle prefill replica "p0" and decode replica "d0": (backend, pools, router). No Ray."""
    import random

    from cluster.types import RoutingStats, TierPools
    from router.pd.path import DisaggregatedBackend
    from router.routing.directory import PoolDirectory, ReplicaInfo
    from router.routing.service import KVRouter
    from tests.support.fakes import FakeServePool

    dirs = {(TIER, pool): PoolDirectory() for pool in ("prefill", "decode")}
    pools = TierPools(prefill=FakeServePool(dirs[(TIER, "prefill")], ["p0"]),
                      decode=FakeServePool(dirs[(TIER, "decode")], ["d0"]))
    for pool, replica, stats in (("prefill", "p0", {"queued_prompt_tokens": 0}), ("decode", "d0", {"running_seqs": 0})):
        dirs[(TIER, pool)].set_replicas([ReplicaInfo(replica, 64, RoutingStats.from_dict(
            {"worker_id": f"{TIER}-{pool}-{replica}", **stats}))])
    router = KVRouter(directories=dirs, index=None, weights={"load": 1.0}, decider=decider, subscribe=False,
                      rng=random.Random(0), objectives={TIER: objectives}, chunk_budgets={TIER: 64},
                      prefill_chunk_budgets={TIER: prefill_chunk_budget})
    # Fake pools stream per request (FakeServePool has no outboxes): these tests are of the
    # path's policy; tests/unit/test_decode_mux.py and tests/serve/ cover per-step streams.
    return DisaggregatedBackend(pools={TIER: pools}, prefill_timeout_s=prefill_timeout_s, router=router,
                                decode_streams="per_request"), pools, router
