"""Automatic prefix caching: find blocks whose K/V another request already computed (vLLM
twin: vllm/v1/core/kv_cache_utils.py, hash_block_tokens, and block_pool.py's cached blocks).

Causal attention makes the K/V of a token depend only on the tokens before it. So two requests
that start with the same tokens (a system prompt, a few-shot preamble, the history of a chat)
have bit-identical K/V for that prefix, and the second can reuse the first's blocks instead of
recomputing them (vLLM's automatic prefix caching; SGLang gets the same effect with a radix
tree).

A *full* block is named by a hash of (its parent block's hash, its token ids, extra keys): the
hash of block i covers the whole prefix up to the end of block i, so a lookup walks a prompt's
blocks from the first and stops at the first miss. Extra keys keep apart blocks whose tokens
match but whose K/V would not (a LoRA adapter id, a per-tenant cache salt).

A hash is only a dict key, never trusted on its own: each cached block also remembers its
tokens and the block it follows, and a lookup checks both, so a hash collision can cost a miss
but never serves another prefix's K/V. Blocks stay cached after their last user frees them,
and are evicted (least recently used first) only when the pool hands them out again.

Left out, compared with vLLM: cache salts and multi-modal / LoRA extra keys are only room in
the key (extra_keys), no sliding-window or hybrid (Mamba) layers, and a Python hash instead of
SHA-256 (deterministic for ints, so every process of one machine agrees; not collision-hard).
With events on (kv_events.py), every name given or forgotten is also recorded for a router.
"""

from __future__ import annotations

from dataclasses import dataclass

from minivllm.core.kv_events import AllBlocksCleared, BlockRemoved, BlockStored


# The first block's parent (vLLM's NONE_HASH). A constant, not None: Python 3.11 hashes None
# by its address, which differs between processes, and the front end of data-parallel
# replicas hashes a prompt's blocks as their cores do (minivllm/routing.py).
NONE_HASH = 0


def hash_block_tokens(parent_hash: int | None, token_ids: tuple[int, ...],
                      extra_keys: tuple = ()) -> int:
    """The name of a full block: its whole prefix, chained through the parent's hash. Ints
    alone go in (token ids, a LoRA id), so every process computes the same name."""
    return hash((NONE_HASH if parent_hash is None else parent_hash, token_ids, extra_keys))


@dataclass(slots=True, frozen=True)
class BlockKey:
    parent_block: int | None      # the cached block this one follows (None: first block)
    token_ids: tuple[int, ...]
    extra_keys: tuple


class PrefixCache:
    """hash -> block, for full blocks whose K/V is computed, plus hit metrics."""

    def __init__(self, enable_kv_cache_events: bool = False):
        self.block_of_hash: dict[int, int] = {}
        self.hash_of_block: dict[int, int] = {}
        self.key_of_block: dict[int, BlockKey] = {}
        self.children: dict[int, set[int]] = {}   # evicting a block orphans what follows it
        self.num_queried_tokens = 0
        self.num_hit_tokens = 0
        self.num_evictions = 0
        self.events: list | None = [] if enable_kv_cache_events else None   # since taken

    def __len__(self) -> int:
        return len(self.block_of_hash)

    def lookup(self, block_hash: int, key: BlockKey) -> int | None:
        block = self.block_of_hash.get(block_hash)
        if block is None or self.key_of_block[block] != key:      # miss, or a collision
            return None
        return block

    def insert(self, block: int, block_hash: int, key: BlockKey) -> None:
        if block_hash in self.block_of_hash or block in self.hash_of_block:
            return                       # the same prefix is cached already (or this block)
        self.block_of_hash[block_hash] = block
        self.hash_of_block[block] = block_hash
        self.key_of_block[block] = key
        if key.parent_block is not None:
            self.children.setdefault(key.parent_block, set()).add(block)
        if self.events is not None:
            self.events.append(BlockStored(
                [block_hash], self.hash_of_block.get(key.parent_block), list(key.token_ids),
                len(key.token_ids), key.extra_keys[0] if key.extra_keys else None))

    def clear(self) -> None:
        """Forget every block (the hit counters stay: they count since the engine started)."""
        for table in (self.block_of_hash, self.hash_of_block, self.key_of_block, self.children):
            table.clear()
        if self.events is not None:
            self.events.append(AllBlocksCleared())

    def take_events(self) -> list:
        """The events recorded since the last call (none when events are off)."""
        if not self.events:
            return []
        events, self.events = self.events, []
        return events

    def evict(self, block: int) -> None:
        """Forget `block` (it is being reused for other tokens) and every block chained to it."""
        block_hash = self.hash_of_block.pop(block, None)
        if block_hash is None:
            return
        del self.block_of_hash[block_hash]
        key = self.key_of_block.pop(block)
        if key.parent_block is not None:
            self.children.get(key.parent_block, set()).discard(block)
        for child in self.children.pop(block, set()):
            self.evict(child)
        self.num_evictions += 1
        if self.events is not None:
            self.events.append(BlockRemoved([block_hash]))
