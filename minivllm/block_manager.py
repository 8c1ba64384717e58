"""BlockManager: paged KV memory, the idea at the heart of vLLM (PagedAttention, Kwon et al. 2023).

The KV pool is cut into fixed-size blocks of `block_size` tokens. A sequence owns a *block
table*: the list of physical blocks holding its tokens, in order. Like pages of virtual memory,
blocks are handed out one at a time as a sequence grows, so at most block_size - 1 slots per
sequence sit empty, instead of max_model_len - len(seq) with a static slab.

Blocks carry a reference count, so sequences can share them: n samples of one prompt (parallel
sampling) point at the prompt's blocks once. A sequence about to write into a block someone
else also holds gets a private copy first (copy-on-write); the copy itself is done on the KV
tensors by the ModelRunner, from the (src, dst) pairs append_slots returns.

Operations, with vLLM's names:
    can_allocate / allocate   reserve blocks for a sequence's tokens when it is admitted
    can_append_slots / append_slots   make room for the tokens of the next step (+ CoW)
    fork      a child shares all of its parent's blocks (ref_count + 1 each)
    free      drop a sequence's references; blocks that reach 0 return to the free list
    swap_out / swap_in   move a preempted sequence's blocks to a host-memory pool and back
"""

from __future__ import annotations

from collections import deque

from minivllm.sequence import Sequence


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# --8<-- [start:block_manager]
class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref_counts = [0] * num_blocks
        self.free_block_ids: deque[int] = deque(range(num_blocks))
        self.num_copy_on_write = 0          # how many blocks were copied, for the lessons

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    @property
    def num_shared_blocks(self) -> int:
        return sum(1 for rc in self.ref_counts if rc > 1)

    def _take(self) -> int:
        block_id = self.free_block_ids.popleft()
        assert self.ref_counts[block_id] == 0, f"block {block_id} on the free list is in use"
        self.ref_counts[block_id] = 1
        return block_id

    def _release(self, block_id: int) -> None:
        assert self.ref_counts[block_id] > 0, f"double free of block {block_id}"
        self.ref_counts[block_id] -= 1
        if self.ref_counts[block_id] == 0:
            self.free_block_ids.append(block_id)

    def _shared_blocks_to_write(self, seq: Sequence) -> list[int]:
        """Indices in seq's table of shared blocks that this step's tokens would write into."""
        first = seq.num_computed_tokens // self.block_size
        last = min(len(seq.block_table), cdiv(len(seq), self.block_size))
        return [i for i in range(first, last) if self.ref_counts[seq.block_table[i]] > 1]

    def can_allocate(self, seq: Sequence) -> bool:
        return cdiv(len(seq), self.block_size) <= self.num_free_blocks

    def allocate(self, seq: Sequence) -> None:
        assert not seq.block_table, f"{seq} already holds blocks"
        seq.block_table = [self._take() for _ in range(cdiv(len(seq), self.block_size))]

    def can_append_slots(self, seq: Sequence) -> bool:
        new_blocks = cdiv(len(seq), self.block_size) - len(seq.block_table)
        return new_blocks + len(self._shared_blocks_to_write(seq)) <= self.num_free_blocks

    def append_slots(self, seq: Sequence) -> list[tuple[int, int]]:
        """Grow seq's table to cover all len(seq) tokens; return the copy-on-write pairs."""
        copies = []
        for i in self._shared_blocks_to_write(seq):
            src, dst = seq.block_table[i], self._take()
            self._release(src)
            seq.block_table[i] = dst
            copies.append((src, dst))
            self.num_copy_on_write += 1
        while len(seq.block_table) < cdiv(len(seq), self.block_size):
            seq.block_table.append(self._take())
        return copies

    def fork(self, parent: Sequence, child: Sequence) -> None:
        assert not child.block_table, f"{child} already holds blocks"
        child.block_table = list(parent.block_table)
        for block_id in child.block_table:
            self.ref_counts[block_id] += 1

    def free(self, seq: Sequence) -> None:
        for block_id in reversed(seq.block_table):
            self._release(block_id)
        seq.block_table = []

    # Swapping: `self` manages the device pool, `cpu` a second pool in host memory. A swapped
    # sequence keeps its table, pointing into the CPU pool, until it is swapped back in.
    def can_swap_out(self, seq: Sequence, cpu: "BlockManager") -> bool:
        return len(seq.block_table) <= cpu.num_free_blocks

    def swap_out(self, seq: Sequence, cpu: "BlockManager") -> list[tuple[int, int]]:
        """Move seq's blocks to the CPU pool; return (device block, cpu block) copy pairs."""
        pairs = [(block_id, cpu._take()) for block_id in seq.block_table]
        self.free(seq)
        seq.block_table = [cpu_block for _, cpu_block in pairs]
        return pairs

    def can_swap_in(self, seq: Sequence) -> bool:
        return cdiv(len(seq), self.block_size) <= self.num_free_blocks

    def swap_in(self, seq: Sequence, cpu: "BlockManager") -> list[tuple[int, int]]:
        """Bring seq's blocks back from the CPU pool; return (cpu block, device block) pairs."""
        pairs = [(cpu_block, self._take()) for cpu_block in seq.block_table]
        cpu.free(seq)
        seq.block_table = [block_id for _, block_id in pairs]
        return pairs
# --8<-- [end:block_manager]
