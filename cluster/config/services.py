"""The cluster-wide services around the pools: KV transfer, the gateway's HTTP edge, routing and its index, API keys and rate limits, Ray."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Literal, Optional
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, model_validator

from cluster.config.base import HumanInt, MiB, _Strict


class KVTransferConfig(_Strict):
    """The KV cache's move from a prefill engine to a decode engine: NIXL between the pools (kv_transfer/)."""

    buffer_device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Where NIXL registers KV buffers; auto = cuda with a GPU, else cpu."
    )
    failure_policy: Literal["recompute", "fail"] = Field(
        "recompute", description="recompute: a KV load that fails costs a local prefill on decode instead of an "
                                 "error (vLLM's kv_load_failure_policy).")
    side_channel_host: str = Field(
        "127.0.0.1", description="The address engine sockets (NIXL side channel, KV events) bind on and decode "
                                 "engines dial. auto: this replica's Ray node IP, needed when prefill and decode "
                                 "run on different machines (the Helm chart sets it). Never a wildcard.")
    # A port picked in Linux's ephemeral range (32768-60999), which bind-to-0 and every outgoing
    # connection take from, can be taken in the minutes before the engine binds it, and vLLM 0.32
    # then waits forever on its dead listener.
    side_channel_ports: tuple[int, int] = Field(
        (20000, 32767), description="Where each engine's NIXL side-channel port is picked (inclusive): outside "
                                    "Linux's ephemeral ports and Ray's worker ports (10002-19999). Each replica "
                                    "claims its port on the host for its life.")
    prefill_timeout_s: float = Field(30.0, gt=0, description="Bounded wait for the prefill hop; past it the request "
                                                             "is recomputed on decode.")
    ucx_tls: str = Field("tcp,self,sm", description="UCX transports for NIXL (UCX_TLS). Without tcp, UCX on a "
                                                    "CPU host fails.")
    ucx_net_devices: Optional[str] = Field("lo", description="UCX_NET_DEVICES; None: UCX's choice.")
    cpu_patch: bool = Field(
        True, description="CPU hosts: a tiny patch of vLLM's NIXL path (kv_transfer/cpu_patch.py): NIXL's progress "
                          "thread sleeps between UCX events instead of spinning a core, and the forward thread "
                          "stays on its bound core.")
    nixl_progress_poll_ms: Optional[int] = Field(
        10, gt=0, le=1000,
        description="With cpu_patch: the progress thread's poll timeout, a bound on a missed UCX wake-up (work wakes "
                    "it at once; idle it takes ~0.4% of a core). None: no progress thread, so a prefill engine "
                    "serves a pull only between its own steps (loadtest/bench/RESULTS.md section 10).")
    first_token_reuse: bool = Field(
        True, description="Stream the prefill's sampled token as the first token and let decode continue after it "
                          "(kv_transfer/first_token.py); requests it cannot serve exactly take the plain path. With "
                          "routing.disaggregation adaptive, only where the P/D decider finds it pays.")

    migration_limit: int = Field(
        2, ge=0, le=8,
        description="How many times one answer may be continued on another replica when its decode stream breaks "
                    "after tokens reached the client (the replica died, its stream was lost): a new request of "
                    "prompt + the tokens sent, through the normal path (router/pd/migration.py). Greedy and "
                    "unseeded sampling only; seeded sampling, structured output, penalties and other engine-held "
                    "state end with an error event as before. With no other decode replica, the continuation "
                    "runs whole on a prefill replica. 0: off.")

    @model_validator(mode="after")
    def _check_ports(self) -> "KVTransferConfig":
        low, high = self.side_channel_ports
        if not 1024 <= low <= high <= 65535:
            raise ValueError(f"kv_transfer.side_channel_ports: [low, high] within 1024-65535, got {list(self.side_channel_ports)}")
        return self


