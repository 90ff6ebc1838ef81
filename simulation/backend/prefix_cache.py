"""The simulator's KV prefix cache: an LRU of token blocks, as vLLM's automatic prefix caching.

Model (vLLM V1 APC, simplified to what changes time to first token):
1. a prompt's tokens are cut into blocks of `block_tokens` (vLLM's default block size, 16); only
   full blocks are cached, each named by a hash chained on the block before it and seeded with
   the model, so a block is shared only by prompts that agree on every token up to its end;
2. on admission a request looks its blocks up from the first: the leading run held is its
   cached prefix, and it pays prefill only for the tokens past it (`lookup`);
3. once its prefill has run, its full blocks are held (`insert`), so a request admitted while
   another one's prefill is still running pays in full, as on vLLM, where blocks are cached
   only when computed;
4. capacity is in tokens (capacity_tokens // block_tokens blocks); the least recently used
   block goes first, and a prompt's blocks are touched last-first so its tail blocks leave
   before its head (vLLM frees a finished request's blocks in reverse order for the same
   reason): a shared system prompt outlives the one-off questions after it;
5. `clear` empties it: a restart, or new weights after a deploy, start with nothing held.

Simplified away: blocks of running requests are not pinned (capacity is the cache's, not the
GPU's), decoded tokens are not cached, and tokens are whitespace-separated words.
The counters are the two vLLM exports (`vllm:prefix_cache_queries` and `_hits`, in tokens).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

# vLLM's default --block-size on CUDA.
DEFAULT_BLOCK_TOKENS = 16


@dataclass
class PrefixCacheStats:
    """Token counts, as vLLM exports them: queries (prompt tokens looked up), hits (held)."""

    queries: int = 0
    hits: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


class PrefixCache:
    """Blocks of prompt tokens held, least recently used first. One event loop, no locks."""

    def __init__(self, capacity_tokens: int, block_tokens: int = DEFAULT_BLOCK_TOKENS) -> None:
        if capacity_tokens < 0 or block_tokens < 1:
            raise ValueError("capacity_tokens must be >= 0 and block_tokens >= 1")
        self.block_tokens = block_tokens
        self.capacity_blocks = capacity_tokens // block_tokens
        self._blocks: OrderedDict[bytes, None] = OrderedDict()
        self.stats = PrefixCacheStats()

    @property
    def enabled(self) -> bool:
        return self.capacity_blocks > 0

    @property
    def held_tokens(self) -> int:
        return len(self._blocks) * self.block_tokens

    def blocks(self, model: str, tokens: Sequence[str]) -> list[bytes]:
        """The chained hashes of the full blocks of `tokens` (step 1)."""
        out: list[bytes] = []
        parent = hashlib.blake2b(model.encode(), digest_size=16).digest()
        b = self.block_tokens
        for i in range(0, len(tokens) - b + 1, b):
            h = hashlib.blake2b(parent, digest_size=16)
            h.update("\x1f".join(tokens[i : i + b]).encode())
            parent = h.digest()
            out.append(parent)
        return out

    def lookup(self, blocks: Sequence[bytes], tokens_in: int) -> int:
        """Tokens of the leading run of `blocks` held (step 2); the held ones are touched."""
        held = 0
        for block in blocks:
            if block not in self._blocks:
                break
            held += 1
        self._touch(blocks[:held])
        cached = held * self.block_tokens
        self.stats.queries += tokens_in
        self.stats.hits += cached
        return cached

    def insert(self, blocks: Sequence[bytes]) -> None:
        """Hold every block of a prompt whose prefill ran (step 3), evicting LRU (step 4)."""
        if not self.enabled:
            return
        for block in blocks:
            self._blocks.setdefault(block, None)
        self._touch(blocks)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)

    def clear(self) -> None:
        """Nothing held (step 5); the counters carry on, as a process's metrics do not."""
        self._blocks.clear()

    def _touch(self, blocks: Sequence[bytes]) -> None:
        for block in reversed(blocks):  # tail first: the head ends most recent (step 4)
            self._blocks.move_to_end(block)
