"""PagedAttention in the engine: block sizes, block boundaries, parallel sampling with CoW."""

import pytest

from conftest import hf_greedy
from minivllm import LLM, SamplingParams

TEXT = ("Paged memory lets many sequences share one pool. Each block holds a few tokens, and a "
        "table maps a sequence's logical blocks to physical ones. ") * 4


@pytest.fixture(scope="module")
def boundary_prompts(smol_llm):
    ids = smol_llm.tokenizer.encode(TEXT)
    return [ids[:n] for n in (1, 15, 16, 17, 33)]    # around 16- and 32-token boundaries


@pytest.fixture(scope="module")
def hf_refs(hf_smol, boundary_prompts):
    return [hf_greedy(hf_smol, ids, 20) for ids in boundary_prompts]


@pytest.mark.parametrize("block_size", [1, 16, 32])
def test_greedy_matches_transformers_for_every_block_size(smol_path, boundary_prompts,
                                                          hf_refs, block_size, smol):
    llm = smol(max_model_len=256, block_size=block_size)
    outs = llm.generate(boundary_prompts, SamplingParams(temperature=0, max_tokens=20,
                                                         ignore_eos=True), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == hf_refs
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks


def peak_blocks(llm, prompt_ids, params):
    engine, peak = llm.engine, 0
    engine.add_request("peak", prompt_ids, params)
    outs = []
    while engine.has_unfinished_requests():
        outs += [o for o in engine.step() if o.finished]
        peak = max(peak, engine.stats().num_blocks_used)
    return peak, outs[0]


def test_parallel_sampling_shares_the_prompt_blocks(smol_llm):
    ids = smol_llm.tokenizer.encode(TEXT)[:40]       # 2 full blocks + 8 tokens in a third
    bm = smol_llm.engine.block_manager
    cow_before = bm.num_copy_on_write
    params = SamplingParams(n=4, temperature=1.0, max_tokens=6, seed=11, ignore_eos=True)
    shared_peak, out = peak_blocks(smol_llm, ids, params)
    alone_peak, _ = peak_blocks(smol_llm, ids, SamplingParams(temperature=1.0, max_tokens=6,
                                                              ignore_eos=True))
    # 46 tokens need 3 blocks per sample. Alone: 4 x 3 = 12. Shared: the 2 full prompt
    # blocks once, and the partly filled third block per sample. n=4 fans out into four
    # requests (vLLM V1) that find the full blocks in the prefix cache: no fork, no copy.
    assert alone_peak == 3
    assert shared_peak == 2 + 4 < 4 * alone_peak
    assert bm.num_copy_on_write == cow_before
    assert len(out.outputs) == 4 and all(len(c.token_ids) == 6 for c in out.outputs)
    assert bm.num_free_blocks == bm.num_blocks


def test_each_parallel_sample_equals_its_seed_alone(smol_llm):
    ids = smol_llm.tokenizer.encode("Write a haiku about memory:")
    group = smol_llm.generate([ids], SamplingParams(n=4, temperature=0.8, max_tokens=10,
                                                    seed=100), use_tqdm=False)[0]
    samples = [c.token_ids for c in group.outputs]
    assert len(set(map(tuple, samples))) > 1          # the samples differ from each other
    for i, tokens in enumerate(samples):
        alone = smol_llm.generate([ids], SamplingParams(temperature=0.8, max_tokens=10,
                                                        seed=100 + i), use_tqdm=False)[0]
        assert alone.outputs[0].token_ids == tokens, f"sample {i}"


def test_parallel_sampling_needs_the_paged_layout(smol):
    llm = smol(max_model_len=128, kv_layout="contiguous", kv_cache_memory=4 * 128 * 46080)
    with pytest.raises(ValueError, match="needs kv_layout='paged'"):
        llm.generate("hi", SamplingParams(n=2, temperature=1.0), use_tqdm=False)


def test_parallel_sampling_survives_preemption(smol):
    """n=3 with a pool too small for all samples at once: forks get preempted and recomputed."""
    llm = smol(max_model_len=256, num_kv_blocks=7, block_size=8)
    params = SamplingParams(n=3, temperature=0.7, max_tokens=20, seed=5, ignore_eos=True)
    ids = llm.tokenizer.encode(TEXT)[:12]
    out = llm.generate([ids], params, use_tqdm=False)[0]
    assert llm.engine.scheduler.num_preemptions > 0
    assert [len(c.token_ids) for c in out.outputs] == [20, 20, 20]
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks

