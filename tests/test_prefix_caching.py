"""Automatic prefix caching: exact hit counts, LRU eviction, the edge cases, same tokens."""

import pytest
import torch

from conftest import PROMPTS
from minivllm import LLM, SamplingParams
from minivllm.core import block_manager as bm_module
from minivllm.core.block_manager import BlockManager
from minivllm.core.request import Request

BS = 4


def make_seq(tokens, seq_id=0):
    return Request(f"r{seq_id}", list(tokens), SamplingParams())


def admit_and_compute(bm, tokens, seq_id=0):
    """Admit a sequence, 'compute' all its tokens, name its full blocks; return it."""
    seq = make_seq(tokens, seq_id)
    bm.allocate(seq)
    hit = seq.num_computed_tokens
    seq.num_computed_tokens = len(seq)
    bm.cache_computed_blocks(seq)
    return seq, hit


def test_hits_follow_the_shared_prefix_block_by_block():
    bm = BlockManager(16, BS, enable_prefix_caching=True)
    system = list(range(100, 112))                        # 3 full blocks
    a, hit_a = admit_and_compute(bm, system + [1, 2, 3, 4, 5], 0)
    b, hit_b = admit_and_compute(bm, system + [9, 9, 9], 1)
    c, hit_c = admit_and_compute(bm, system[:6] + [7] * 8, 2)   # diverges inside block 2
    assert (hit_a, hit_b, hit_c) == (0, 12, 4)
    assert b.block_table[:3] == a.block_table[:3] and c.block_table[0] == a.block_table[0]
    assert c.block_table[1] != a.block_table[1]
    assert bm.prefix_cache.num_hit_tokens == 16
    for s in (a, b, c):
        bm.free(s)
    assert bm.num_free_blocks == 16


def test_a_fully_cached_prompt_still_computes_its_last_token():
    bm = BlockManager(16, BS, enable_prefix_caching=True)
    prompt = list(range(8))                               # exactly 2 full blocks
    first, _ = admit_and_compute(bm, prompt, 0)
    again = make_seq(prompt, 1)
    bm.allocate(again)
    assert again.num_computed_tokens == 4                 # block 2 is recomputed...
    assert again.num_uncomputed_tokens == 4               # ...so the last token has logits
    longer = make_seq(prompt + [50], 2)
    bm.allocate(longer)
    assert longer.num_computed_tokens == 8


def test_reset_prefix_cache_forgets_only_when_no_block_is_held():
    bm = BlockManager(16, BS, enable_prefix_caching=True)
    system = list(range(100, 112))
    a, _ = admit_and_compute(bm, system + [1], 0)
    assert not bm.reset_prefix_cache()                    # a holds blocks: refused
    bm.free(a)
    assert bm.reset_prefix_cache()
    b, hit = admit_and_compute(bm, system + [2], 1)
    assert hit == 0 and len(bm.prefix_cache) == 3         # cold again, then cached anew
    assert bm.prefix_cache.num_hit_tokens == 0


def test_blocks_still_being_filled_are_never_hit():
    """Two requests with one prefix admitted in the same step: nothing is computed yet."""
    bm = BlockManager(16, BS, enable_prefix_caching=True)
    a, b = make_seq(range(10), 0), make_seq(range(10), 1)
    bm.allocate(a)
    bm.allocate(b)
    assert a.num_computed_tokens == b.num_computed_tokens == 0
    assert set(a.block_table).isdisjoint(b.block_table)


def test_lru_eviction_takes_free_uncached_blocks_first_then_chain_tails():
    bm = BlockManager(6, BS, enable_prefix_caching=True)
    a, _ = admit_and_compute(bm, list(range(12)), 0)      # blocks a0 a1 a2, all cached
    bm.free(a)
    assert len(bm.prefix_cache) == 3 and bm.num_free_blocks == 6
    # 3 uncached free blocks are handed out before any cached one is evicted.
    filler = make_seq([7] * 12, 1)
    bm.allocate(filler)
    assert set(filler.block_table).isdisjoint(a.block_table)
    assert len(bm.prefix_cache) == 3
    # The next block evicts the least recently used: the chain's tail, not its head.
    one_more = make_seq([8] * 4, 2)
    bm.allocate(one_more)
    assert len(bm.prefix_cache) == 2
    head_hit = make_seq(list(range(12)) + [0], 3)
    bm.free(filler)
    bm.allocate(head_hit)
    assert head_hit.num_computed_tokens == 8             # blocks 0 and 1 survived


def test_a_reused_block_is_never_served_under_its_old_hash():
    bm = BlockManager(2, BS, enable_prefix_caching=True)
    a, _ = admit_and_compute(bm, [1, 2, 3, 4, 5], 0)
    bm.free(a)
    b, _ = admit_and_compute(bm, [6, 6, 6, 6, 6, 6, 6, 6], 1)   # takes (evicts) both blocks
    bm.free(b)
    c = make_seq([1, 2, 3, 4, 5], 2)
    bm.allocate(c)
    assert c.num_computed_tokens == 0
    assert bm.prefix_cache.num_evictions >= 1


def test_a_hash_collision_is_caught_by_comparing_tokens(monkeypatch):
    monkeypatch.setattr(bm_module, "hash_block_tokens", lambda parent, tokens, extra=(): 42)
    bm = BlockManager(16, BS, enable_prefix_caching=True)
    admit_and_compute(bm, [1, 2, 3, 4, 5], 0)
    other = make_seq([9, 9, 9, 9, 5], 1)                  # same (fake) hash, other tokens
    bm.allocate(other)
    assert other.num_computed_tokens == 0
    same = make_seq([1, 2, 3, 4, 7], 2)
    bm.allocate(same)
    assert same.num_computed_tokens == 4


