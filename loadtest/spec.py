"""A load file (YAML): the scenario, the workload and the SLO it must meet, in one place.

    name: cpu-tiny
    users: 4              # the SLO is stated at this many concurrent users
    spawn_rate: 4         # users started per second
    duration_s: 20
    api_keys: {interactive: "", batch: "sk-batch"}   # tier -> API key ("" = no header)
    workload: {seed: 7, chat: {weight: 3, prompt_tokens: 64, output_tokens: 32}, ...}
    slo: {ttft_ms: {p95: 800}, itl_ms: {p95: 60}, tokens_per_s: {p50: 20}, max_error_rate: 0.01}

See loadtest/workloads.py for the workload keys and loadtest/measure/slo.py for the SLO keys.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from loadtest.measure.slo import SLO
from loadtest.workloads import WorkloadSpec


class LoadSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    users: int = Field(ge=1)
    spawn_rate: float = Field(0, ge=0, description="0 = all users at once")
    duration_s: float = Field(gt=0)
    api_keys: dict[str, str] = Field(default_factory=dict)
    workload: WorkloadSpec
    slo: SLO

    @classmethod
    def load(cls, path: Path) -> "LoadSpec":
        """Read and validate a load file; a trace path is taken relative to the file."""
        try:
            raw = yaml.safe_load(Path(path).read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ValueError(f"cannot read load file {path}: {exc}") from None
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: expected a YAML mapping at the top")
        trace = (raw.get("workload") or {}).get("trace")
        if isinstance(trace, dict) and "path" in trace:
            trace["path"] = str((Path(path).parent / trace["path"]).resolve())
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            raise ValueError(f"{path} is not a valid load file:\n{exc}") from None


class TokenizerVocab:
    """The model's tokenizer (a local folder with tokenizer.json), as workloads need it."""

    def __init__(self, folder: Path) -> None:
        from tokenizers import Tokenizer

        file = Path(folder) / "tokenizer.json"
        if not file.is_file():
            raise ValueError(f"{file} not found: pass --tokenizer with the model's folder "
                             "(e.g. .tandem/models/SmolLM2-135M-Instruct)")
        self._tok = Tokenizer.from_file(str(file))
        added = set(self._tok.get_added_tokens_decoder())  # special and control tokens
        self._ids: Sequence[int] = [i for i in range(self._tok.get_vocab_size()) if i not in added]

    def ids(self) -> Sequence[int]:
        return self._ids

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)
