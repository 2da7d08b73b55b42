"""model.path as a Hugging Face Hub id: the snapshot in HF_HOME, downloaded once at start.

`tandem run` resolves it before any engine starts, so a missing or gated model fails in
seconds with its id in the message, not inside each engine minutes later, and every engine and
the gateway's tokenizer read the same local folder. HF_HUB_OFFLINE=1 means the cache only.
The cache folder and offline mode are read from the environment at call time (huggingface_hub
reads them once, at its import), so a test or a caller can point them elsewhere.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Optional

from cluster.config import ClusterConfig, ModelConfig

_TRUE = {"1", "true", "yes", "on"}


class ModelNotFound(RuntimeError):
    """A Hub id that could not be resolved; the message says what to do."""


def hub_cache_dir() -> Path:
    """Where snapshots live: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")) / "huggingface"
    return Path(home).expanduser() / "hub"


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def resolve_model_path(model: ModelConfig, download: Optional[Callable[..., str]] = None) -> Path:
    """The local folder of `model`: path itself, or the Hub snapshot of its id."""
    repo_id = model.hub_id
    if repo_id is None:
        return model.path
    if download is None:
        from huggingface_hub import snapshot_download as download
    offline = hub_offline()
    try:
        # Its main revision, as vLLM and transformers resolve an id (the Helm chart lets them).
        folder = download(repo_id=repo_id, cache_dir=hub_cache_dir(), local_files_only=offline)
    except Exception as exc:  # huggingface_hub's errors differ by cause; all mean "not here"
        where = f"{hub_cache_dir()} (HF_HUB_OFFLINE is set: the cache only)" if offline else "the Hub"
        raise ModelNotFound(f"model.path {repo_id!r}: "
                            f"not found in {where}: {type(exc).__name__}: {exc}") from None
    return Path(folder)


def with_local_model(cfg: ClusterConfig, download: Optional[Callable[..., str]] = None) -> ClusterConfig:
    """cfg with model.path the local folder; a Hub id stays the served name (as in vLLM)."""
    if cfg.model.hub_id is None:
        return cfg
    model = cfg.model.model_copy(update={"path": resolve_model_path(cfg.model, download),
                                         "name": cfg.model.served_name})
    return cfg.model_copy(update={"model": model})