class GatewayConfig(_Strict):
    """The OpenAI API's edge: where it listens and what it bounds (router/)."""

    host: str = Field("127.0.0.1", description="Where the OpenAI API listens (`tandem run --host`).")
    port: int = Field(8000, ge=1, le=65535, description="The API's port (`tandem run --port`).")
    ingress: Literal["direct", "serve"] = Field(
        "direct", description="Who serves HTTP: each gateway replica itself on host:port (direct; Serve runs no "
                              "HTTP proxy), or Serve's HTTP proxy relaying every chunk to the replica over Ray "
                              "(serve; ~2x the CPU per streamed token, loadtest/bench/RESULTS.md).")
    decode_streams: Literal["per_step", "per_request"] = Field(
        "per_step", description="How decode replicas stream to a gateway: one Ray item per engine step carrying all "
                                "of its requests there (per_step), or one per output of each request (per_request, "
                                "what tandem did until 2026-12-03; ~5x the CPU per token, loadtest/bench/RESULTS.md).")
    replicas: int = Field(1, ge=1, description="Gateway replicas. With ingress direct, replicas on one node share "
                                               "the port (SO_REUSEPORT). Each holds its own admission places, "
                                               "load ledger and (unless auth.rate_limit_store is redis) rate "
                                               "limits: the tier's limits apply per replica.")
    max_body_bytes: HumanInt = Field(4 * MiB, ge=1024, description="Larger request bodies get 413.")
    body_read_timeout_s: float = Field(10.0, gt=0, description="A request body not received within this is a 408: "
                                                               "a slow sender must not hold a gateway slot.")
    health_interval_s: float = Field(1.0, ge=0, description="/health probes the engines at most once per interval, "
                                                            "whatever the call rate (/livez probes nothing).")
    ready_wait_s: float = Field(
        120.0, ge=0, description="A request arriving before every pool is ready (a cold start; a redeploy that "
                                 "replaces a pool's only replica stop-first) waits up to this for them, then gets 503 "
                                 "model_loading with Retry-After. Cover an engine's load time. 0: 503 at once.")
    max_ready_waiters: int = Field(256, ge=0, description="Requests waiting for readiness at once, per gateway "
                                                          "replica; beyond: 503 model_loading at once.")
    decode_first_token_timeout_s: Optional[float] = Field(
        None, gt=0, description="A decode hop with no first token within this is refused (429) instead of "
                                "holding its admission place. None (the default): no deadline, as `vllm serve` "
                                "has none: a decode engine's queue under load is a wait, not a failure (a 120 s "
                                "deadline refused requests vLLM's benchmark at concurrency 32 completes on vLLM); "
                                "a dead replica fails the hop anyway.")
    allowed_hosts: Optional[tuple[str, ...]] = Field(
        None, description="Host header values the gateway answers (421 otherwise; against DNS rebinding): names or "
                          "name:port; \"*\": any. None: the gateway host and the loopback names (any port), or no "
                          "check when host is 0.0.0.0 (then list the names clients use).")

    def resolved_allowed_hosts(self) -> Optional[tuple[str, ...]]:
        """The allow-list to enforce; None: no Host check."""
        if self.allowed_hosts is not None:
            return self.allowed_hosts
        return default_allowed_hosts(self.host)


_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")


def default_allowed_hosts(host: str) -> Optional[tuple[str, ...]]:
    """The allow-list for a gateway bound to `host`: its own name and the loopback names, on any
    port (what defeats rebinding is the name: the attacker's page cannot send a loopback one).
    None (no check) when it binds every interface: then the names it is reached by are the
    deployment's (an ingress, a Service) and only gateway.allowed_hosts can list them."""
    if host in ("0.0.0.0", "::", ""):
        return None
    names = {host, *_LOOPBACK_NAMES}
    if _is_ipv6(host):
        names.discard(host)
        names.add(f"[{host}]")
    return tuple(sorted(names))


def _is_ipv6(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).version == 6
    except ValueError:
        return False


