"""ClusterConfig: the one YAML that drives a local run (and, later, the Helm chart).

Validated once, here, at the edge. Everything downstream receives these frozen models and
never re-checks them. Relative paths in the YAML resolve against the YAML file's folder so a
config works from any working directory.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Literal, Optional
from urllib.parse import urlsplit

import yaml
from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, SecretStr, ValidationError, WithJsonSchema,
                      model_validator)

MiB = 1 << 20

# Sizes as vLLM and Kubernetes write them: "256MiB", "4GiB" (binary), "512MB", "1.5GB" (decimal),
# or a plain number of bytes. Unit letters are case-insensitive; "i" means binary.
_SIZE_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
               "t": 10**12, "tb": 10**12, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$", re.IGNORECASE)
SIZE_PATTERN = r"^\s*\d+(\.\d+)?\s*([kKmMgGtT]([iI]?[bB])?|[bB])?\s*$"


def parse_size(value):
    """Bytes from an int or a size string ("256MiB", "4GiB", "512MB"); anything else is left
    to the int validation, which names the field."""
    if isinstance(value, str):
        match = _SIZE_RE.match(value)
        unit = match and _SIZE_UNITS.get(match.group(2).lower())
        if not unit:
            raise ValueError(f"{value!r} is not a size: write bytes (268435456) or e.g. 256MiB, 4GiB, 512MB")
        number = float(match.group(1)) * unit
        if number != int(number):
            raise ValueError(f"{value!r} is not a whole number of bytes")
        return int(number)
    return value


# A byte count that also takes a size string; the JSON Schema (Helm's values.schema.json) says both.
ByteSize = Annotated[int, BeforeValidator(parse_size), WithJsonSchema(
    {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "string", "pattern": SIZE_PATTERN}],
     "description": "bytes, or a size such as 256MiB, 4GiB, 512MB"})]

# A Hugging Face Hub id ("org/name"), told apart from a relative folder by its shape: exactly
# one "/", no "." or ".." parts. A relative folder of that shape that exists wins (see load).
_HUB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


def is_hub_id(value: str) -> bool:
    return bool(_HUB_ID_RE.match(value)) and ".." not in value


class ConfigError(ValueError):
    """A config that cannot be used, as one message naming the file and the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelConfig(_Strict):
    path: Path = Field(description="Local checkpoint folder (safetensors + tokenizer), or a Hugging Face Hub id "
                                   "(org/name) downloaded into HF_HOME at start (HF_HUB_OFFLINE: from the cache only).")
    name: Optional[str] = Field(None, description="Model id served on /v1/models; the Hub id or the folder name if unset.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="auto: the checkpoint's dtype on GPUs; on CPUs bfloat16 where the CPU has native bf16 "
                            "(AVX-512 BF16 or AMX), else float32 (emulated bf16 is slower), decided on each "
                            "engine's host.")
    max_model_len: int = Field(2048, ge=16)
    # vLLM tool parser for `tools` (e.g. hermes, llama3_json, mistral, pythonic); the gateway
    # checks the name at start. None: requests that may call tools get a 400.
    tool_parser: Optional[str] = Field(None, pattern=r"^[A-Za-z0-9_.-]+$")
    # vLLM reasoning parser (e.g. deepseek_r1, qwen3): splits the model's reasoning from its
    # answer (`reasoning` in responses, streamed), as `vllm serve --reasoning-parser` does.
    reasoning_parser: Optional[str] = Field(None, pattern=r"^[A-Za-z0-9_.-]+$")

    @property
    def hub_id(self) -> Optional[str]:
        """The Hub id when path is one (a relative path of the shape org/name), else None."""
        text = self.path.as_posix()
        return text if not self.path.is_absolute() and is_hub_id(text) else None

    @property
    def served_name(self) -> str:
        return self.name or self.hub_id or self.path.name


class SpeculativeConfig(_Strict):
    """Speculative decoding of a decode pool. `ngram` (prompt lookup) needs no draft model:
    it proposes the tokens that followed the last n-gram where it occurred before."""

    method: Literal["ngram"] = "ngram"
    num_speculative_tokens: int = Field(3, ge=1, le=16)
    prompt_lookup_min: int = Field(1, ge=1)
    prompt_lookup_max: int = Field(3, ge=1)

    @model_validator(mode="after")
    def _check_window(self) -> "SpeculativeConfig":
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(f"speculative.prompt_lookup_min ({self.prompt_lookup_min}) must be <= "
                             f"speculative.prompt_lookup_max ({self.prompt_lookup_max})")
        return self


class EngineConfig(_Strict):
    """vLLM engine settings of one pool. The KV cache size is always explicit: vLLM on CPU
    otherwise claims a large share of RAM."""

    kv_cache_bytes: ByteSize = Field(256 * MiB, ge=16 * MiB)
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16"] = "auto"
    max_num_seqs: int = Field(32, ge=1)
    max_num_batched_tokens: Optional[int] = Field(None, ge=16)
    # None: vLLM's default. True lets max_num_batched_tokens be below model.max_model_len.
    enable_chunked_prefill: Optional[bool] = None
    enable_prefix_caching: bool = True
    enforce_eager: bool = True
    block_size: Optional[int] = Field(None, ge=1)
    quantization: Optional[str] = Field(None, description="vLLM method (fp8, awq, gptq, ...); None: as the checkpoint says.")
    tensor_parallel_size: int = Field(1, ge=1)
    speculative: Optional[SpeculativeConfig] = None
    # Structured output (response_format, regex, choice, tool_choice=required): vLLM's
    # backend, and compact JSON without free whitespace (xgrammar/guidance only).
    structured_outputs_backend: Literal["auto", "xgrammar", "guidance", "outlines"] = "auto"
    json_disable_whitespace: bool = False

    @model_validator(mode="after")
    def _check_combinations(self) -> "EngineConfig":
        if self.json_disable_whitespace and self.structured_outputs_backend not in ("xgrammar", "guidance"):
            raise ValueError("json_disable_whitespace needs structured_outputs_backend xgrammar or guidance "
                             f"(got {self.structured_outputs_backend!r})")
        if self.enable_chunked_prefill is False and self.max_num_batched_tokens is None:
            raise ValueError("enable_chunked_prefill false needs an explicit max_num_batched_tokens "
                             "(>= model.max_model_len)")
        return self


class PlacementConfig(_Strict):
    """Which Ray nodes a pool's replicas may run on (multi-node clusters). A replica is placed
    only on a node that has all these custom resources free and carries all these labels, so
    prefill and decode can live on different machines. Empty: anywhere."""

    # Ray custom resources per replica, e.g. {"tandem-prefill": 1}; nodes advertise them with
    # `ray start --resources '{"tandem-prefill": 8}'` (the Helm chart does this per worker group).
    resources: dict[str, float] = {}
    # Ray node labels the replica requires (Ray's label_selector), e.g. {"tandem.io/pool":
    # "interactive-prefill"}; nodes get them with `ray start --labels k=v`.
    node_labels: dict[str, str] = {}


