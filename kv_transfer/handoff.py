"""The prefill → decode handoff contract.

A prefill engine answers a request with vLLM's `kv_transfer_params` (engine id, block ids,
side-channel host and port). We wrap them in a versioned envelope stamped with the model, so a
decode worker refuses params from an incompatible peer at once (and the gateway recomputes)
instead of pulling the wrong bytes or waiting on a handshake that cannot succeed.

Call order: `prefill_request_params()` goes into the prefill request; its result becomes a
`Handoff` via `Handoff.from_prefill(...)`; the decode side calls `handoff.decode_params(model)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

HANDOFF_VERSION = 1


class HandoffMismatch(ValueError):
    """The handoff came from an incompatible peer (version or model differs)."""


def prefill_request_params() -> dict[str, Any]:
    """kv_transfer_params for the prefill request: keep the KV for a remote decode."""
    return {"do_remote_decode": True, "do_remote_prefill": False}


@dataclass(frozen=True)
class Handoff:
    version: int
    model: str
    params: dict[str, Any]

    @classmethod
    def from_prefill(cls, model: str, params: dict[str, Any] | None) -> "Handoff":
        if not params or not params.get("do_remote_prefill"):
            raise HandoffMismatch(
                "prefill engine returned no remote-prefill kv_transfer_params; "
                "is it configured with kv_role=kv_producer?"
            )
        return cls(version=HANDOFF_VERSION, model=model, params=dict(params))

    def decode_params(self, model: str) -> dict[str, Any]:
        if self.version != HANDOFF_VERSION:
            raise HandoffMismatch(f"handoff version {self.version}, this worker speaks {HANDOFF_VERSION}")
        if self.model != model:
            raise HandoffMismatch(f"handoff for model {self.model!r}, this worker serves {model!r}")
        return dict(self.params)
