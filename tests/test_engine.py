"""The engine loop: chunked prefill, preemption, aborts, FCFS, and no leaked KV blocks."""

import pytest
import torch

from conftest import PROMPTS
from minivllm import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def token_ids(outs):
    return [o.outputs[0].token_ids for o in outs]


def generate_traced(llm, prompts, params=GREEDY):
    """Greedy token ids, and one (num_seqs, num_batched_tokens, num_preempted) per step."""
    with llm.engine.trace() as steps:
        ids = token_ids(llm.generate(prompts, params, use_tqdm=False))
    return ids, [(s.num_seqs, s.num_batched_tokens, len(s.preempted)) for s in steps]


def assert_pool_full(llm):
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks, "KV blocks leaked"
    assert all(rc == 0 for rc in bm.ref_counts)


@pytest.fixture(scope="module")
def reference(smol_llm):
    return token_ids(smol_llm.generate(PROMPTS, GREEDY, use_tqdm=False))


@pytest.mark.parametrize("budget", [16, 64, 4096])
def test_chunked_prefill_gives_the_same_tokens(smol, reference, budget):
    llm = smol(max_model_len=512, max_num_batched_tokens=budget)
    ids, steps = generate_traced(llm, PROMPTS)
    assert ids == reference
    assert max(tokens for _, tokens, _ in steps) <= budget
    if budget == 16:   # prompts of ~10-20 tokens were split, and mixed with decodes
        assert any(n > 1 and tokens == 16 for n, tokens, _ in steps)
    assert_pool_full(llm)


def test_preemption_under_a_tiny_pool_gives_the_same_tokens(smol, reference):
    # 8 sequences grow to ~40 tokens (3 blocks each): 24 blocks wanted, 10 available.
    llm = smol(max_model_len=512, num_kv_blocks=10, block_size=16)
    ids, steps = generate_traced(llm, PROMPTS)
    assert ids == reference
    assert llm.engine.scheduler.num_preemptions > 0
    assert sum(p for _, _, p in steps) == llm.engine.scheduler.num_preemptions
    assert_pool_full(llm)


def test_abort_frees_blocks_at_once(smol_llm):
    engine = smol_llm.engine
    # ignore_eos: a sampled EOS in the first steps would free the blocks before the abort.
    long = SamplingParams(max_tokens=200, ignore_eos=True, seed=0)
    engine.add_request("a", "Tell me a long story.", long)
    engine.add_request("b", "Another one.", long)
    for _ in range(3):
        engine.step()
    held = engine.block_manager.num_blocks - engine.block_manager.num_free_blocks
    assert held > 0
    engine.abort_request("a")
    engine.abort_request("b")
    assert not engine.has_unfinished_requests()
    assert_pool_full(smol_llm)


def test_streaming_steps_and_fcfs(smol):
    llm = smol(max_model_len=256, max_num_seqs=1)
    engine = llm.engine
    for i in range(3):
        engine.add_request(f"r{i}", f"Count to {i + 3}:", SamplingParams(temperature=0,
                                                                          max_tokens=4))
    finished, partial_seen, metrics = [], 0, []
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished.append(out.request_id)
                metrics.append(out.metrics)
                assert len(out.inter_token_latencies) == len(out.outputs[0].token_ids) - 1
            else:
                partial_seen += 1
                assert out.outputs[0].finish_reason is None
                assert out.metrics.e2e_latency is None
    assert finished == ["r0", "r1", "r2"]
    # One at a time (max_num_seqs=1): each waits for the one before, and latency adds up.
    for m in metrics:
        assert 0 < m.ttft <= m.e2e_latency
        assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.finished_time
    assert [m.first_scheduled_time >= prev.finished_time
            for prev, m in zip(metrics, metrics[1:])] == [True, True]
    assert metrics[0].e2e_latency < metrics[1].e2e_latency < metrics[2].e2e_latency
    assert partial_seen > 0          # outputs stream every step, not only at the end
    assert_pool_full(llm)


def test_swap_preemption_gives_the_same_tokens(smol, reference):
    llm = smol(max_model_len=512, num_kv_blocks=10, block_size=16, preemption_mode="swap",
               swap_space=64 * 16 * 46080 / 2**30)
    ids, steps = generate_traced(llm, PROMPTS)
    assert ids == reference
    sched = llm.engine.scheduler
    assert sched.num_preemptions > 0 and sched.num_swapped_out_blocks > 0
    assert sum(p for _, _, p in steps) == sched.num_preemptions
    assert_pool_full(llm)
    cpu = llm.engine.scheduler.cpu_block_manager          # V0's swap pool (core/v0/)
    assert cpu.num_free_blocks == cpu.num_blocks


def test_swap_out_and_in_restore_kv_bit_exactly(smol):
    llm = smol(max_model_len=256, num_kv_blocks=32, block_size=16, preemption_mode="swap",
               swap_space=32 * 16 * 46080 / 2**30)
    engine = llm.engine
    engine.add_request("s", "Swapping keeps the cache in host memory.", SamplingParams(
        temperature=0, max_tokens=30, ignore_eos=True))
    for _ in range(20):
        engine.step()
    seq = engine.scheduler.running[0]
    kv = engine.runner.kv_cache
    pool = engine.model_executor.driver_worker.swap_pool      # the worker's side of V0's swap
    before = kv[:, :, seq.block_table].clone()
    # Swap out, scribble over the device blocks it used, swap back in (to other blocks).
    old_blocks = list(seq.block_table)
    pairs_out = engine.scheduler.swap_out(seq)                 # V0's scheduler (core/v0/)
    pool.swap(pairs_out, [], kv)
    blocker = [engine.block_manager._take() for _ in range(len(old_blocks))]
    kv[:, :, old_blocks] = float("nan")
    pairs_in = engine.scheduler.swap_in(seq)
    pool.swap([], pairs_in, kv)
    assert seq.block_table != old_blocks
    assert torch.equal(kv[:, :, seq.block_table], before)
    for b in blocker:
        engine.block_manager._release(b)
    kv[:, :, old_blocks] = 0.0
    engine.abort_request("s")
    assert_pool_full(llm)


def test_static_batching_admits_only_into_an_empty_batch(smol, reference):
    llm = smol(max_model_len=512, max_num_seqs=4, scheduling="static")
    ids, steps = generate_traced(llm, PROMPTS)
    assert ids == reference
    sizes = [n for n, _, _ in steps]
    # Two batches of 4: sizes never grow back within a batch; they only shrink as requests
    # finish (here all finish together: equal max_tokens).
    assert max(sizes) == 4 and len(steps) == 2 * 24