class AutoscalingConfig(_Strict):
    """Autoscaling of one pool (cluster/autoscaling/). Prefill scales on queued prompt tokens
    and TTFT against the tier's SLO; decode on running sequences, KV cache usage and
    inter-token latency against the SLO. With it, the pool's `replicas` is the initial count."""

    min_replicas: int = Field(1, ge=1, description="At least 1: /health needs every pool, and a vLLM cold start takes tens of seconds.")
    max_replicas: int = Field(2, ge=1)
    # Pressure must last this long before a scale-up; idleness this long before a scale-down.
    upscale_delay_s: float = Field(10.0, ge=0)
    downscale_delay_s: float = Field(120.0, ge=0)
    # After any change, hold: a new engine needs time to start and the signals to settle.
    cooldown_s: float = Field(30.0, ge=0)
    # Hysteresis: scale down only when the load would fill less than this share of one
    # replica fewer (scale-up happens above 1.0), so steady load never flips back and forth.
    scale_down_below: float = Field(0.5, gt=0, lt=1)
    # Per-replica targets. Prefill reads the first; decode the other two.
    target_queued_prompt_tokens: int = Field(4096, ge=1)
    target_running_seqs: Optional[int] = Field(None, ge=1, description="Default: 3/4 of engine.max_num_seqs.")
    target_kv_usage: float = Field(0.8, gt=0, le=1)
    # Ray Serve's metric window and push period (seconds).
    look_back_s: float = Field(10.0, gt=0)
    metrics_interval_s: float = Field(2.0, gt=0)
    # Append each tick's observation and decision here as JSON lines (tuning, replay tests).
    decision_log: Optional[Path] = None

    @model_validator(mode="after")
    def _check_bounds(self) -> "AutoscalingConfig":
        if self.max_replicas < self.min_replicas:
            raise ValueError(f"max_replicas ({self.max_replicas}) must be >= min_replicas ({self.min_replicas})")
        return self


class PoolConfig(_Strict):
    replicas: int = Field(1, ge=0)
    num_cpus: float = Field(1.0, ge=0)
    num_gpus: float = Field(0.0, ge=0)
    # CPU cores for the engine's OpenMP threads, one entry per replica slot (vLLM's
    # VLLM_CPU_OMP_THREADS_BIND syntax, e.g. "0" or "2-3"). Engines sharing cores run 3-4x
    # slower, so each replica gets its own. Ignored on GPU.
    cpu_binding: tuple[str, ...] = ()
    engine: EngineConfig = EngineConfig()
    autoscaling: Optional[AutoscalingConfig] = None  # None: a fixed `replicas`
    placement: PlacementConfig = PlacementConfig()


class SLOConfig(_Strict):
    """Latency objectives of a tier; the autoscaling policies scale against them."""

    ttft_s: float = Field(1.0, gt=0, description="Time to first token.")
    itl_s: float = Field(0.1, gt=0, description="Inter-token latency.")


class AdmissionConfig(_Strict):
    """Admission control of a tier at the gateway (router/admission.py). Each tier has its own
    bounds, so batch load never takes interactive's places."""

    max_running: int = Field(64, ge=1, description="Requests of this tier in the pools at once.")
    max_queued: int = Field(256, ge=0, description="Requests waiting for a running place; beyond: 429.")
    queue_timeout_s: float = Field(30.0, gt=0, description="Longest wait in the queue; then 429.")
    retry_after_s: int = Field(1, ge=0, description="Retry-After sent with a 429.")
    max_queue_wait_s: Optional[float] = Field(
        None, gt=0, description="Refuse on arrival when the expected wait for a place (place in line / recent rate "
                                "of freed places) exceeds this; set it under the tier's TTFT objective so admitted "
                                "requests meet it under overload. None: only max_queued bounds the line.")
    target_ttft_s: Optional[float] = Field(
        None, gt=0, description="Adapt the running places between min_running and max_running (AIMD) so admitted "
                                "requests reach their first token within this, counted from taking their place; "
                                "set it to the tier's TTFT objective minus max_queue_wait_s. None: max_running "
                                "places, fixed.")
    min_running: int = Field(1, ge=1, description="The fewest running places target_ttft_s may leave.")

    @model_validator(mode="after")
    def _min_within_max(self) -> "AdmissionConfig":
        if self.min_running > self.max_running:
            raise ValueError(f"min_running ({self.min_running}) must not exceed max_running ({self.max_running})")
        return self


class TierConfig(_Strict):
    """A service tier (e.g. interactive, batch): its own prefill and decode pools."""

    prefill: PoolConfig = PoolConfig(cpu_binding=("0",))
    decode: PoolConfig = PoolConfig(cpu_binding=("1",))
    slo: SLOConfig = SLOConfig()
    admission: AdmissionConfig = AdmissionConfig()

    def pools(self) -> dict[str, PoolConfig]:
        return {"prefill": self.prefill, "decode": self.decode}


