"""The model and the engine pools: what one tier's prefill and decode deployments run, how big, where, how they scale, and the tier's objectives and admission bounds."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from cluster.config.base import HumanInt, MiB, _Strict, is_hub_id

# An adapter's name is a model id on the API (vLLM's lora-modules name): no spaces, no slashes
# that would read as a Hub id, bounded.
LORA_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"


class ModelConfig(_Strict):
    path: Path = Field(description="Local checkpoint folder (safetensors + tokenizer), or a Hugging Face Hub id "
                                   "(org/name) downloaded into HF_HOME at start (HF_HUB_OFFLINE: from the cache only).")
    name: Optional[str] = Field(None, description="Model id served on /v1/models; the Hub id or the folder name if unset.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="auto: the checkpoint's dtype on GPUs; on CPUs bfloat16 where the CPU has native bf16 "
                            "(AVX-512 BF16 or AMX), else float32 (emulated bf16 is slower), decided on each "
                            "engine's host.")
    max_model_len: int = Field(2048, ge=16, description="The context window, the same on every pool (a KV handoff "
                                                       "needs both sides alike).")
    tool_parser: Optional[str] = Field(
        None, pattern=r"^[A-Za-z0-9_.-]+$",
        description="vLLM tool parser for `tools` (e.g. hermes, llama3_json, mistral, pythonic), checked at gateway "
                    "start. None: requests that may call tools get a 400.")
    reasoning_parser: Optional[str] = Field(
        None, pattern=r"^[A-Za-z0-9_.-]+$",
        description="vLLM reasoning parser (e.g. deepseek_r1, qwen3): splits the model's reasoning from its answer "
                    "(`reasoning` in responses, streamed), as `vllm serve --reasoning-parser` does.")

    lora_adapters: dict[Annotated[str, StringConstraints(pattern=LORA_NAME)], Annotated[str, StringConstraints(max_length=4096)]] = Field(
        {}, max_length=256,
        description="LoRA adapters served beside the base model: name → local folder (PEFT's format) or Hub id. A "
                    "request names one by `model`, and /v1/models lists them, as `vllm serve --enable-lora "
                    "--lora-modules name=path` does; both hops of a request run it with its adapter. Empty: no "
                    "LoRA (the engines are built without it).")
    max_loras: int = Field(4, ge=1, le=64, description="Adapters an engine holds at once (vLLM's `max_loras`); "
                                                       "others load on demand, evicting the least recently used.")
    max_lora_rank: Literal[1, 8, 16, 32, 64, 128, 256, 320, 512] = Field(
        16, description="The largest adapter rank served (vLLM's `max_lora_rank`); an adapter of a higher rank is "
                        "refused when it loads.")

    @model_validator(mode="after")
    def _check_adapter_names(self) -> "ModelConfig":
        if self.served_name in self.lora_adapters:
            raise ValueError(f"model.lora_adapters: {self.served_name!r} is the base model's name; name the "
                             "adapter otherwise")
        return self

    @property
    def hub_id(self) -> Optional[str]:
        """The Hub id when path is one (a relative path of the shape org/name), else None."""
        text = self.path.as_posix()
        return text if not self.path.is_absolute() and is_hub_id(text) else None

    @property
    def served_name(self) -> str:
        return self.name or self.hub_id or self.path.name


# vLLM engine arguments tandem sets itself, and where a user sets them instead: every pool must
# agree on them (a KV handoff needs both sides alike), or tandem's own machinery needs them so.
SET_BY_TANDEM = {
    "model": "model.path",
    "served_model_name": "model.name",
    "dtype": "model.dtype",
    "max_model_len": "model.max_model_len",
    "reasoning_parser": "model.reasoning_parser",
    "kv_transfer_config": "kv_transfer (tandem configures NIXL between the pools)",
    "kv_events_config": "routing.kv_events (tandem binds the KV-event sockets itself)",
    "disable_log_stats": "nothing: tandem reads the engine's stats for routing and autoscaling",
    "data_parallel_size": "the pool's replicas (each replica is one engine)",
    "enable_lora": "model.lora_adapters (every pool serves the same adapters: a handoff needs both sides alike)",
    "max_loras": "model.max_loras",
    "max_lora_rank": "model.max_lora_rank",
}
# engine: keys that are tandem's, not vLLM's (vLLM has no name for them).
TANDEM_ENGINE_KEYS = frozenset({"cpu_niceness"})


class EngineConfig(BaseModel):
    """The vLLM engine of one pool: any vLLM engine argument under its vLLM name (EngineArgs; the
    `vllm serve` flag with `_` for `-`), plus tandem's own keys (TANDEM_ENGINE_KEYS). Declared
    below are only the vLLM arguments tandem reads itself or defaults differently from vLLM; the
    rest pass through as written. Values are read by vLLM's own parser, as `vllm serve --config`
    reads a YAML, at `tandem check-config` and at engine start (cluster/engine/engine_args.py),
    which is also where a name vLLM does not know is refused. null: vLLM's default."""

    model_config = ConfigDict(extra="allow", frozen=True)

    # Always explicit by default: vLLM on CPU otherwise claims a large share of RAM.
    kv_cache_memory_bytes: Optional[HumanInt] = Field(
        256 * MiB, ge=16 * MiB, description="The KV cache's size. null: sized by gpu_memory_utilization (GPU).")
    kv_cache_dtype: str = Field("auto", description="Part of the KV handoff's identity: prefill and decode must agree.")
    max_num_seqs: int = Field(32, ge=1, description="Also the base of autoscaling targets and Serve's request bound.")
    max_num_batched_tokens: Optional[HumanInt] = Field(None, ge=16, description="Also the router's token budget.")
    enable_chunked_prefill: Optional[bool] = Field(
        None, description="None: vLLM's default. True lets max_num_batched_tokens be below model.max_model_len.")
    enable_prefix_caching: bool = Field(True, description="The KV-aware router follows the prefix cache.")
    enforce_eager: bool = Field(True, description="tandem's default, not vLLM's: a CPU engine starts in ~20 s, "
                                                  "not 40-90 s.")
    block_size: Optional[int] = Field(None, ge=1, description="Part of the KV handoff's identity, and of the "
                                                             "router's block hashes. None: vLLM's default.")
    tensor_parallel_size: int = Field(1, ge=1, description="On GPUs at most the pool's num_gpus.")
    speculative_config: Optional[dict[str, Any]] = Field(
        None, description="vLLM's speculative decoding, e.g. {method: ngram, num_speculative_tokens: 3, "
                          "prompt_lookup_max: 3}; decode pools only.")
    structured_outputs_config: dict[str, Any] = Field(
        {}, description="vLLM's, e.g. {backend: xgrammar, disable_any_whitespace: true}; the gateway checks "
                        "requests against the default tier's decode pool's.")

    # The engine is on no token's path but shares the cores with what is (cluster/vllm_plugin.py).
    cpu_niceness: int = Field(
        5, ge=0, le=19,
        description="tandem's own key. CPU hosts: the niceness of vLLM's EngineCore and worker. Above 0 the gateway, "
                    "on every token's path, runs first: smoother streams at low load, a slower engine under load "
                    "(0 on a decode pool that is the bottleneck; loadtest/bench/RESULTS.md section 7).")

    @model_validator(mode="after")
    def _check_combinations(self) -> "EngineConfig":
        extra = self.model_extra or {}
        for key in extra:
            if key in SET_BY_TANDEM:
                raise ValueError(f"{key} is set by tandem for every pool: set {SET_BY_TANDEM[key]} instead")
        defaulted_kv = "kv_cache_memory_bytes" not in self.model_fields_set
        if self.kv_cache_memory_bytes is not None and defaulted_kv and extra.get("gpu_memory_utilization") is not None:
            # vLLM sizes the KV cache by kv_cache_memory_bytes when set, without a word about
            # gpu_memory_utilization, which then only bounds the memory free at start (what two
            # engines sharing one GPU set explicitly, beside an explicit KV size: gpu_default.py).
            raise ValueError(f"vLLM ignores gpu_memory_utilization while kv_cache_memory_bytes is set (here "
                             f"{self.kv_cache_memory_bytes}; tandem's default is {256 * MiB}): set "
                             "kv_cache_memory_bytes: null to size the KV cache by gpu_memory_utilization, or drop "
                             "gpu_memory_utilization")
        if self.enable_chunked_prefill is False and self.max_num_batched_tokens is None:
            raise ValueError("enable_chunked_prefill false needs an explicit max_num_batched_tokens "
                             "(>= model.max_model_len)")
        return self

    def vllm_args(self) -> dict[str, Any]:
        """The pool's vLLM engine arguments as written (vLLM names), unset ones (None) left out."""
        return {k: v for k, v in self.model_dump().items() if k not in TANDEM_ENGINE_KEYS and v is not None}


