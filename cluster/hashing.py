"""Block hashes of a prompt, computed exactly as vLLM's prefix cache computes them.

vLLM (v1/core/kv_cache_utils.py, 0.32) hashes a prompt in full blocks of `block_size` tokens;
each block's hash chains its parent's:

    h_i = sha256(pickle((h_{i-1}, tuple(block_i_tokens), extra_i)))
    h_{-1} = NONE_HASH = sha256(pickle(seed))

extra_i holds, in vLLM's order: ("lora", name, path) on every block of a request run with a
LoRA adapter; ("cache_salt", salt) on the first block of a request with a `cache_salt`; None when
it holds nothing (no multimodal or prompt embeds here). The salt changes the first hash and so,
through the chain, every hash: prompts of different salts (tenants) never share a block; an
adapter's prompts never share a block with the base model's or another adapter's.

with seed = PYTHONHASHSEED if the engine process has it, else "vllm-none-hash". A trailing
partial block is never cached, so it is never hashed. KV events carry the hash as the last
8 bytes read as an unsigned integer (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES, on by default);
the router keeps every hash in that integer form, `external_hash()`.

This file does not import vLLM: the gateway stays light. tests/integration/test_kv_router.py
proves equality with the hashes a real engine publishes.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from dataclasses import dataclass
from typing import Optional, Sequence, Union

DEFAULT_SEED = "vllm-none-hash"
_MASK64 = (1 << 64) - 1


def engine_hash_seed() -> str:
    """The NONE_HASH seed of an engine started in this process's environment: vLLM seeds its
    first block hash from PYTHONHASHSEED when the engine process has it."""
    return os.environ.get("PYTHONHASHSEED", DEFAULT_SEED)


def _sha256(obj: object) -> bytes:
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def external_hash(block_hash: Union[bytes, int]) -> int:
    """The integer form vLLM puts in KV events (bytes → last 8 bytes, big-endian)."""
    if isinstance(block_hash, int):
        return block_hash & _MASK64
    return int.from_bytes(block_hash, "big") & _MASK64


@dataclass(frozen=True)
class BlockHasher:
    """Hashes prompts for one engine configuration (its block size and NONE_HASH seed)."""

    block_size: int
    seed: str = DEFAULT_SEED

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")

    def raw_hashes(self, token_ids: Sequence[int], cache_salt: Optional[str] = None,
                   lora: Optional[tuple[str, str]] = None) -> list[bytes]:
        """vLLM's internal BlockHash bytes, one per full block. `lora`: the adapter's (name, path)."""
        parent = _sha256(self.seed)
        out: list[bytes] = []
        lora_keys = [("lora", *lora)] if lora else []
        for start in range(0, len(token_ids) - self.block_size + 1, self.block_size):
            # vLLM salts the first block only (generate_block_hash_extra_keys); an empty salt is none.
            keys = lora_keys + [("cache_salt", cache_salt)] if start == 0 and cache_salt else lora_keys
            parent = _sha256((parent, tuple(token_ids[start:start + self.block_size]), tuple(keys) or None))
            out.append(parent)
        return out

    def hashes(self, token_ids: Sequence[int], cache_salt: Optional[str] = None,
               lora: Optional[tuple[str, str]] = None) -> list[int]:
        """The prompt's block hashes as KV events report them."""
        return [external_hash(h) for h in self.raw_hashes(token_ids, cache_salt, lora)]
