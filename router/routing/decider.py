"""PDDecider: remote prefill, or straight to decode?

A remote prefill pays two hops and a KV transfer to save the decode engine from computing the
prompt. When the part of the prompt that decode does not already hold is short, that is not
worth it: decode computes it itself ("decode_only"). A threshold of 0 always disaggregates.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PDDecider:
    decode_only_below_tokens: int = 0

    def skip_prefill(self, prompt_tokens: int, cached_on_decode_tokens: int) -> bool:
        uncached = max(prompt_tokens - cached_on_decode_tokens, 0)
        return uncached < self.decode_only_below_tokens