def test_extra_keys_keep_identical_tokens_apart():
    bm = BlockManager(16, BS, enable_prefix_caching=True)
    admit_and_compute(bm, [1, 2, 3, 4, 5], 0)
    salted = make_seq([1, 2, 3, 4, 5], 1)
    salted.extra_keys = ("lora:7",)
    bm.allocate(salted)
    assert salted.num_computed_tokens == 0


# ---------------------------------------------------------------- on the real model

SYSTEM = ("You are a careful assistant for a library. You answer questions about opening "
          "hours, loans, and the reading room, and you keep every answer to one sentence. ")
QUESTIONS = ["When do you open on Sunday?", "How long can I keep a book?",
             "Is there wifi in the reading room?", "Can I renew a loan online?"]


def greedy_ids(llm, prompts, **kw):
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True,
                                                **kw), use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


@pytest.fixture(scope="module")
def uncached(smol_llm):
    smol_llm.reconfigure(enable_prefix_caching=False)
    try:
        return (greedy_ids(smol_llm, [SYSTEM + q for q in QUESTIONS]),
                greedy_ids(smol_llm, PROMPTS[:4]))
    finally:
        smol_llm.reconfigure(enable_prefix_caching=True)


@pytest.mark.parametrize("engine_kwargs", [
    {}, {"max_num_batched_tokens": 16}, {"num_kv_blocks": 14},
    {"num_kv_blocks": 14, "preemption_mode": "swap", "swap_space": 64 * 16 * 46080 / 2**30}])
def test_same_tokens_with_and_without_caching(smol, uncached, engine_kwargs):
    llm = smol(max_model_len=512, **engine_kwargs)
    prompts = [SYSTEM + q for q in QUESTIONS]
    first = greedy_ids(llm, prompts[:1])                  # warms the cache with the prefix
    rest = greedy_ids(llm, prompts[1:])
    assert first + rest == uncached[0]
    assert greedy_ids(llm, PROMPTS[:4]) == uncached[1]
    stats = llm.engine.stats()
    system_tokens = len(llm.tokenizer.encode(SYSTEM))
    if "num_kv_blocks" not in engine_kwargs:              # no eviction pressure: exact count
        assert stats.prefix_cache_hit_tokens >= 3 * (system_tokens // 16) * 16
    assert stats.prefix_cache_hit_tokens > 0
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks


def test_parallel_sampling_with_a_cached_prompt(smol):
    """n=3 fans out into three requests (vLLM V1), prefilled in one step: child 0 computes the
    prompt, children 1 and 2 find its full blocks (named as they were scheduled) and compute
    only the partly filled one. Warm, all three find them. The same tokens either way."""
    llm = smol(max_model_len=512)
    ids = llm.tokenizer.encode(SYSTEM + QUESTIONS[0])
    full = (len(ids) - 1) // 16 * 16
    params = SamplingParams(n=3, temperature=0.8, max_tokens=8, seed=21)
    with llm.engine.trace() as steps:
        cold = [c.token_ids for c in llm.generate([ids], params, use_tqdm=False)[0].outputs]
    assert llm.engine.stats().prefix_cache_hit_tokens == 2 * full
    assert steps[0].num_prefill_tokens == len(ids) + 2 * (len(ids) - full)
    warm = [c.token_ids for c in llm.generate([ids], params, use_tqdm=False)[0].outputs]
    assert cold == warm
    assert llm.engine.stats().prefix_cache_hit_tokens == 5 * full


def test_the_trace_records_hits_and_reset_prefix_cache_starts_cold(smol):
    """StepRecord's ScheduledSeq.num_computed_tokens counts the cached tokens a prefill starts
    past (what the simulator's calibration needs to price a hit's attention); after
    LLM.reset_prefix_cache the same prompt computes from its first token."""
    llm = smol(max_model_len=512)
    ids = llm.tokenizer.encode(SYSTEM + QUESTIONS[0])
    full = (len(ids) - 1) // 16 * 16
    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    llm.generate([ids], params, use_tqdm=False)
    with llm.engine.trace() as warm:
        llm.generate([ids], params, use_tqdm=False)
    assert llm.reset_prefix_cache()
    with llm.engine.trace() as cold:
        llm.generate([ids], params, use_tqdm=False)
    first = warm[0].scheduled[0]
    assert (first.num_computed_tokens, first.num_tokens, first.samples) == (
        full, len(ids) - full, True)
    assert (cold[0].scheduled[0].num_computed_tokens, cold[0].num_prefill_tokens) == (0, len(ids))
    assert warm[1].scheduled[0].num_computed_tokens == len(ids)      # the decode step after


def test_a_prefix_computed_twice_in_one_step_stays_reachable():
    """A and B share a block, are computed in the same step, then diverge: B's own next block
    must be chained to the *cached* copy of the shared block, or it can never be hit."""
    bm = BlockManager(16, BS, enable_prefix_caching=True)
    common, x, y = [1, 2, 3, 4], [5, 5, 5, 5], [6, 6, 6, 6]
    a, b = make_seq(common + x + [0], 0), make_seq(common + y + [0], 1)
    bm.allocate(a)
    bm.allocate(b)                         # same step: neither hits the other
    for s in (a, b):
        s.num_computed_tokens = len(s)
        bm.cache_computed_blocks(s)
    later = make_seq(common + y + [9], 2)
    bm.allocate(later)
    assert later.num_computed_tokens == 8