class KVTransferConfig(_Strict):
    buffer_device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Where NIXL registers KV buffers; auto = cuda with a GPU, else cpu."
    )
    # "recompute": a KV load that fails costs a local prefill on decode instead of an error.
    failure_policy: Literal["recompute", "fail"] = "recompute"
    # Address decode engines dial for the NIXL handshake. "auto": this replica's Ray node IP,
    # needed when prefill and decode run on different machines (the Helm chart sets it).
    side_channel_host: str = "127.0.0.1"
    # Bounded wait for the prefill hop; past it the request is recomputed on decode.
    prefill_timeout_s: float = Field(30.0, gt=0)
    # UCX transports for NIXL. tcp is required here: shared-memory-only UCX fails.
    ucx_tls: str = "tcp,self,sm"
    ucx_net_devices: Optional[str] = "lo"
    # Tiny patch of vLLM's NIXL CPU path (kv_transfer/cpu_patch.py): stops an idle progress
    # thread burning a core and the forward thread being moved off its bound core.
    cpu_patch: bool = True
    # The prefill's sampled token is streamed as the first token and decode continues after
    # it (kv_transfer/first_token.py); requests it cannot serve exactly take the plain path.
    first_token_reuse: bool = True


class GatewayConfig(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    max_body_bytes: ByteSize = Field(4 * MiB, ge=1024)
    body_read_timeout_s: float = Field(10.0, gt=0, description="A request body not received within this is a 408: "
                                                               "a slow sender must not hold a gateway slot.")
    health_interval_s: float = Field(1.0, ge=0, description="/health probes the engines at most once per interval, "
                                                            "whatever the call rate (/livez probes nothing).")
    decode_first_token_timeout_s: float = Field(
        120.0, gt=0, description="A decode hop with no first token within this is refused (429) instead of "
                                 "holding its admission place: no decode capacity, or a stuck replica.")
    allowed_hosts: Optional[tuple[str, ...]] = Field(
        None, description="Host header values the gateway answers (421 otherwise; against DNS rebinding): names or "
                          "name:port; \"*\": any. None: the gateway host and the loopback names (any port), or no "
                          "check when host is 0.0.0.0 (then list the names clients use).")

    def resolved_allowed_hosts(self) -> Optional[tuple[str, ...]]:
        """The allow-list to enforce; None: no Host check."""
        from router.openai.hosts import default_allowed_hosts

        if self.allowed_hosts is not None:
            return self.allowed_hosts
        return default_allowed_hosts(self.host)


class RedisTLSConfig(_Strict):
    """TLS to Redis: used with a rediss:// URL. Files are PEM; None: the system CA bundle, no
    client certificate."""

    ca_file: Optional[Path] = None
    cert_file: Optional[Path] = Field(None, description="Client certificate, for Redis' tls-auth-clients.")
    key_file: Optional[Path] = None
    verify: bool = Field(True, description="Verify the server's certificate and host name.")

    @model_validator(mode="after")
    def _check_pair(self) -> "RedisTLSConfig":
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("routing.index.redis_tls: cert_file and key_file go together")
        return self


class RoutingIndexConfig(_Strict):
    """Where the prefix index lives (router/prefix_index/). `memory`: inside the gateway (one
    gateway replica). `redis`: shared by several gateway replicas; if Redis is unreachable,
    routing falls back to load only and recovers when it returns. A wrong password fails the
    gateway's start with a clear error instead."""

    backend: Literal["memory", "redis"] = "memory"
    redis_url: Optional[str] = Field(None, description="e.g. redis://127.0.0.1:6379/0 (rediss:// for TLS); "
                                                       "required for redis. No password in it: URLs get logged.")
    # The password: from an environment variable (deployments; the Helm chart fills it from a
    # Secret) or plaintext here (local runs, tests). At most one.
    redis_password: Optional[SecretStr] = None
    redis_password_env: Optional[str] = None
    redis_username: Optional[str] = Field(None, description="Redis ACL user; None: the default user.")
    redis_tls: Optional[RedisTLSConfig] = None
    key_prefix: str = "tandem:"
    # Redis keys expire this long after their last write (a BlockStored refreshes them), so
    # entries nobody removes (a vanished worker) do not stay; None: never. Memory: unused.
    key_ttl_s: Optional[int] = Field(3600, ge=1)

    @model_validator(mode="after")
    def _check_redis(self) -> "RoutingIndexConfig":
        if self.backend == "redis" and not self.redis_url:
            raise ValueError("routing.index.redis_url is required when routing.index.backend is redis")
        if self.redis_password is not None and self.redis_password_env is not None:
            raise ValueError("routing.index: give redis_password or redis_password_env, not both")
        if self.redis_url:
            parts = urlsplit(self.redis_url)
            if parts.scheme not in ("redis", "rediss"):
                raise ValueError(f"routing.index.redis_url must start with redis:// or rediss:// (got {parts.scheme}://)")
            if parts.password:
                raise ValueError("routing.index.redis_url holds a password: URLs end up in logs; put it in "
                                 "routing.index.redis_password_env (or redis_password) instead")
            if self.redis_tls is not None and parts.scheme != "rediss":
                raise ValueError("routing.index.redis_tls needs a rediss:// redis_url")
        return self

    def resolve_redis_password(self) -> Optional[str]:
        """The password itself; errors name the variable, never the value."""
        if self.redis_password is not None:
            return self.redis_password.get_secret_value()
        if self.redis_password_env is not None:
            value = os.environ.get(self.redis_password_env, "")
            if not value:
                raise ValueError(f"routing.index.redis_password_env: environment variable "
                                 f"{self.redis_password_env} is not set")
            return value
        return None


class RoutingConfig(_Strict):
    """KV-aware routing (router/routing/): filter → score → pick, weights as data."""

    # Scorer weights; scores are in [0, 1]. prefix: share of the prompt cached on the worker;
    # load: free request slots; kv_usage: free KV cache. Weight 0 switches a scorer off.
    weights: dict[Literal["prefix", "load", "kv_usage"], float] = {"prefix": 1.0, "load": 0.5, "kv_usage": 0.1}
    # max_score: highest weighted score, random tie-break. round_robin / random ignore the
    # scores: baselines for benchmarks (router/routing/tenant_bench.py), not for production.
    picker: Literal["max_score", "round_robin", "random"] = "max_score"
    # P/D decider (router/routing/decider.py), per request: adaptive = remote prefill or local
    # (chunked on the decode engine) from both engines' live load and cost models against the
    # tier's slo; always = remote prefill for every request; never = every prompt on decode.
    disaggregation: Literal["adaptive", "always", "never"] = "adaptive"
    # With adaptive or always: send a request straight to decode when the part of its prompt
    # the decode engine has not cached is shorter than this many tokens. 0: off.
    decode_only_below_tokens: int = Field(0, ge=0)
    # Engines publish KV-cache events (vLLM kv_events_config, ZMQ) and the gateway follows
    # them; off: routing on load only.
    kv_events: bool = True
    index: RoutingIndexConfig = RoutingIndexConfig()

    @model_validator(mode="after")
    def _check_weights(self) -> "RoutingConfig":
        if any(w < 0 for w in self.weights.values()) or not any(w > 0 for w in self.weights.values()):
            raise ValueError("routing.weights: weights must be >= 0 and at least one > 0")
        return self


class ApiKeySource(_Strict):
    """One API key and its tenant. Exactly one source: `env` (a variable's name) or `file` (a
    file holding the key) for real deployments; `value` (plaintext in the YAML) only for local
    runs and tests."""

    tenant: str
    env: Optional[str] = None
    file: Optional[Path] = None
    value: Optional[SecretStr] = None

    @model_validator(mode="after")
    def _one_source(self) -> "ApiKeySource":
        if sum(x is not None for x in (self.env, self.file, self.value)) != 1:
            raise ValueError(f"key of tenant {self.tenant!r}: give exactly one of env, file, value")
        return self

    def resolve(self) -> str:
        """The key itself; errors name the source, never the key."""
        if self.value is not None:
            key = self.value.get_secret_value()
        elif self.env is not None:
            key = os.environ.get(self.env, "")
            if not key:
                raise ValueError(f"API key of tenant {self.tenant!r}: environment variable {self.env} is not set")
        else:
            try:
                key = Path(self.file).read_text().strip()
            except OSError as exc:
                raise ValueError(f"API key of tenant {self.tenant!r}: cannot read {self.file}: {exc.strerror}") from None
        if len(key) < 8:
            raise ValueError(f"API key of tenant {self.tenant!r} is shorter than 8 characters")
        return key


class RateLimitConfig(_Strict):
    """Per-tenant limits at the gateway (router/ratelimit.py); unset: none. Per gateway replica,
    or shared by all of them with auth.rate_limit_store redis. A request costs 1 request and
    prompt tokens + max_tokens tokens; over a limit: 429."""

    requests_per_minute: Optional[int] = Field(None, ge=1)
    tokens_per_minute: Optional[int] = Field(None, ge=1)


class TenantConfig(_Strict):
    tier: str = Field(description="The tier of this tenant's requests.")
    # Tiers the tenant may pick per request with the tier header (its own tier always).
    allowed_tiers: tuple[str, ...] = ()
    rate_limit: RateLimitConfig = RateLimitConfig()


class AuthConfig(_Strict):
    """API keys: key → tenant → tier (router/auth.py). No keys: the API is open (local runs)."""

    tenants: dict[str, TenantConfig] = {}
    keys: tuple[ApiKeySource, ...] = ()
    tier_header: str = "X-Tandem-Tier"
    prefix_cache: Optional[Literal["isolate", "share"]] = Field(
        None, description="isolate: each tenant's prompts get their own prefix-cache salt (vLLM cache_salt), so "
                          "no tenant can tell from timing whether another sent a prompt; share: one cache for all. "
                          "None: isolate when API keys are configured, share when the API is open.")
    rate_limit_store: Literal["memory", "redis"] = Field(
        "memory", description="Where the tenants' rate-limit buckets live. memory: each gateway replica its own "
                              "(N replicas allow up to N times the limits). redis: one set shared by every replica, "
                              "in routing.index's Redis (its URL, credentials and TLS); while Redis is unreachable, "
                              "each replica limits on its own.")


    def isolates_prefix_cache(self) -> bool:
        return self.prefix_cache == "isolate" or (self.prefix_cache is None and bool(self.keys))


class RayConfig(_Strict):
    address: Optional[str] = Field(None, description="Existing cluster; None starts a local one.")
    num_cpus: Optional[int] = Field(None, ge=1)
    metrics_export_port: int = Field(
        8080, ge=1, le=65535,
        description="Where a local Ray serves every tandem, engine and Serve metric for Prometheus "
                    "(KubeRay's pods use 8080 too). Ignored with `address`: that cluster has its own.")


class ClusterConfig(_Strict):
    model: ModelConfig
    gateway: GatewayConfig = GatewayConfig()
    tiers: dict[str, TierConfig] = Field(default_factory=lambda: {"interactive": TierConfig()})
    # Tier of requests that name none. Unset: the first tier in the YAML. Helm loses YAML key
    # order (values become Go maps), so the chart always sets it.
    default_tier: Optional[str] = None
    kv_transfer: KVTransferConfig = KVTransferConfig()
    ray: RayConfig = RayConfig()
    auth: AuthConfig = AuthConfig()
    routing: RoutingConfig = RoutingConfig()

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
    if role == "prefill" and eng.speculative is not None:
        raise ValueError(f"{where}.engine.speculative: prefill computes one token per request; "
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

