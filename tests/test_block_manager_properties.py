"""Property-based tests of the BlockManager: random interleavings of allocate, append, fork and
free, checked against a model of what the KV pool must contain."""

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from minivllm.core.block_manager import BlockManager
from minivllm.sampling_params import SamplingParams
from minivllm.core.request import Request
from minivllm.core.v0.scheduler import fork_blocks

NUM_BLOCKS, BLOCK_SIZE = 24, 4


class BlockManagerMachine(RuleBasedStateMachine):
    """Each sequence 'computes' its tokens by writing them into its slots of a fake KV pool
    (a list of token ids per block), applying copy-on-write pairs first, like the engine."""

    def __init__(self):
        super().__init__()
        self.bm = BlockManager(NUM_BLOCKS, BLOCK_SIZE)
        self.pool = [[None] * BLOCK_SIZE for _ in range(NUM_BLOCKS)]
        self.seqs: list[Request] = []
        self.next_id = 0
        self.next_token = 1000

    def _new_seq(self, tokens):
        seq = Request(f"r{self.next_id}", tokens, SamplingParams())
        self.next_id += 1
        return seq

    def _compute(self, seq):
        """Write every uncomputed token of seq into its slots, as a forward pass would."""
        for p in range(seq.num_computed_tokens, len(seq)):
            self.pool[seq.block_table[p // BLOCK_SIZE]][p % BLOCK_SIZE] = seq.token_ids[p]
        seq.num_computed_tokens = len(seq)

    @rule(length=st.integers(1, 3 * BLOCK_SIZE + 1))
    def allocate(self, length):
        seq = self._new_seq(list(range(self.next_token, self.next_token + length)))
        self.next_token += length
        if self.bm.can_allocate(seq):
            self.bm.allocate(seq)
            self._compute(seq)
            self.seqs.append(seq)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), count=st.integers(1, BLOCK_SIZE + 1))
    def append(self, data, count):
        seq = data.draw(st.sampled_from(self.seqs))
        for _ in range(count):
            seq.token_ids.append(self.next_token)
            self.next_token += 1
            if not self.bm.can_append_slots(seq):
                seq.token_ids.pop()
                return
            for src, dst in self.bm.append_slots(seq):
                self.pool[dst] = list(self.pool[src])
            self._compute(seq)
            self.bm.cache_computed_blocks(seq)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(self.seqs))
        child = self._new_seq(list(parent.token_ids))
        fork_blocks(self.bm, parent, child)
        child.num_computed_tokens = parent.num_computed_tokens
        self.seqs.append(child)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def free(self, data):
        seq = data.draw(st.sampled_from(self.seqs))
        self.bm.free(seq)
        self.seqs.remove(seq)

    @invariant()
    def ref_counts_equal_table_holders(self):
        holders = [0] * NUM_BLOCKS
        for seq in self.seqs:
            for block in seq.block_table:
                holders[block] += 1
        assert holders == self.bm.ref_counts

    @invariant()
    def free_list_is_exactly_the_unreferenced_blocks(self):
        free = list(self.bm.free_block_ids)
        assert len(free) == len(set(free)), "a block is on the free list twice"
        assert set(free) == {b for b in range(NUM_BLOCKS) if self.bm.ref_counts[b] == 0}

    @invariant()
    def every_sequence_reads_back_its_own_tokens(self):
        for seq in self.seqs:
            stored = [self.pool[seq.block_table[p // BLOCK_SIZE]][p % BLOCK_SIZE]
                      for p in range(seq.num_computed_tokens)]
            assert stored == seq.token_ids[:seq.num_computed_tokens], seq

    def teardown(self):
        for seq in self.seqs:
            self.bm.free(seq)
        assert self.bm.num_free_blocks == NUM_BLOCKS
        assert all(rc == 0 for rc in self.bm.ref_counts)


BlockManagerMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40,
                                                 deadline=None)
TestBlockManager = BlockManagerMachine.TestCase


class CachingBlockManagerMachine(BlockManagerMachine):
    """The same machine with prefix caching: prompts share prefixes, so admissions hit cached
    blocks (ref 0 or shared), and evictions happen under pressure. Extra invariant: every
    cached block still holds the tokens it is cached under."""

    def __init__(self):
        super().__init__()
        self.bm = BlockManager(NUM_BLOCKS, BLOCK_SIZE, enable_prefix_caching=True)

    @rule(prefix=st.sampled_from([(), (1, 2, 3, 4), (1, 2, 3, 4, 5, 6, 7, 8), (9, 9, 9, 9)]),
          tail=st.integers(1, BLOCK_SIZE + 2))
    def allocate_shared(self, prefix, tail):
        seq = self._new_seq(list(prefix) + list(range(self.next_token, self.next_token + tail)))
        self.next_token += tail
        if self.bm.can_allocate(seq):
            self.bm.allocate(seq)
            assert seq.num_computed_tokens < len(seq)       # the last token is never a hit
            self._compute(seq)
            self.bm.cache_computed_blocks(seq)
            self.seqs.append(seq)

    @invariant()
    def cached_blocks_hold_their_tokens(self):
        cache = self.bm.prefix_cache
        for block, key in cache.key_of_block.items():
            assert tuple(self.pool[block]) == key.token_ids, (block, key)


CachingBlockManagerMachine.TestCase.settings = BlockManagerMachine.TestCase.settings
TestCachingBlockManager = CachingBlockManagerMachine.TestCase