class RedisTLSConfig(_Strict):
    """TLS to Redis: used with a rediss:// URL. Files are PEM; None: the system CA bundle, no
    client certificate."""

    ca_file: Optional[Path] = Field(None, description="The CA that signed Redis' certificate.")
    cert_file: Optional[Path] = Field(None, description="Client certificate, for Redis' tls-auth-clients.")
    key_file: Optional[Path] = Field(None, description="The client certificate's key.")
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

    backend: Literal["memory", "redis"] = Field("memory", description="memory: in the gateway; redis: shared.")
    redis_url: Optional[str] = Field(None, description="e.g. redis://127.0.0.1:6379/0 (rediss:// for TLS); "
                                                       "required for redis. No password in it: URLs get logged.")
    redis_password: Optional[SecretStr] = Field(None, description="Plaintext password, for local runs and tests; "
                                                                  "at most one of it and redis_password_env.")
    redis_password_env: Optional[str] = Field(
        None, description="The environment variable holding the password (deployments; the Helm chart fills it "
                          "from a Secret). A refused password fails the gateway's start, naming these fields.")
    redis_username: Optional[str] = Field(None, description="Redis ACL user; None: the default user.")
    redis_tls: Optional[RedisTLSConfig] = Field(None, description="TLS settings, with a rediss:// URL.")
    key_prefix: str = Field("tandem:", description="Prefix of every Redis key tandem writes.")
    key_ttl_s: Optional[int] = Field(
        3600, ge=1, description="Redis keys expire this long after their last write (a BlockStored refreshes them), "
                                "so entries nobody removes (a vanished worker) do not stay; None: never.")

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

    weights: dict[Literal["prefix", "load", "kv_usage", "lora"], float] = Field(
        {"prefix": 1.0, "load": 0.5, "kv_usage": 0.1},
        description="Scorer weights; scores are in [0, 1]. prefix: share of the prompt cached on the worker; load: "
                    "free request slots; kv_usage: free KV cache in its upper half (below half full, every engine scores 1: "
                    "a reported usage is a second old, the in-flight counts are exact); lora: the request's LoRA adapter held (1), a "
                    "free adapter slot (0.5) or a full engine that would evict one (0), base requests 1 "
                    "everywhere; unset: 0.3 when model.lora_adapters is set, off without adapters. Weight 0 "
                    "switches a scorer off.")
    picker: Literal["max_score", "round_robin", "random"] = Field(
        "max_score", description="max_score: highest weighted score, random tie-break. round_robin / random ignore "
                                 "the scores: baselines for benchmarks, not for production.")
    disaggregation: Literal["adaptive", "always", "never"] = Field(
        "adaptive", description="The P/D decider, per request (its rules: router/routing/decider.py): adaptive = "
                                "remote prefill or local (chunked on the decode engine) from both engines' live load "
                                "and cost models against the tier's slo; always = remote prefill for every request; "
                                "never = every prompt on decode.")
    decode_only_below_tokens: int = Field(
        0, ge=0, description="With adaptive or always: a request goes straight to decode when the part of its "
                             "prompt the decode engine has not cached is shorter than this many tokens. 0: off.")
    whole_on_prefill_max_tokens: int = Field(
        0, ge=0, description="With adaptive: a request whose max_tokens is at most this, that would prefill "
                             "remotely, runs whole on the prefill engine (decider rule 7). 0: off, the default: on "
                             "the 2-core VM it did not pay (loadtest/bench/RESULTS.md section 8).")
    whole_on_prefill_when_decode_full: bool = Field(
        False, description="With adaptive: a request of any length that would prefill remotely runs whole on the "
                           "prefill engine while the decode engine is at its mean-ITL bound and the prefill engine "
                           "has room for a stream (decider rule 8). Off by default: it never fired in the runs of "
                           "record (loadtest/bench/RESULTS.md section 9), so whether it pays is not measured.")
    kv_events: bool = Field(True, description="Engines publish KV-cache events (vLLM kv_events_config, ZMQ) and the "
                                              "gateway follows them; false: routing on load only.")
    index: RoutingIndexConfig = Field(RoutingIndexConfig(), description="Where the prefix index lives.")

    @model_validator(mode="after")
    def _check_weights(self) -> "RoutingConfig":
        if any(w < 0 for w in self.weights.values()) or not any(w > 0 for w in self.weights.values()):
            raise ValueError("routing.weights: weights must be >= 0 and at least one > 0")
        return self


class ApiKeySource(_Strict):
    """One API key and its tenant. Exactly one source: `env` (a variable's name) or `file` (a
    file holding the key) for real deployments; `value` (plaintext in the YAML) only for local
    runs and tests."""

    tenant: str = Field(description="The tenant (auth.tenants) this key belongs to.")
    env: Optional[str] = Field(None, description="The environment variable holding the key.")
    file: Optional[Path] = Field(None, description="A file holding the key.")
    value: Optional[SecretStr] = Field(None, description="The key in plaintext: local runs and tests only.")

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

    requests_per_minute: Optional[int] = Field(None, ge=1, description="Shared by all the tenant's keys.")
    tokens_per_minute: Optional[int] = Field(None, ge=1, description="Prompt tokens + max_tokens, shared by all the "
                                                                     "tenant's keys.")


class TenantConfig(_Strict):
    """A tenant: whose requests these are, which tier they run in, how fast they may come."""

    tier: str = Field(description="The tier of this tenant's requests.")
    allowed_tiers: tuple[str, ...] = Field((), description="Tiers the tenant may pick per request with the tier "
                                                           "header (its own tier always).")
    rate_limit: RateLimitConfig = Field(RateLimitConfig(), description="Per-tenant limits; unset: none.")


class AuthConfig(_Strict):
    """API keys: key → tenant → tier (router/auth.py). No keys: the API is open (local runs)."""

    tenants: dict[str, TenantConfig] = Field({}, description="Tenants by name.")
    keys: tuple[ApiKeySource, ...] = Field((), description="API keys, each of one tenant. Empty: the API is open "
                                                           "(the gateway warns at start).")
    tier_header: str = Field("X-Tandem-Tier", description="The header a tenant picks a tier with.")
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
    """The Ray cluster tandem runs on."""

    address: Optional[str] = Field(None, description="Existing cluster; None starts a local one.")
    num_cpus: Optional[int] = Field(None, ge=1, description="Size of the local cluster; None: Ray's (every core).")
    metrics_export_port: int = Field(
        8080, ge=1, le=65535,
        description="Where a local Ray serves every tandem, engine and Serve metric for Prometheus "
                    "(KubeRay's pods use 8080 too). Ignored with `address`: that cluster has its own.")
