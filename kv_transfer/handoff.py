"""The prefill → decode handoff contract.

A prefill engine answers a request with vLLM's `kv_transfer_params` (engine id, block ids,
side-channel host and port). The prefill replica wraps them in a versioned envelope stamped
with its own engine's identity (model, dtypes, block size: what both ends of a KV pull must
agree on), so a decode worker refuses params from an incompatible peer at once (and computes
the prompt itself) instead of pulling the wrong bytes or waiting on a handshake that cannot
succeed. The gateway carries the Handoff unopened.

Call order (each step in its own process):
1. prefill replica: `prefill_request_params()` goes into the engine's prefill request; the
   engine's answer becomes a `Handoff` via `Handoff.from_prefill(engine identity, params,
   lease_deadline())` (prefill_workers/deployment.py);
2. gateway: passes it to the decode hop as is (router/pd/path.py);
3. decode replica: `handoff.decode_params(its own engine identity)` → the params for vLLM, or
   HandoffMismatch / HandoffExpired: recompute (decode_workers/deployment.py).

The lease. The prefill engine keeps the prompt's blocks for KV_LEASE_S after the prefill ends
(vLLM's NIXL `kv_lease_duration`; the decode engine's heartbeats extend it once it has taken
the request), then frees them for other requests. The pull is a one-sided NIXL read of those
block ids: the prefill side cannot refuse it, and only logs "Potentially invalid KV blocks for
unrecognized request" afterwards. So a handoff used after its lease would read whatever the
blocks hold by then, possibly another request's KV. Each handoff therefore carries its
deadline (stamped when the prefill returns, minus a margin for clock skew between nodes and
the time until decode's first heartbeat), and decode refuses one past it: it recomputes.
The check is made twice: when the decode replica takes the request, and again when the decode
engine's scheduler takes it off its waiting queue to start the pull (kv_transfer/connector.py),
because under load a request can wait there longer than the lease (seen at concurrency 32 on the
2-core VM: a pull 40 s after the prefill, and the prefill's "Potentially invalid KV blocks").
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Optional

HANDOFF_VERSION = 1
KV_LEASE_S = 30  # vLLM 0.32's kv_lease_duration default; kv_transfer/nixl.py sets it explicitly
LEASE_MARGIN_S = 8.0  # clock skew between nodes + decode's first heartbeat (lease // 6 = 5 s)


class HandoffMismatch(ValueError):
    """The handoff came from an incompatible peer (version, model, dtype or block size differs)."""


@dataclass(frozen=True)
class EngineIdentity:
    """What two engines must share for one to pull the other's KV blocks byte for byte."""

    model: str
    dtype: str
    kv_cache_dtype: str
    block_size: int

    def mismatch(self, other: "EngineIdentity") -> Optional[str]:
        """None when `other` (the consumer) can pull this producer's blocks; else why not."""
        for name in ("model", "dtype", "kv_cache_dtype", "block_size"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine != theirs:
                return f"handoff from a prefill engine with {name} {mine!r}, this worker has {theirs!r}"
        return None


def adapter_key(adapter: Any) -> Optional[str]:
    """A request's LoRA adapter (cluster.protocol.Adapter) as handoffs name it; None: the base model."""
    return None if adapter is None else f"{adapter.name}={adapter.path}"


class HandoffExpired(ValueError):
    """The prefill's lease on the handoff's blocks has ended (or nearly): they may hold another
    request's KV now. Decode computes the prompt itself."""


def lease_deadline(now: Optional[float] = None) -> float:
    """The wall-clock time after which a handoff made now must not be pulled."""
    return (time.time() if now is None else now) + KV_LEASE_S - LEASE_MARGIN_S


# The deadline travels to the decode engine's scheduler inside the request's kv_transfer_params
# (vLLM passes the dict through; its NIXL connector reads only its own keys).
LEASE_DEADLINE_KEY = "tandem_lease_deadline"


def lease_ended(params: Optional[dict[str, Any]], now: Optional[float] = None) -> bool:
    """Whether a decode request's remote prefill must not be pulled any more: its handoff's
    lease deadline (LEASE_DEADLINE_KEY) has passed. False without a deadline or a remote prefill."""
    if not params or not params.get("do_remote_prefill"):
        return False
    deadline = params.get(LEASE_DEADLINE_KEY)
    if not isinstance(deadline, (int, float)):
        return False
    return (time.time() if now is None else now) >= deadline


def without_remote_prefill(params: dict[str, Any]) -> dict[str, Any]:
    """A decode request's params turned local: vLLM's connector then neither pulls nor notifies."""
    return {**params, "do_remote_prefill": False}


def prefill_request_params() -> dict[str, Any]:
    """kv_transfer_params for the prefill request: keep the KV for a remote decode."""
    return {"do_remote_decode": True, "do_remote_prefill": False}


@dataclass(frozen=True)
class Handoff:
    version: int
    producer: EngineIdentity  # the prefill engine's, stamped by the prefill replica
    params: dict[str, Any]
    # Wall-clock (time.time()) deadline of the prefill's lease; None: unknown (no check).
    lease_deadline: Optional[float] = None
    producer_id: str = ""  # the prefill engine's worker id, for logs
    # The LoRA adapter the prompt's KV was computed with, "name=path" (adapter_key); None: the
    # base model. KV of one adapter continued under another would be silently wrong.
    adapter: Optional[str] = None

    @classmethod
    def from_prefill(cls, producer: EngineIdentity, params: dict[str, Any] | None,
                     lease_deadline: Optional[float] = None, producer_id: str = "",
                     adapter: Optional[str] = None) -> "Handoff":
        if not params or not params.get("do_remote_prefill"):
            raise HandoffMismatch(
                "prefill engine returned no remote-prefill kv_transfer_params; "
                "is it configured with kv_role=kv_producer?"
            )
        return cls(version=HANDOFF_VERSION, producer=producer, params=dict(params),
                   lease_deadline=lease_deadline, producer_id=producer_id, adapter=adapter)

    def decode_params(self, consumer: EngineIdentity, now: Optional[float] = None,
                      adapter: Optional[str] = None) -> dict[str, Any]:
        """The params for the consumer's engine, continuing a request run with `adapter`
        (adapter_key), checked against both (raises HandoffMismatch, HandoffExpired)."""
        if self.version != HANDOFF_VERSION:
            raise HandoffMismatch(f"handoff version {self.version}, this worker speaks {HANDOFF_VERSION}")
        why = self.producer.mismatch(consumer)
        if why is not None:
            raise HandoffMismatch(why)
        if self.adapter != adapter:
            raise HandoffMismatch(f"handoff computed with LoRA adapter {self.adapter or 'none (the base model)'}, "
                                  f"this request runs {adapter or 'the base model'}")
        now = time.time() if now is None else now
        if self.lease_deadline is not None and now >= self.lease_deadline:
            raise HandoffExpired(f"handoff lease ended {now - self.lease_deadline:.1f} s ago")
        if self.lease_deadline is None:
            return dict(self.params)
        return {**self.params, LEASE_DEADLINE_KEY: self.lease_deadline}
