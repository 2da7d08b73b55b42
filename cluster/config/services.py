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
    buffer_device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Where NIXL registers KV buffers; auto = cuda with a GPU, else cpu."
    )
    # "recompute": a KV load that fails costs a local prefill on decode instead of an error.
    failure_policy: Literal["recompute", "fail"] = "recompute"
    # Address decode engines dial for the NIXL handshake. "auto": this replica's Ray node IP,
    # needed when prefill and decode run on different machines (the Helm chart sets it).
    side_channel_host: str = "127.0.0.1"
    # Where each engine's side-channel port is picked (inclusive). Outside Linux's ephemeral
    # range (32768-60999), which bind-to-0 and every outgoing connection take from: a port
    # picked there can be taken in the minutes before the engine binds it, and vLLM 0.32 then
    # waits forever on its dead listener. Outside Ray's worker ports (10002-19999) too.
    side_channel_ports: tuple[int, int] = (20000, 32767)
    # Bounded wait for the prefill hop; past it the request is recomputed on decode.
    prefill_timeout_s: float = Field(30.0, gt=0)
    # UCX transports for NIXL. tcp is required here: shared-memory-only UCX fails.
    ucx_tls: str = "tcp,self,sm"
    ucx_net_devices: Optional[str] = "lo"
    # Tiny patch of vLLM's NIXL CPU path (kv_transfer/cpu_patch.py): NIXL's progress thread
    # sleeps between UCX events instead of spinning a core, and the forward thread stays on
    # its bound core.
    cpu_patch: bool = True
    # With cpu_patch: the progress thread's poll timeout, a bound on a missed UCX wake-up
    # (work wakes it at once). None: no progress thread, so a prefill engine serves a pull only
    # between its own steps (what tandem ran until 2026-12-03; kv_transfer/README.md).
    nixl_progress_poll_ms: Optional[int] = Field(10, gt=0, le=1000)
    # The prefill's sampled token is streamed as the first token and decode continues after
    # it (kv_transfer/first_token.py); requests it cannot serve exactly take the plain path.
    first_token_reuse: bool = True

    @model_validator(mode="after")
    def _check_ports(self) -> "KVTransferConfig":
        low, high = self.side_channel_ports
        if not 1024 <= low <= high <= 65535:
            raise ValueError(f"kv_transfer.side_channel_ports: [low, high] within 1024-65535, got {list(self.side_channel_ports)}")
        return self


class GatewayConfig(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
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
    max_body_bytes: HumanInt = Field(4 * MiB, ge=1024)
    body_read_timeout_s: float = Field(10.0, gt=0, description="A request body not received within this is a 408: "
                                                               "a slow sender must not hold a gateway slot.")
    health_interval_s: float = Field(1.0, ge=0, description="/health probes the engines at most once per interval, "
                                                            "whatever the call rate (/livez probes nothing).")
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
    # With adaptive: a request whose max_tokens is at most this, that would prefill remotely,
    # runs whole on the prefill engine instead (no decode hop, no KV transfer, no gap at the
    # handoff) while that engine has nothing queued and its prefill chunk keeps a stream's gaps
    # short. 0: off, the default: on the 2-core VM it did not pay (loadtest/bench/RESULTS.md §8).
    whole_on_prefill_max_tokens: int = Field(0, ge=0)
    # With adaptive: a request of any length that would prefill remotely runs whole on the
    # prefill engine when the decode engine is at its mean-ITL bound and the prefill engine has
    # room for one more stream (its queue meets the TTFT objective, its step the ITL and gap
    # ones): the two engines share the streams when decode is the bottleneck. Off by default: in
    # the runs of record it never fired (loadtest/bench/RESULTS.md section 9: on the 70/30 mix the
    # prefill engine saturates first), so whether it pays is not measured yet.
    whole_on_prefill_when_decode_full: bool = False
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
