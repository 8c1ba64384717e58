"""BlockManager: paged KV memory, the idea at the heart of vLLM (PagedAttention, Kwon et al. 2023).
vLLM twin: vllm/v1/core/kv_cache_manager.py and block_pool.py.

The KV pool is cut into fixed-size blocks of `block_size` tokens. A request owns a *block
table*: the list of physical blocks holding its tokens, in order. Like pages of virtual memory,
blocks are handed out one at a time as a request grows, so at most block_size - 1 slots per
request sit empty, instead of max_model_len - its length with a static slab.

Blocks carry a reference count, so requests can share them: requests with a common prefix
point at its cached blocks once (prefix caching), and so do the samples V0 forks in the core
(core/v0/). A request about to write into a block someone else also holds gets a private copy
first (copy-on-write); the copy itself is done on the KV tensors by the ModelRunner, from the
(src, dst) pairs append_slots returns.

Operations, with vLLM's names:
    can_allocate / allocate   reserve blocks for a request's tokens when it is admitted
    can_append_slots / append_slots   make room for the tokens of the next step (+ CoW), and
              for num_lookahead_slots more: the draft tokens of speculative decoding
    free_lookahead_slots   give back the blocks that only rejected draft tokens used
    free      drop a request's references; blocks that reach 0 return to the free list

With prefix caching on (minivllm/core/prefix_cache.py), `allocate` first reuses cached blocks for
the longest cached prefix of the request, `cache_computed_blocks` names each full block as
soon as a step is scheduled to compute its K/V (as vLLM V1's cache_blocks does at allocation),
so a request admitted later in that same step already finds it, and the free list doubles as
the LRU evictor: a freed block that holds a
cached prefix goes to the back of the list (evicted last), one that does not goes to the front.

Left out, compared with vLLM: per-layer-group managers (sliding-window and hybrid models),
a watermark of free blocks held back at admission, and block allocation in a GPU-resident
table.
"""

from __future__ import annotations

from collections import OrderedDict

