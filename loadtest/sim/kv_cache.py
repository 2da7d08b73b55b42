"""An engine's KV blocks and prefix cache, as vLLM 0.32's BlockPool keeps them.

What is mirrored (vllm/v1/core/block_pool.py, kv_cache_manager.py, kv_cache_utils.py):
- a fixed number of blocks of `block_size` tokens; a free queue (LRU order) that also holds
  blocks which are free but still cached;
- a prompt's cached prefix: its leading full blocks whose hashes are in the cache, at most
  (prompt tokens - 1) tokens' worth (vLLM recomputes the last token to get logits);
- hashes are the real ones (cluster/hashing.py's BlockHasher, sha256 over the token ids and
  the parent hash), so the router's real PrefixIndex receives the hashes a real engine would
  publish;
- a block is cached (BlockStored) when the tokens scheduled into it fill it, at allocation;
  a cached block taken from the free queue for a new allocation is evicted (BlockRemoved);
- a request's blocks are freed tail first, so its tail is evicted before its head.

Not mirrored: blocks filled by generated tokens are allocated but never cached (the
simulation has no output token ids to hash); the null block; sliding windows; LoRA keys.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Optional, Sequence

from router.prefix_index import BlockRemoved, BlockStored, KVEvent

Publish = Callable[[KVEvent], None]


class BlockPool:
    def __init__(self, worker_id: str, num_blocks: int, block_size: int, publish: Publish):
        if num_blocks < 1:
            raise ValueError(f"an engine needs at least one KV block, got {num_blocks}: raise kv_cache_memory_bytes")
        self.worker_id = worker_id
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._publish = publish
        self._next_id = 0  # blocks never used yet are ids >= _next_id (no hash, nothing to evict)
        self._free: OrderedDict[int, None] = OrderedDict()  # used-then-freed blocks, LRU first
        self._hash_of: dict[int, int] = {}  # block id → its hash, while cached
        self._block_of: dict[int, int] = {}  # hash → block id
        self._refs: dict[int, int] = {}  # block id → requests using it

    # -- what the scheduler asks ---------------------------------------------------------------

    @property
    def free_blocks(self) -> int:
        return self.num_blocks - self._next_id + len(self._free)

    def usage(self) -> float:
        """vLLM's kv cache usage: the share of blocks not in the free queue."""
        return 1.0 - self.free_blocks / self.num_blocks

    def cached_prefix(self, hashes: Sequence[int], prompt_tokens: int) -> list[int]:
        """The block ids of the prompt's leading cached blocks (not yet referenced)."""
        limit = max(prompt_tokens - 1, 0) // self.block_size
        out: list[int] = []
        for h in hashes[:limit]:
            block = self._block_of.get(h)
            if block is None:
                break
            out.append(block)
        return out

    def touch(self, blocks: Sequence[int]) -> None:
        """Reference cache hits: a free cached block leaves the free queue."""
        for b in blocks:
            if self._refs.get(b, 0) == 0:
                self._free.pop(b, None)
            self._refs[b] = self._refs.get(b, 0) + 1

    def allocate(self, n: int) -> Optional[list[int]]:
        """n new blocks, or None when fewer are free (the caller preempts or waits)."""
        if n > self.free_blocks:
            return None
        out: list[int] = []
        evicted: list[int] = []
        for _ in range(n):
            if self._free:
                block, _ = self._free.popitem(last=False)
                h = self._hash_of.pop(block, None)
                if h is not None:
                    del self._block_of[h]
                    evicted.append(h)
            else:
                block = self._next_id
                self._next_id += 1
            self._refs[block] = 1
            out.append(block)
        if evicted:
            self._publish(BlockRemoved(self.worker_id, tuple(evicted)))
        return out

    def cache(self, blocks: Sequence[int], hashes: Sequence[int]) -> None:
        """Cache full blocks under their hashes. A hash already cached (another request filled
        the same block meanwhile) keeps its first block, as vLLM does."""
        stored: list[int] = []
        for block, h in zip(blocks, hashes):
            if block in self._hash_of or h in self._block_of:
                continue
            self._hash_of[block] = h
            self._block_of[h] = block
            stored.append(h)
        if stored:
            self._publish(BlockStored(self.worker_id, tuple(stored)))

    def cached_run(self, blocks: Sequence[int], start: int, end: int) -> int:
        """The index of the first block in blocks[start:end] not cached (end when all are)."""
        i = start
        while i < end and blocks[i] in self._hash_of:
            i += 1
        return i

    def free(self, blocks: Sequence[int]) -> None:
        """Release one request's blocks, tail first (its tail is evicted first)."""
        for b in reversed(blocks):
            left = self._refs.get(b, 0) - 1
            if left > 0:
                self._refs[b] = left
                continue
            self._refs.pop(b, None)
            self._free[b] = None