class PlacementConfig(_Strict):
    """Which Ray nodes a pool's replicas may run on (multi-node clusters). A replica is placed
    only on a node that has all these custom resources free and carries all these labels, so
    prefill and decode can live on different machines. Empty: anywhere."""

    resources: dict[str, float] = Field(
        {}, description="Ray custom resources per replica, e.g. {tandem-prefill: 1}; nodes advertise them with "
                        "`ray start --resources '{\"tandem-prefill\": 8}'` (the Helm chart does this per worker group).")
    node_labels: dict[str, str] = Field(
        {}, description="Ray node labels the replica requires (Ray's label_selector), e.g. {tandem.io/pool: "
                        "interactive-prefill}; nodes get them with `ray start --labels k=v`.")


class AutoscalingConfig(_Strict):
    """Autoscaling of one pool (cluster/autoscaling/). Prefill scales on queued prompt tokens
    and TTFT against the tier's SLO; decode on running sequences, KV cache usage and
    inter-token latency against the SLO. With it, the pool's `replicas` is the initial count."""

    min_replicas: int = Field(1, ge=1, description="At least 1: /health needs every pool, and a vLLM cold start takes tens of seconds.")
    max_replicas: int = Field(2, ge=1, description="The most replicas the policy may ask for.")
    upscale_delay_s: float = Field(10.0, ge=0, description="Pressure must last this long before a scale-up.")
    downscale_delay_s: float = Field(120.0, ge=0, description="Idleness must last this long before a scale-down.")
    cooldown_s: float = Field(30.0, ge=0, description="After any change, hold: a new engine needs time to start and "
                                                      "the signals to settle.")
    scale_down_below: float = Field(
        0.5, gt=0, lt=1, description="Hysteresis: scale down only when the load would fill less than this share of "
                                     "one replica fewer (scale-up happens above 1.0), so steady load never flips.")
    target_queued_prompt_tokens: int = Field(4096, ge=1, description="Prefill's target per replica.")
    target_running_seqs: Optional[int] = Field(None, ge=1, description="Decode's target per replica. Default: 3/4 "
                                                                      "of engine.max_num_seqs.")
    target_kv_usage: float = Field(0.8, gt=0, le=1, description="Decode's target KV cache usage per replica.")
    look_back_s: float = Field(10.0, gt=0, description="Ray Serve's metric window (seconds).")
    metrics_interval_s: float = Field(2.0, gt=0, description="How often replicas push their signals (seconds).")
    decision_log: Optional[Path] = Field(None, description="Append each tick's observation and decision here as "
                                                           "JSON lines (tuning, replay tests).")

    @model_validator(mode="after")
    def _check_bounds(self) -> "AutoscalingConfig":
        if self.max_replicas < self.min_replicas:
            raise ValueError(f"max_replicas ({self.max_replicas}) must be >= min_replicas ({self.min_replicas})")
        return self


