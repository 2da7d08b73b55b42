"""The prefill → decode handoff contract.

A prefill engine answers a request with vLLM's `kv_transfer_params` (engine id, block ids,
side-channel host and port). We wrap them in a versioned envelope stamped with the model, so a
decode worker refuses params from an incompatible peer at once (and the gateway recomputes)
instead of pulling the wrong bytes or waiting on a handshake that cannot succeed.

Call order: `prefill_request_params()` goes into the prefill request; its result becomes a
`Handoff` via `Handoff.from_prefill(...)`; the decode side calls `handoff.decode_params(model)`.

The lease. The prefill engine keeps the prompt's blocks for KV_LEASE_S after the prefill ends
(vLLM's NIXL `kv_lease_duration`; the decode engine's heartbeats extend it once it has taken
the request), then frees them for other requests. The pull is a one-sided NIXL read of those
block ids: the prefill side cannot refuse it, and only logs "Potentially invalid KV blocks for
unrecognized request" afterwards. So a handoff used after its lease would read whatever the
blocks hold by then, possibly another request's KV. Each handoff therefore carries its
deadline (stamped when the prefill returns, minus a margin for clock skew between nodes and
the time until decode's first heartbeat), and decode refuses one past it: it recomputes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Optional

HANDOFF_VERSION = 1
KV_LEASE_S = 30  # vLLM 0.32's kv_lease_duration default; kv_transfer/nixl.py sets it explicitly
LEASE_MARGIN_S = 8.0  # clock skew between nodes + decode's first heartbeat (lease // 6 = 5 s)


class HandoffMismatch(ValueError):
    """The handoff came from an incompatible peer (version or model differs)."""


class HandoffExpired(ValueError):
    """The prefill's lease on the handoff's blocks has ended (or nearly): they may hold another
    request's KV now. Decode computes the prompt itself."""


def lease_deadline(now: Optional[float] = None) -> float:
    """The wall-clock time after which a handoff made now must not be pulled."""
    return (time.time() if now is None else now) + KV_LEASE_S - LEASE_MARGIN_S


def prefill_request_params() -> dict[str, Any]:
    """kv_transfer_params for the prefill request: keep the KV for a remote decode."""
    return {"do_remote_decode": True, "do_remote_prefill": False}


@dataclass(frozen=True)
class Handoff:
    version: int
    model: str
    params: dict[str, Any]
    # Wall-clock (time.time()) deadline of the prefill's lease; None: unknown (no check).
    lease_deadline: Optional[float] = None

    @classmethod
    def from_prefill(cls, model: str, params: dict[str, Any] | None,
                     lease_deadline: Optional[float] = None) -> "Handoff":
        if not params or not params.get("do_remote_prefill"):
            raise HandoffMismatch(
                "prefill engine returned no remote-prefill kv_transfer_params; "
                "is it configured with kv_role=kv_producer?"
            )
        return cls(version=HANDOFF_VERSION, model=model, params=dict(params), lease_deadline=lease_deadline)

    def decode_params(self, model: str, now: Optional[float] = None) -> dict[str, Any]:
        if self.version != HANDOFF_VERSION:
            raise HandoffMismatch(f"handoff version {self.version}, this worker speaks {HANDOFF_VERSION}")
        if self.model != model:
            raise HandoffMismatch(f"handoff for model {self.model!r}, this worker serves {model!r}")
        now = time.time() if now is None else now
        if self.lease_deadline is not None and now >= self.lease_deadline:
            raise HandoffExpired(f"handoff lease ended {now - self.lease_deadline:.1f} s ago")
        return dict(self.params)
