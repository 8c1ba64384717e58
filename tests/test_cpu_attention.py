"""The torch backend's fast path (kernels/cpu_attention.py) against the padded reference
(minivllm.attention.torch_attention.paged_attention), on random paged batches and inside the engine."""

import pytest
import torch

import minivllm.attention.layer as attention
from conftest import PROMPTS
from kernels.cpu_attention import VarlenLayout, varlen_attention
from kernels.paged_batch import random_paged_batch
from kernels.write_kv import quantize_kv
from minivllm import SamplingParams
from minivllm.attention.metadata import AttentionMetadata
from minivllm.attention.torch_attention import paged_attention

# (q_lens, ctx_lens, num_heads, num_kv_heads, block_size): decode of mixed lengths, prefill
# from scratch (is_causal), chunks over a cached prefix, a mixed step, GQA and MHA, and one
# block per sequence (the contiguous layout).
CASES = {
    "decode_mixed": ([1] * 7, [3, 350, 17, 90, 16, 200, 45], 9, 3, 16),
    "prefill": ([33, 7], [0, 0], 9, 3, 16),
    "chunks": ([12, 5], [40, 3], 4, 4, 8),
    "mixed_step": ([1, 20, 1, 4, 1], [60, 0, 7, 30, 250], 9, 3, 16),
    "contiguous": ([1, 6, 1], [10, 0, 30], 6, 2, 64),
}


def _batch(case, dtype=torch.float32):
    q_lens, ctx_lens, heads, kv_heads, block_size = CASES[case]
    b = random_paged_batch(q_lens, ctx_lens, heads, kv_heads, 64, block_size, dtype=dtype)
    md = AttentionMetadata(b.seq_lens.new_empty(0), b.query_start_loc, b.seq_lens,
                           b.block_tables, b.max_query_len, b.max_seq_len)
    return b, md, VarlenLayout.build(b.query_start_loc, b.seq_lens, b.block_tables, block_size)


@pytest.mark.parametrize("case", CASES)
def test_fast_path_matches_the_padded_reference(case):
    b, md, layout = _batch(case)
    ref = paged_attention(b.q, b.k_cache, b.v_cache, md, 0.125)
    out = varlen_attention(b.q, b.k_cache, b.v_cache, layout, 0.125)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype,tol", [(torch.bfloat16, 2e-2), (torch.float16, 2e-3)])
def test_fast_path_in_half_precision_is_within_rounding_of_fp32(dtype, tol):
    b, md, layout = _batch("mixed_step", dtype)
    ref = paged_attention(b.q.float(), b.k_cache.float(), b.v_cache.float(), md, 0.125)
    out = varlen_attention(b.q, b.k_cache, b.v_cache, layout, 0.125)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)


@pytest.mark.parametrize("kind", ["int8", "fp8"])
def test_fast_path_over_a_quantized_pool_matches_the_reference(kind):
    b, md, layout = _batch("mixed_step")
    kq, vq = quantize_kv(b.k_cache, kind), quantize_kv(b.v_cache, kind)
    ref = paged_attention(b.q, kq, vq, md, 0.125, kind)
    out = varlen_attention(b.q, kq, vq, layout, 0.125, kind)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_decode_groups_gather_far_fewer_keys_than_padding():
    """16 sequences of 16..350 tokens: the reference gathers 16 x 350 key rows per layer."""
    lens = torch.linspace(16, 350, 16).long().tolist()
    b = random_paged_batch([1] * 16, [n - 1 for n in lens], 9, 3, 64, 16)
    layout = VarlenLayout.build(b.query_start_loc, b.seq_lens, b.block_tables, 16)
    gathered = sum(mask.numel() for _, _, mask in layout.decode_groups)     # keys
    assert len(layout.decode_groups) <= 5                  # a few SDPA calls, not 16
    assert gathered < 0.75 * 16 * 350 and gathered >= sum(lens)
    assert sorted(r for rows, _, _ in layout.decode_groups for r in rows.tolist()) == list(range(16))


def test_engine_tokens_identical_with_the_reference_flag(smol, monkeypatch):
    """Greedy tokens of a batch with chunked prefill and mixed lengths, fast path vs the
    reference behind USE_REFERENCE: the same tokens (fp32). Not asked of an int8 KV pool: there
    a 1e-7 difference in a K row can move its int8 rounding by a whole step, enough to flip
    PROMPTS[1]'s first token (a near-tie, 0.003 apart); the quantized test above covers it."""
    llm = smol(max_num_batched_tokens=64)
    params = SamplingParams(max_tokens=12, temperature=0)

    def tokens():
        return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]

    fast = tokens()
    monkeypatch.setattr(attention, "USE_REFERENCE", True)
    assert tokens() == fast
