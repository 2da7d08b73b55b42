"""The config's building blocks: sizes ("256MiB"), Hub ids, the error type, the strict base model."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, WithJsonSchema

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
