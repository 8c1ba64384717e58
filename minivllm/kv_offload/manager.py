"""The CPU tier's table: which host block holds the K/V of which block hash (vLLM twin:
vllm/v1/kv_offload/cpu.py, CPUOffloadingManager, with the LRU policy of lru_manager.py).

Plain Python on the scheduler's side: the tensors are the worker's (connector.py). A block is
named as in the prefix cache (core/prefix_cache.py): its hash chains every token before it
and the adapter's id, and the entry keeps the block's tokens and its parent's hash, so a hash
collision is a miss, never a wrong block.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable


class CPUOffloadingManager:
    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.free_blocks = list(range(num_blocks - 1, -1, -1))    # popped from the end: 0 first
        # block hash -> (host block, its key), least recently used first
        self.table: OrderedDict[int, tuple[int, tuple]] = OrderedDict()
        self.num_stored_blocks = 0           # copies out of the GPU pool, since the start
        self.num_loaded_blocks = 0           # ... and back into it (tier hits used)
        self.num_evicted_blocks = 0

    @property
    def num_used_blocks(self) -> int:
        return len(self.table)

    def lookup(self, blocks: Iterable[tuple[int, tuple]]) -> list[int]:
        """The host blocks of the leading (hash, key) blocks the tier holds (stops at the
        first miss); each hit becomes the most recently used."""
        hits = []
        for block_hash, key in blocks:
            entry = self.table.get(block_hash)
            if entry is None or entry[1] != key:
                break
            self.table.move_to_end(block_hash)
            hits.append(entry[0])
        self.num_loaded_blocks += len(hits)
        return hits

    def store(self, block_hash: int, key: tuple) -> int | None:
        """A host block for this block's K/V, the least recently used evicted if the tier is
        full; None if the tier holds it already (it becomes the most recently used) or has
        no block at all."""
        entry = self.table.get(block_hash)
        if entry is not None and entry[1] == key:
            self.table.move_to_end(block_hash)
            return None
        if entry is not None:                           # a collision: the newer block wins
            self.free_blocks.append(self.table.pop(block_hash)[0])
        if not self.free_blocks:
            if not self.table:
                return None
            self.free_blocks.append(self.table.popitem(last=False)[1][0])
            self.num_evicted_blocks += 1
        host_block = self.free_blocks.pop()
        self.table[block_hash] = (host_block, key)
        self.num_stored_blocks += 1
        return host_block

    def reset(self) -> None:
        """Forget every block (LLM.reset_prefix_cache empties both tiers)."""
        self.free_blocks = list(range(self.num_blocks - 1, -1, -1))
        self.table.clear()
