"""ClusterConfig: the whole YAML, its cross-field checks, and loading it from a file."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

import yaml
from pydantic import Field, ValidationError, model_validator

from cluster.config.base import ConfigError, _Strict, is_hub_id
from cluster.config.observability import ObservabilityConfig
from cluster.config.pools import ModelConfig, PoolConfig, TierConfig
from cluster.config.services import AuthConfig, GatewayConfig, KVTransferConfig, RayConfig, RoutingConfig


class ClusterConfig(_Strict):
    """The whole YAML: one file drives a local run (`tandem run --config FILE`) and the Helm chart."""

    model: ModelConfig = Field(description="The one model every pool serves.")
    gateway: GatewayConfig = Field(GatewayConfig(), description="The OpenAI API's edge.")
    tiers: dict[str, TierConfig] = Field(
        default_factory=lambda: {"interactive": TierConfig()},
        description="Service tiers (e.g. interactive, batch) by name, each with its own prefill and decode pools.")
    # Helm loses YAML key order (values become Go maps), so the chart always sets it.
    default_tier: Optional[str] = Field(None, description="Tier of requests that name none. Unset: the first tier "
                                                          "in the YAML.")
    kv_transfer: KVTransferConfig = Field(KVTransferConfig(), description="The KV handoff between the pools.")
    ray: RayConfig = Field(RayConfig(), description="The Ray cluster.")
    auth: AuthConfig = Field(AuthConfig(), description="API keys, tenants, rate limits.")
    routing: RoutingConfig = Field(RoutingConfig(), description="KV-aware routing and the P/D decider.")
    observability: ObservabilityConfig = Field(ObservabilityConfig(), description="Traces (OpenTelemetry).")

    @model_validator(mode="before")
    @classmethod
    def _fill_default_tier(cls, data):
        if isinstance(data, dict) and data.get("default_tier") is None:
            tiers = data.get("tiers", {"interactive": None})
            data = {**data, "default_tier": next(iter(tiers), None) if isinstance(tiers, dict) else None}
        return data

    @model_validator(mode="after")
    def _check_tiers(self) -> "ClusterConfig":
        if not self.tiers:
            raise ValueError("tiers: at least one tier is needed")
        if self.default_tier not in self.tiers:
            raise ValueError(f"default_tier: {self.default_tier!r} is not one of the tiers {list(self.tiers)}")
        for tier, tier_cfg in self.tiers.items():
            if not re.fullmatch(r"[a-z][a-z0-9-]{0,30}", tier):
                raise ValueError(f"tiers.{tier}: tier names are lowercase letters, digits and '-'")
            for role, pool in tier_cfg.pools().items():
                batched = pool.engine.max_num_batched_tokens
                chunked = pool.engine.enable_chunked_prefill
                if batched is not None and batched < self.model.max_model_len and not chunked:
                    # vLLM rejects this without chunked prefill; say which field to change.
                    raise ValueError(
                        f"tiers.{tier}.{role}.engine.max_num_batched_tokens ({batched}) "
                        f"must be >= model.max_model_len ({self.model.max_model_len}), "
                        f"or set tiers.{tier}.{role}.engine.enable_chunked_prefill: true"
                    )
                _check_engine_for_pool(f"tiers.{tier}.{role}", role, pool)
                scaling = pool.autoscaling
                if scaling is not None and not scaling.min_replicas <= pool.replicas <= scaling.max_replicas:
                    raise ValueError(
                        f"tiers.{tier}.{role}.replicas ({pool.replicas}) is the initial count and must lie "
                        f"within autoscaling min_replicas..max_replicas ({scaling.min_replicas}..{scaling.max_replicas})"
                    )
        self._check_auth()
        return self

    def _check_auth(self) -> None:
        if self.auth.rate_limit_store == "redis" and not self.routing.index.redis_url:
            raise ValueError("auth.rate_limit_store redis uses routing.index's Redis: set routing.index.redis_url")
        for name, tenant in self.auth.tenants.items():
            for tier in (tenant.tier, *tenant.allowed_tiers):
                if tier not in self.tiers:
                    raise ValueError(f"auth.tenants.{name}: unknown tier {tier!r}; tiers are {sorted(self.tiers)}")
        for source in self.auth.keys:
            if source.tenant not in self.auth.tenants:
                raise ValueError(f"auth.keys: unknown tenant {source.tenant!r}; add it under auth.tenants")

    @classmethod
    def load(cls, path: str | Path, overrides: Optional[dict] = None) -> "ClusterConfig":
        """Read, merge `overrides`, validate. An unreadable file or malformed YAML raises
        ConfigError; invalid fields raise pydantic's ValidationError (load_checked: one message)."""
        path = Path(path)
        try:
            raw = yaml.safe_load(path.read_text()) or {}
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read the config: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
            problem = getattr(exc, "problem", None) or str(exc)
            raise ConfigError(f"{path}: malformed YAML{where}: {problem}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: the config must be a mapping (model:, tiers:, ...), got {type(raw).__name__}")
        if overrides:
            raw = _deep_merge(raw, overrides)
        model = raw.get("model")
        if isinstance(model, dict) and isinstance(model.get("path"), str) and not Path(model["path"]).is_absolute():
            local = (path.parent / model["path"]).resolve()
            if local.exists() or not is_hub_id(model["path"]):  # else: a Hub id, kept as written
                raw["model"] = {**model, "path": str(local)}
        return cls.model_validate(raw)

    @classmethod
    def load_checked(cls, path: str | Path, overrides: Optional[dict] = None) -> "ClusterConfig":
        """load, with every problem as one ConfigError naming the file and the field(s)."""
        try:
            return cls.load(path, overrides)
        except ValidationError as exc:
            raise ConfigError(explain(exc, path)) from None


def explain(exc: ValidationError, source: str | Path) -> str:
    """A ValidationError as one message: `source: field.path: problem` per error."""
    lines = []
    for err in exc.errors():
        where = ".".join(str(part) for part in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field (a typo?)"
        lines.append(f"{where}: {msg}" if where else msg)  # top-level checks name their fields
    head = f"{source}: invalid config" + (f" ({len(lines)} problems)" if len(lines) > 1 else "")
    return head + ":\n  " + "\n  ".join(lines) if len(lines) > 1 else f"{source}: {lines[0]}"


def _check_engine_for_pool(where: str, role: str, pool: "PoolConfig") -> None:
    eng = pool.engine
    if role == "prefill" and eng.speculative_config is not None:
        raise ValueError(f"{where}.engine.speculative_config: prefill computes one token per request; "
                         "speculative decoding belongs on the decode pool")
    if eng.tensor_parallel_size > 1 and 0 < pool.num_gpus < eng.tensor_parallel_size:
        raise ValueError(f"{where}.engine.tensor_parallel_size ({eng.tensor_parallel_size}) needs "
                         f"{where}.num_gpus >= {eng.tensor_parallel_size} (got {pool.num_gpus})")


def _deep_merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out
