"""The config's building blocks: sizes as vLLM reads them ("256M", "4G"), Hub ids, the error type,
the strict base model."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, WithJsonSchema

MiB = 1 << 20

# Sizes and token counts as vLLM's command line reads them (vllm/utils/argparse_utils.py
# human_readable_int), so a YAML value means in tandem what it means to `vllm serve`: a plain
# integer, or a number and one letter, k m g t decimal (4g = 4*10**9, 1.5k = 1500) and K M G T
# binary (4G = 4 GiB, 256M = 256 MiB; whole numbers only). "4GiB" or "512MB" are not sizes to
# vLLM, so not to tandem either. Written out here because importing vLLM costs ~10 s of CPU;
# tests/unit/test_config_sizes_errors.py checks the two agree.
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_HUMAN_RE = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")
SIZE_PATTERN = r"^\s*(\d+(\.\d+)?[kmgt]|\d+[KMGT]?)\s*$"


def parse_size(value):
    """An int from an int or a string as vLLM reads it ("268435456", "256M", "4G", "8k");
    anything else is left to the int validation, which names the field."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    match = _HUMAN_RE.fullmatch(text)
    if match and match.group(2) in _DECIMAL:
        return int(float(match.group(1)) * _DECIMAL[match.group(2)])
    if match and "." in match.group(1):  # vLLM refuses it too
        raise ValueError(f"{value!r}: binary units take whole numbers; did you mean {text.lower()!r} (decimal)?")
    if match:
        return int(match.group(1)) * _BINARY[match.group(2)]
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{value!r} is not a size as vLLM writes it: a plain integer, or K/M/G/T for binary "
                         "(256M = 256 MiB, 4G = 4 GiB) or k/m/g/t for decimal (4g = 4*10**9)") from None


# An integer that also takes vLLM's human-readable form ("256M", "4G", "8k"); the JSON Schema
# (Helm's values.schema.json) says both.
HumanInt = Annotated[int, BeforeValidator(parse_size), WithJsonSchema(
    {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "string", "pattern": SIZE_PATTERN}],
     "description": "an integer, or as vLLM writes it: 256M, 4G (binary), 8k, 4g (decimal)"})]

# A Hugging Face Hub id ("org/name"), told apart from a relative folder by its shape: exactly
# one "/", no "." or ".." parts. A relative folder of that shape that exists wins (see load).
_HUB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


def is_hub_id(value: str) -> bool:
    return bool(_HUB_ID_RE.match(value)) and ".." not in value


class ConfigError(ValueError):
    """A config that cannot be used, as one message naming the file and the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