class PoolConfig(_Strict):
    """One pool of a tier (its prefill or its decode deployment): each replica is one vLLM engine."""

    replicas: int = Field(1, ge=0, description="Replicas; with autoscaling, the initial count.")
    num_cpus: float = Field(1.0, ge=0, description="Ray CPUs per replica.")
    num_gpus: float = Field(0.0, ge=0, description="Ray GPUs per replica.")
    # Engines sharing cores run 3-4x slower, so each replica gets its own.
    cpu_binding: tuple[str, ...] = Field(
        (), description="CPU cores for each replica slot's engine, one entry per slot (vLLM's "
                        "VLLM_CPU_OMP_THREADS_BIND syntax, e.g. \"0\" or \"2-3\"). Ignored on GPU.")
    engine: EngineConfig = Field(EngineConfig(), description="The pool's vLLM engine arguments.")
    autoscaling: Optional[AutoscalingConfig] = Field(None, description="None: a fixed `replicas`.")
    placement: PlacementConfig = Field(PlacementConfig(), description="Which Ray nodes the replicas may run on.")
    drain_timeout_s: Optional[float] = Field(
        None, gt=0, description="How long a replica that Serve removes (scale-down, redeploy) keeps serving the requests "
                                "it has; Serve sends it no new ones meanwhile, and stops it when they are done. Streams "
                                "still running at the deadline continue on another replica (migration). None: a decode "
                                "pool waits for the tier's longest answer (model.max_model_len tokens at slo.itl_s, at "
                                "least 20 s); a prefill pool 20 s for its prompts + 22 s for the decodes to pull the last "
                                "one's KV (the handoff's usable lease).")
    max_surge_percent: Optional[int] = Field(
        None, ge=0, le=100, description="A redeploy's replacement order (Serve's max_surge_percent): extra replicas, as a "
                                        "percentage of the pool's count, started before the old ones drain (100: every "
                                        "new replica up first; 0: Serve's stop-first, the pool short of the replicas being "
                                        "replaced meanwhile). A surge needs room for the extra replicas' Ray resources, or "
                                        "the rollout waits for it without end (the old replicas keep serving). None: 100 "
                                        "when a replica reserves no CPU, GPU or placement resource, else 0.")


