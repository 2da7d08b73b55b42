"""Names and plain data every process of the cluster shares: the Serve application's name, a
pool's identity and deployment name, a tier's pool handles, and the routing stats an engine
replica reports to the gateway.

Light on purpose (no Ray, no vLLM): the CLI, the config, the gateway, the replicas and the
unit tests all import it, and it imports nothing of the project, so it closes no import circle.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Mapping, Optional

if TYPE_CHECKING:  # Ray's type only; this module stays import-light
    from ray.serve.handle import DeploymentHandle

APP_NAME = "tandem"  # the Serve application (cluster/local.py, the Helm chart's serveConfig)

Role = Literal["prefill", "decode"]
ROLES: tuple[Role, ...] = ("prefill", "decode")


@dataclass(frozen=True)
class PoolId:
    """One engine pool: a tier's prefill or decode deployment."""

    tier: str
    role: Role

    @property
    def deployment_name(self) -> str:
        """Its Serve deployment name, e.g. "interactive-prefill" (the one place it is formatted;
        an engine's worker id starts with it too)."""
        return f"{self.tier}-{self.role}"

    def worker_id(self, replica_id: str) -> str:
        """The id an engine replica of this pool goes by (KV events, metrics, routing), from its
        Serve replica's unique id; the replica and the router derive it alike."""
        return f"{self.deployment_name}-{replica_id}"


@dataclass(frozen=True)
class TierPools:
    """The two pools of one tier, as Ray Serve handles (bound applications at build time, which
    Serve turns into handles; fake pools in unit tests)."""

    prefill: "DeploymentHandle"
    decode: "DeploymentHandle"

    def of(self, role: str) -> "DeploymentHandle":
        return self.prefill if role == "prefill" else self.decode


@dataclass(frozen=True)
class RoutingStats:
    """What an engine replica reports to the gateway's request router every
    request_routing_stats_period_s (Serve's `record_routing_stats` hook): who the engine is,
    how it hashes prefix-cache blocks, where its KV events are, and the P/D decider's live
    state. Serve carries it as a dict: the replica sends `to_dict()`, the gateway reads
    `from_dict()`. Every field is optional: a replica that has not reported yet is load-only.
    """

    worker_id: Optional[str] = None
    block_size: Optional[int] = None
    hash_algo: str = "sha256"
    hash_seed: Optional[str] = None
    kv_usage: float = 0.0  # 0..1
    running_seqs: int = 0
    queued_prompt_tokens: Optional[int] = None  # a prefill engine's prompt tokens waiting
    step_s: Optional[float] = None  # an engine's mean token gap since its last report (its streams)
    step_n: Optional[int] = None  # over this many gaps
    kv_events: Optional[str] = None  # the engine's KV-event endpoint
    kv_replay: Optional[str] = None  # and its replay endpoint
    # LoRA (only an engine serving adapters reports these): the adapters it holds or is about to
    # (vLLM's running and waiting adapters, vllm:lora_requests_info's labels, with those resident
    # in its adapter cache), sorted; and how many it holds at once (vLLM's max_loras).
    loras: Optional[tuple[str, ...]] = None
    max_loras: Optional[int] = None

    def to_dict(self) -> dict[str, Any]:
        """The dict Serve carries: unset (None) fields left out, so an idle replica's report
        stays the same and Serve does not rebroadcast it."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, data: Optional[Mapping[str, Any]]) -> "RoutingStats":
        """Parse a replica's report; unknown keys (a newer replica) are ignored."""
        if not data:
            return cls()
        names = {f.name for f in dataclasses.fields(cls)}
        known = {k: v for k, v in data.items() if k in names and v is not None}
        for key, kind in (("kv_usage", float), ("running_seqs", int), ("queued_prompt_tokens", int)):
            if key in known:
                known[key] = kind(known[key])
        if "step_s" in known:
            known["step_s"] = float(known["step_s"])
        if "loras" in known:
            known["loras"] = tuple(str(name) for name in known["loras"])
        if "max_loras" in known:
            known["max_loras"] = int(known["max_loras"])
        return cls(**known)
