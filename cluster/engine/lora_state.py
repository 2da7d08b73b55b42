"""Which LoRA adapters an engine holds, from vLLM's own signals, and the evictions among them.

Two signals, both vLLM's (issue 31):
- `vllm:lora_requests_info`, the gauge vLLM's Prometheus stat logger sets every step in this
  (the replica's) process: its labels name the adapters with requests running and waiting, and
  `max_lora`. Each label combination is its own series, set to the time it was last current,
  so the newest series is the engine's state now. Running adapters are loaded; waiting ones are
  about to be (or wait for a free slot).
- `AsyncLLM.list_loras()`: the ids in the engine's adapter cache (vLLM's LRU of `max_cpu_loras`,
  by default `max_loras`), whether or not a request uses them now: an idle adapter stays loaded
  until a new one evicts it. It is a call into the EngineCore process, so it is async: the
  replica's async routing-stats hook reads it (bounded to 5 s) before each report (replica.py).

An eviction is an id that was in the cache and is no longer: tandem unloads no adapter itself
(no unload route yet; one would call `LoraResidency.forget`), so only vLLM's LRU removes one.
The count is a lower bound: an adapter loaded and evicted between two refreshes (~1 s) is missed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional

from cluster.metrics import Counter

LORA_INFO = "vllm:lora_requests_info"
EVICTIONS = Counter("tandem_lora_evictions",
                    "LoRA adapters vLLM evicted from an engine's adapter cache (max_loras) to load another: "
                    "seen as an adapter gone between two of the engine's reports, ~1 s apart (a lower bound).",
                    ("tier", "pool", "replica"))


@dataclass(frozen=True)
class LoraInfo:
    """vllm:lora_requests_info's newest series: adapter names with requests running / waiting."""

    running: tuple[str, ...] = ()
    waiting: tuple[str, ...] = ()
    max_loras: Optional[int] = None


def _names(label: str) -> tuple[str, ...]:
    return tuple(name for name in label.split(",") if name)  # vLLM joins them with ","; "" is none


def lora_info_of(families: Iterable[Any]) -> Optional[LoraInfo]:
    """The newest vllm:lora_requests_info series among Prometheus metric families (pure: tests
    give it families; the engine gives it its registry's). None when vLLM has set none (no
    LoRA, or no step yet)."""
    newest = None
    for family in families:
        if family.name != LORA_INFO:
            continue
        for sample in family.samples:
            if newest is None or sample.value > newest.value:
                newest = sample
    if newest is None:
        return None
    labels = newest.labels
    max_lora = labels.get("max_lora")
    return LoraInfo(_names(labels.get("running_lora_adapters", "")), _names(labels.get("waiting_lora_adapters", "")),
                    int(max_lora) if max_lora not in (None, "") else None)


def read_lora_info() -> Optional[LoraInfo]:
    """lora_info_of this process's registry, where vLLM's in-process stat logger records."""
    from prometheus_client import REGISTRY

    return lora_info_of(REGISTRY.collect())


class LoraResidency:
    """One engine's adapter cache as last seen, with its evictions counted.

    `names`: vLLM's adapter id → the configured name (vLLM's serving code numbers the configured
    adapters 1, 2, ... in order, as the gateway's does); an id it does not know (loaded at run
    time) reads as "#<id>", so it still takes a slot in the count.
    """

    def __init__(self, names: Mapping[int, str], labels: Mapping[str, str]):
        self._names = dict(names)
        self._labels = dict(labels)
        self.resident: Optional[frozenset[str]] = None  # None until the first look
        self.evictions = 0
        EVICTIONS.labels(**self._labels).inc(0)  # exported at 0: the dashboard reads 0, not "no data"

    def observe(self, ids: Iterable[int]) -> frozenset[str]:
        """A new look at the cache; returns the adapters evicted since the last one, counted."""
        now = frozenset(self._names.get(i, f"#{i}") for i in ids)
        gone = frozenset() if self.resident is None else self.resident - now
        self.resident = now
        if gone:
            self.evictions += len(gone)
            EVICTIONS.labels(**self._labels).inc(len(gone))
        return gone

    def forget(self, name: str) -> None:
        """An adapter unloaded on purpose: its absence next time is no eviction."""
        if self.resident is not None:
            self.resident = self.resident - {name}


def lora_report(info: Optional[LoraInfo], resident: Optional[frozenset[str]], max_loras: int) -> dict[str, Any]:
    """The routing stats' LoRA fields: every adapter the engine holds or is about to (resident,
    running, waiting), sorted so an unchanged state gives an unchanged report (Serve rebroadcasts
    on change only); max_loras as vLLM's gauge says, else as configured."""
    held = set(resident or ())
    if info is not None:
        held.update(info.running, info.waiting)
    limit = info.max_loras if info is not None and info.max_loras else max_loras
    return {"loras": tuple(sorted(held)), "max_loras": limit}