class SLOConfig(_Strict):
    """Latency objectives of a tier; the autoscaling policies scale against them."""

    ttft_s: float = Field(1.0, gt=0, description="Time to first token.")
    itl_s: float = Field(0.1, gt=0, description="Inter-token latency (a stream's mean).")
    max_gap_s: Optional[float] = Field(
        None, gt=0, description="Longest single token gap: the P/D decider prefills a prompt on a decode engine only "
                                "when its streams' gaps stay within it. None: twice itl_s.")

    @model_validator(mode="after")
    def _gap_not_below_mean(self) -> "SLOConfig":
        if self.max_gap_s is not None and self.max_gap_s < self.itl_s:
            raise ValueError(f"slo.max_gap_s ({self.max_gap_s}) is below slo.itl_s ({self.itl_s}): a stream's "
                             "longest gap cannot be shorter than its mean")
        return self

    @property
    def gap_s(self) -> float:
        """max_gap_s, or its default: twice the mean."""
        return self.max_gap_s if self.max_gap_s is not None else 2 * self.itl_s


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

    def summary(self) -> str:
        """One line for the start-up output: when this tier answers 429."""
        line = (f"up to {self.max_running} running and {self.max_queued} queued "
                f"(a queued request waits up to {self.queue_timeout_s:g} s), then 429")
        if self.max_queue_wait_s is None and self.target_ttft_s is None:
            return line + "; no SLO shedding"
        if self.max_queue_wait_s is not None:
            line += f"; sheds arrivals expected to wait over {self.max_queue_wait_s:g} s"
        if self.target_ttft_s is not None:
            line += f"; running places adapt ({self.min_running}..{self.max_running}) to a {self.target_ttft_s:g} s TTFT"
        return line

    @model_validator(mode="after")
    def _min_within_max(self) -> "AdmissionConfig":
        if self.min_running > self.max_running:
            raise ValueError(f"min_running ({self.min_running}) must not exceed max_running ({self.max_running})")
        return self


class TierConfig(_Strict):
    """A service tier (e.g. interactive, batch): its own prefill and decode pools."""

    prefill: PoolConfig = Field(PoolConfig(cpu_binding=("0",)), description="The pool that computes prompts.")
    decode: PoolConfig = Field(PoolConfig(cpu_binding=("1",)), description="The pool that streams the answers.")
    slo: SLOConfig = Field(SLOConfig(), description="The tier's latency objectives.")
    admission: AdmissionConfig = Field(AdmissionConfig(), description="The tier's bounded queue at the gateway.")

    def pools(self) -> dict[str, PoolConfig]:
        return {"prefill": self.prefill, "decode": self.decode}