from minivllm.core.prefix_cache import BlockKey, PrefixCache, hash_block_tokens
from minivllm.core.request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# --8<-- [start:block_manager]
class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False,
                 enable_kv_cache_events: bool = False):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref_counts = [0] * num_blocks
        # An ordered set: taken from the front, LRU order when prefix caching is on.
        self.free_block_ids: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.prefix_cache = (PrefixCache(enable_kv_cache_events) if enable_prefix_caching
                             else None)
        self.num_copy_on_write = 0          # how many blocks were copied, for the lessons

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    def _take(self) -> int:
        block_id, _ = self.free_block_ids.popitem(last=False)
        assert self.ref_counts[block_id] == 0, f"block {block_id} on the free list is in use"
        self.ref_counts[block_id] = 1
        if self.prefix_cache is not None:
            self.prefix_cache.evict(block_id)     # its old tokens are about to be overwritten
        return block_id

    def _release(self, block_id: int) -> None:
        assert self.ref_counts[block_id] > 0, f"double free of block {block_id}"
        self.ref_counts[block_id] -= 1
        if self.ref_counts[block_id] == 0:
            self.free_block_ids[block_id] = None                      # back: evicted last
            if self.prefix_cache is None or block_id not in self.prefix_cache.hash_of_block:
                self.free_block_ids.move_to_end(block_id, last=False)  # front: reused first

    def _shared_blocks_to_write(self, request: Request, lookahead: int = 0) -> list[int]:
        """Indices in request's table of shared blocks that this step's tokens would write into."""
        table, ref_counts = request.block_table, self.ref_counts
        first = request.num_computed_tokens // self.block_size
        last = min(len(table), cdiv(len(request.token_ids) + lookahead, self.block_size))
        shared = []
        for i in range(first, last):         # (a loop, not a comprehension: mostly 1 block)
            if ref_counts[table[i]] > 1:
                shared.append(i)
        return shared

    def block_hash(self, request: Request, i: int) -> int:
        """Hash of request's full block i (computed once per request, chained): the prefix
        cache's name of the block, and the CPU tier's (minivllm/kv_offload/)."""
        bs = self.block_size
        while len(request.block_hashes) <= i:
            j = len(request.block_hashes)
            parent = request.block_hashes[j - 1] if j else None
            request.block_hashes.append(hash_block_tokens(
                parent, tuple(request.token_ids[j * bs:(j + 1) * bs]), request.extra_keys))
        return request.block_hashes[i]

    def _cached_prefix(self, request: Request) -> list[int]:
        """Blocks holding the longest cached prefix of request. Capped one token short of the
        whole request: the last token is always computed, because its logits are needed."""
        if self.prefix_cache is None:
            return []
        bs = self.block_size
        hits = []
        parent = None
        for i in range((len(request) - 1) // bs):
            tokens = tuple(request.token_ids[i * bs:(i + 1) * bs])
            key = BlockKey(parent, tokens, request.extra_keys)
            block = self.prefix_cache.lookup(self.block_hash(request, i), key)
            if block is None:
                break
            hits.append(block)
            parent = block
        return hits

    def num_cached_tokens(self, request: Request) -> int:
        """Leading tokens of request whose K/V the prefix cache holds now (a KV connector asks)."""
        return len(self._cached_prefix(request)) * self.block_size

    def can_allocate(self, request: Request) -> bool:
        hits = self._cached_prefix(request)
        new = cdiv(len(request), self.block_size) - len(hits)
        revived = sum(1 for b in hits if self.ref_counts[b] == 0)   # cached, on the free list
        return new + revived <= self.num_free_blocks

    def allocate(self, request: Request, use_prefix_cache: bool = True) -> None:
        """Give request blocks for all its tokens, reusing cached ones for its longest cached
        prefix: those tokens count as computed already."""
        assert not request.block_table, f"{request} already holds blocks"
        hits = self._cached_prefix(request) if use_prefix_cache else []
        for block in hits:
            if self.ref_counts[block] == 0:
                del self.free_block_ids[block]
            self.ref_counts[block] += 1
        new = [self._take() for _ in range(cdiv(len(request), self.block_size) - len(hits))]
        request.block_table = hits + new
        request.num_computed_tokens = len(hits) * self.block_size
        request.num_cached_blocks = len(hits)
        if self.prefix_cache is not None and use_prefix_cache:
            self.prefix_cache.num_queried_tokens += len(request)
            self.prefix_cache.num_hit_tokens += request.num_computed_tokens

    def cache_computed_blocks(self, request: Request, num_computed_tokens: int | None = None
                              ) -> None:
        """Name every block of request that is full once its first num_computed_tokens (default:
        those computed now) have K/V, so other requests can reuse it. The scheduler names a
        step's blocks when it schedules them: every layer writes the whole step's K/V before
        any attention reads it, so a request in the same step may read them (V1 does so).
        A block only partly filled is never named."""
        if num_computed_tokens is None:
            num_computed_tokens = request.num_computed_tokens
        num_full = num_computed_tokens // self.block_size
        if self.prefix_cache is None or num_full <= request.num_cached_blocks:
            return                       # (most steps: a decode that fills no block)
        bs = self.block_size
        for i in range(request.num_cached_blocks, num_full):
            block = request.block_table[i]
            # The parent is the block the cache holds for the previous hash: when two requests
            # computed the same prefix in one step, only one copy of it is named.
            parent = None
            if i:
                previous = self.block_hash(request, i - 1)
                parent = self.prefix_cache.block_of_hash.get(previous, request.block_table[i - 1])
            tokens = tuple(request.token_ids[i * bs:(i + 1) * bs])
            key = BlockKey(parent, tokens, request.extra_keys)
            self.prefix_cache.insert(block, self.block_hash(request, i), key)
        request.num_cached_blocks = num_full

    def can_append_slots(self, request: Request, num_lookahead_slots: int = 0) -> bool:
        num_blocks = cdiv(len(request.token_ids) + num_lookahead_slots, self.block_size)
        new_blocks = max(num_blocks - len(request.block_table), 0)
        # Asked for every running request every step: when the pool has room even if each
        # block this step writes into were shared (to be copied), skip looking which are.
        writes_at_most = max(num_blocks - request.num_computed_tokens // self.block_size, 0)
        if new_blocks + writes_at_most <= len(self.free_block_ids):
            return True
        shared = self._shared_blocks_to_write(request, num_lookahead_slots)
        return new_blocks + len(shared) <= len(self.free_block_ids)

    def num_blocks_to_append(self, request: Request) -> int:
        """Free blocks append_slots would take for request's next tokens: new ones, and copies
        of shared ones it writes into (a V0 beam group's are summed: core/v0/)."""
        num_blocks = cdiv(len(request.token_ids), self.block_size)
        return max(num_blocks - len(request.block_table), 0) + len(
            self._shared_blocks_to_write(request))

    def append_slots(self, request: Request, num_lookahead_slots: int = 0) -> list[tuple[int, int]]:
        """Grow request's table to cover all len(request) tokens, and num_lookahead_slots more (the
        draft tokens it verifies this step); return the copy-on-write pairs."""
        copies = []
        for i in self._shared_blocks_to_write(request, num_lookahead_slots):
            src, dst = request.block_table[i], self._take()
            self._release(src)
            request.block_table[i] = dst
            copies.append((src, dst))
            self.num_copy_on_write += 1
        num_blocks = cdiv(len(request.token_ids) + num_lookahead_slots, self.block_size)
        while len(request.block_table) < num_blocks:
            request.block_table.append(self._take())
        return copies

    def free_lookahead_slots(self, request: Request) -> None:
        """Give back the blocks past request's last token: after a verification, those held only
        rejected draft tokens (never named in the prefix cache: they were never computed)."""
        while len(request.block_table) > cdiv(len(request), self.block_size):
            self._release(request.block_table.pop())

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix (vLLM's reset_prefix_cache): a benchmark's next run then
        starts cold. Only when no request holds a block; False (nothing done) otherwise."""
        if any(self.ref_counts):
            return False
        if self.prefix_cache is not None:
            self.prefix_cache.clear()
        return True

    def free(self, request: Request) -> None:
        for block_id in reversed(request.block_table):    # tail first: evicted before the head
            self._release(block_id)
        request.block_table = []
        request.num_cached_blocks = 0
# --8<-- [end:block_manager]
