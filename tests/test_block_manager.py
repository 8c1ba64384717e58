"""BlockManager and the contiguous baseline: allocation, growth, sharing, copy-on-write."""

import torch

from minivllm.core.block_manager import BlockManager
from minivllm.core.v0.scheduler import fork_blocks
from minivllm.core.kv_cache import ContiguousAllocator, kv_bytes_per_token
from minivllm.config import HfConfig
from minivllm.sampling_params import SamplingParams
from minivllm.core.request import Request


def seq(n_tokens: int, seq_id: int = 0) -> Request:
    return Request(f"r{seq_id}", list(range(n_tokens)), SamplingParams())


def test_allocate_grows_one_block_at_a_time():
    bm = BlockManager(num_blocks=8, block_size=4)
    s = seq(5)
    assert bm.can_allocate(s)
    bm.allocate(s)
    assert len(s.block_table) == 2 and bm.num_free_blocks == 6
    s.num_computed_tokens = 5
    for n in (6, 7, 8):                      # fills the second block: no new block
        s.token_ids.append(n)
        assert bm.append_slots(s) == [] and len(s.block_table) == 2
        s.num_computed_tokens += 1
    s.token_ids.append(9)                    # token 9 starts block 3
    bm.append_slots(s)
    assert len(s.block_table) == 3 and bm.num_free_blocks == 5
    bm.free(s)
    assert bm.num_free_blocks == 8 and s.block_table == []


def test_can_allocate_refuses_when_full():
    bm = BlockManager(num_blocks=3, block_size=4)
    a, b = seq(8, 0), seq(8, 1)
    bm.allocate(a)
    assert not bm.can_allocate(b)


def test_fork_shares_and_copy_on_write_splits_the_last_block():
    bm = BlockManager(num_blocks=8, block_size=4)
    parent = seq(6, 0)
    bm.allocate(parent)
    parent.num_computed_tokens = 6
    child = seq(6, 1)
    child.num_computed_tokens = 6
    fork_blocks(bm, parent, child)                   # V0's fork (core/v0/): the same blocks
    assert child.block_table == parent.block_table
    assert [bm.ref_counts[b] for b in parent.block_table] == [2, 2]
    full_block, shared_tail = parent.block_table
    child.token_ids.append(100)              # writes slot 6: inside the shared second block
    copies = bm.append_slots(child)
    assert copies == [(shared_tail, child.block_table[1])]
    assert child.block_table[0] == full_block             # the full block stays shared
    assert bm.ref_counts[full_block] == 2 and bm.ref_counts[shared_tail] == 1
    parent.token_ids.append(200)             # now the parent is the only holder: no copy
    assert bm.append_slots(parent) == []
    bm.free(parent)
    bm.free(child)
    assert bm.num_free_blocks == 8


def test_contiguous_allocator_reserves_a_slab_per_sequence():
    alloc = ContiguousAllocator(num_slabs=2, max_model_len=128)
    a, b, c = seq(3, 0), seq(3, 1), seq(3, 2)
    alloc.allocate(a)
    alloc.allocate(b)
    assert not alloc.can_allocate(c)          # two 3-token requests filled the cache
    alloc.free(a)
    assert alloc.can_allocate(c)


def test_kv_bytes_per_token():
    smol = HfConfig.from_hf_dict({
        "architectures": ["LlamaForCausalLM"], "vocab_size": 49152, "hidden_size": 576,
        "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
        "num_key_value_heads": 3})
    assert kv_bytes_per_token(smol, torch.float32) == 2 * 30 * 3 * 64 * 4 == 46080
    llama3_8b = HfConfig.from_hf_dict({
        "architectures": ["LlamaForCausalLM"], "vocab_size": 128256, "hidden_size": 4096,
        "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8})
    assert kv_bytes_per_token(llama3_8b, torch.bfloat16) == 131072
