"""FlashAttention over the paged KV cache: tiled, online-softmax, causal, variable-length, GQA.

What you will learn:
  * online softmax: attention over keys that arrive one tile at a time, keeping only three
    running statistics per query row (the max m, the denominator l, the output accumulator O),
    so the T x T score matrix never exists in memory (FlashAttention-2, Dao 2023);
  * how the same loop reads K/V through block tables instead of a contiguous tensor, so a
    chunk of a prompt (chunked prefill) or a prompt whose head was found in the prefix cache
    attends over context that earlier steps left in the paged cache (PagedAttention, Kwon et
    al. 2023; vLLM's Triton backends do the same);
  * causal masking that costs nothing on most tiles: only tiles crossing the diagonal are masked.

One program computes BLOCK_M query rows x one query head of one sequence:

    grid = (cdiv(max_query_len, BLOCK_M), num_seqs, num_heads)

Query row i of a sequence with seq_len tokens in the cache, q_len of them new this step, sits at
position ctx_len + i (ctx_len = seq_len - q_len) and sees keys 0 .. ctx_len + i. GQA/MQA: query
head h reads KV head h // (num_heads // num_kv_heads); nothing is copied or repeated.

Precision: every tl.dot accumulates in fp32. bf16/fp16 operands are exact inputs to the tensor
cores; fp32 operands go through them as TF32 on a GPU (Triton's default: 10-bit mantissa, so
outputs move by ~1e-3 against an fp32 reference; tests state that tolerance). IEEE fp32 dots
(`input_precision="ieee"`) would be exact but spill: 255 registers and 848 bytes of local
memory per thread at head_dim 128 even with 32 x 32 tiles (`python -m kernels.aot`), and
3xTF32 spills too. On a CPU (the interpreter) fp32 dots are exact fp32.

Under the interpreter (CPU, TRITON_INTERPRET=1, set by minivllm/platforms.py) fp32 and fp16 are
exact, but a bf16 `tl.dot` is wrong in the Triton we lock (3.9: a 16 x 16 dot off by 1e10), so
bf16 is refused there with a ValueError instead of returning garbage (check_launch).

A quantized KV cache (kv_cache_dtype "int8" / "fp8": one byte per element and a scale per
row, kernels/write_kv.py) is dequantized tile by tile in load_kv_tile; q and the dots stay in
q's dtype. Left out: the backward pass, dropout, sliding windows, ALiBi, soft-capping, FP8
dots (FP8 tensor-core attention), and
warp-specialised Hopper tricks (TMA, wgmma pipelining by hand); Triton's compiler does the
software pipelining of the key loop.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634  # exp(x) = exp2(x * log2 e): exp2 is the GPU's native instruction


# --8<-- [start:tile_step]
@triton.jit
def load_kv_tile(cache, table_row, offs_n, valid, kv_head_off, stride_b, stride_s, offs_d,
                 HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, scales, KV_QUANT: tl.constexpr):
    """K or V rows for key positions offs_n of one sequence, found through its block table.
    KV_QUANT: the rows are int8 / fp8 bytes followed by an fp32 scale (kernels/write_kv.py),
    read through `scales`, an fp32 view of the same pool; the tile comes back dequantized."""
    blocks = tl.load(table_row + offs_n // BLOCK_SIZE, mask=valid, other=0)   # (BLOCK_N,)
    rows = blocks[:, None] * stride_b + (offs_n % BLOCK_SIZE)[:, None] * stride_s  # (N, 1)
    mask = valid[:, None] & (offs_d[None, :] < HEAD_DIM)
    # other=0: a masked V row must be 0, not garbage (0 x NaN = NaN in P @ V).
    x = tl.load(cache + rows + kv_head_off + offs_d[None, :], mask=mask, other=0.0)
    if KV_QUANT:                                   # the row's scale sits after its values
        s = tl.load(scales + (rows + kv_head_off + HEAD_DIM) // 4, mask=valid[:, None],
                    other=0.0)                                            # (BLOCK_N, 1)
        x = x.to(tl.float32) * s
    return x


@triton.jit
def online_softmax_step(acc, m_i, l_i, s, v):
    """Fold one tile of scores s (log2 units, (M, N)) and its values v (N, D) into the running
    statistics: m = row max so far, l = sum of exp2(s - m) so far, acc = unnormalised output."""
    m_new = tl.maximum(m_i, tl.max(s, 1))                   # (M,)
    alpha = tl.exp2(m_i - m_new)                            # old terms were scaled by 2^-m_i
    p = tl.exp2(s - m_new[:, None])                         # (M, N)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)   # (M, D)
    return acc, m_new, l_i
# --8<-- [end:tile_step]


@triton.jit
def _flash_attention_kernel(
    Q, K_cache, V_cache, Out,  # q/out: [num_tokens, num_heads, D]; caches: [blocks, bs, Hkv, D]
    K_scale, V_scale,          # quantized caches: fp32 views of the pools (else unused)
    query_start_loc,           # [num_seqs + 1] int64: where each sequence's new tokens start
    seq_lens,                  # [num_seqs] int64: tokens in the cache (context + new)
    block_tables,              # [num_seqs, max_blocks] int64: physical block of each logical one
    qk_scale,                  # softmax scale x log2(e)
    stride_qt, stride_qh,      # q: token, head strides (head_dim contiguous)
    stride_ot, stride_oh,      # out: token, head strides
    stride_kb, stride_ks, stride_kh,  # caches: block, slot-in-block, kv-head strides
    stride_bt,                 # block_tables: row stride
    NUM_QUERIES_PER_KV: tl.constexpr,  # query heads sharing one KV head (1 = MHA)
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,     # HEAD_DIM rounded up to a power of two
    BLOCK_M: tl.constexpr,     # query rows per program
    BLOCK_N: tl.constexpr,     # keys per tile of the inner loop
    KV_QUANT: tl.constexpr,    # 0: float cache; 1 / 2: int8 / fp8 rows with a scale each
):
    m_block, seq, head = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    q_start = tl.load(query_start_loc + seq)
    q_len = (tl.load(query_start_loc + seq + 1) - q_start).to(tl.int32)
    if m_block * BLOCK_M >= q_len:       # this sequence has fewer new tokens than the longest
        return
    seq_len = tl.load(seq_lens + seq).to(tl.int32)
    ctx_len = seq_len - q_len            # tokens cached by earlier steps (or the prefix cache)

    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)           # rows of this chunk
    offs_d = tl.arange(0, BLOCK_D)
    q_mask = (offs_m < q_len)[:, None] & (offs_d < HEAD_DIM)[None, :]
    q_rows = (q_start + offs_m)[:, None]
    q = tl.load(Q + q_rows * stride_qt + head * stride_qh + offs_d[None, :], mask=q_mask,
                other=0.0)                                       # (BLOCK_M, BLOCK_D)
    q_pos = ctx_len + offs_m                                     # positions in the sequence

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    kv_head_off = (head // NUM_QUERIES_PER_KV) * stride_kh
    table_row = block_tables + seq * stride_bt

    # Keys before the first row's position are visible to every row: no mask there. Tiles from
    # diag_start on cross the diagonal and are masked; keys past the last row's position are
    # never loaded (the causal half of the work is skipped, not masked).
    first_pos = ctx_len + m_block * BLOCK_M
    diag_start = (first_pos // BLOCK_N) * BLOCK_N
    end = tl.minimum(seq_len, first_pos + BLOCK_M)
    for start_n in range(0, diag_start, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        valid = offs_n < seq_len
        k = load_kv_tile(K_cache, table_row, offs_n, valid, kv_head_off, stride_kb, stride_ks,
                         offs_d, HEAD_DIM, BLOCK_SIZE, K_scale, KV_QUANT).to(q.dtype)  # (N, D)
        v = load_kv_tile(V_cache, table_row, offs_n, valid, kv_head_off, stride_kb, stride_ks,
                         offs_d, HEAD_DIM, BLOCK_SIZE, V_scale, KV_QUANT).to(q.dtype)
        s = tl.dot(q, tl.trans(k)) * qk_scale                    # (BLOCK_M, BLOCK_N)
        acc, m_i, l_i = online_softmax_step(acc, m_i, l_i, s, v)
    for start_n in range(diag_start, end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        valid = offs_n < seq_len
        k = load_kv_tile(K_cache, table_row, offs_n, valid, kv_head_off, stride_kb, stride_ks,
                         offs_d, HEAD_DIM, BLOCK_SIZE, K_scale, KV_QUANT).to(q.dtype)
        v = load_kv_tile(V_cache, table_row, offs_n, valid, kv_head_off, stride_kb, stride_ks,
                         offs_d, HEAD_DIM, BLOCK_SIZE, V_scale, KV_QUANT).to(q.dtype)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        s = tl.where(offs_n[None, :] <= q_pos[:, None], s, float("-inf"))  # causal
        acc, m_i, l_i = online_softmax_step(acc, m_i, l_i, s, v)

    out = acc / l_i[:, None]             # the one division, after the last tile
    tl.store(Out + q_rows * stride_ot + head * stride_oh + offs_d[None, :],
             out.to(Out.dtype.element_ty), mask=q_mask)


def default_tiles(head_dim: int, max_query_len: int, on_gpu: bool, elem_bytes: int = 2,
                  capability: tuple[int, int] = (9, 0)) -> dict:
    """Tile sizes and launch settings. Under the interpreter (CPU) every program costs about a
    millisecond, so small tiles keep tests quick; tl.dot needs every dimension >= 16 on a GPU.
    The GPU numbers are a starting point; `python -m kernels.bench sweep` measures others, and
    `python -m kernels.aot` checks that each fits (no spills, shared memory within the limit).
    fp32 tiles take twice the shared memory: half the query rows keep them under ~100 KB.
    Before Hopper (capability < 9.0, no wgmma), head_dim 128 with 64-key tiles spills (255
    registers + 48 to 72 bytes of local memory on sm_80); 32-key tiles fit (196 to 226)."""
    if not on_gpu:
        return dict(block_m=16, block_n=16, num_warps=4, num_stages=1)
    block_m = 128 if max_query_len > 64 and elem_bytes <= 2 else 64
    block_n = 64 if capability >= (9, 0) or head_dim <= 64 else 32
    return dict(block_m=block_m, block_n=block_n, num_warps=8 if block_m == 128 else 4,
                num_stages=3 if head_dim <= 64 else 2)


def check_launch(x: torch.Tensor, kernel) -> None:
    """Refuse, with the reason, the launches Triton would fail on obscurely or get wrong."""
    interpreted = not isinstance(kernel, triton.runtime.JITFunction)
    if interpreted and x.dtype == torch.bfloat16:
        raise ValueError(
            "dtype torch.bfloat16 cannot run under Triton's interpreter (TRITON_INTERPRET=1): "
            "its bf16 tl.dot returns wrong numbers in this Triton version; use float32 or "
            "float16 on the CPU, or a CUDA GPU for bf16")
    if not interpreted and not x.is_cuda:
        raise RuntimeError(
            f"a Triton kernel got a tensor on {x.device}, but Triton's interpreter is off: "
            "set TRITON_INTERPRET=1 before kernels/ is imported (`import minivllm.platforms` does "
            "it on a machine without CUDA)")


def flash_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                    block_tables: torch.Tensor, max_query_len: int, scale: float,
                    kv_cache_dtype: str = "auto", **tiles) -> torch.Tensor:
    """Causal attention of the new tokens q ([num_tokens, num_heads, head_dim]) over their
    sequences' paged K/V (which already hold this step's tokens). Returns q's shape.

    tiles: override default_tiles (block_m, block_n, num_warps, num_stages). on_gpu=True takes
    the GPU's tile sizes on any device (the interpreter test of those sizes uses it);
    capability=(8, 0) those of another GPU generation (kernels/aot.py uses it).
    kv_cache_dtype "int8" / "fp8": the pools hold quantized rows (kernels/write_kv.py).
    """
    from kernels.write_kv import kv_cache_views
    num_tokens, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads "
                         f"({num_kv_heads})")
    assert q.stride(-1) == 1 and k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1
    check_launch(q, _flash_attention_kernel)
    out = torch.empty_like(q)
    if num_tokens == 0:
        return out
    on_gpu = tiles.pop("on_gpu", q.is_cuda)
    capability = tiles.pop("capability", None) or (
        torch.cuda.get_device_capability(q.device) if q.is_cuda else (9, 0))
    t = {**default_tiles(head_dim, max_query_len, on_gpu, q.element_size(), capability),
         **tiles}
    grid = (triton.cdiv(max_query_len, t["block_m"]), seq_lens.shape[0], num_heads)
    (kc, ks), (vc, vs) = (kv_cache_views(c, kv_cache_dtype) for c in (k_cache, v_cache))
    _flash_attention_kernel[grid](
        q, kc, vc, out, ks, vs, query_start_loc, seq_lens, block_tables, scale * LOG2E,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        NUM_QUERIES_PER_KV=num_heads // num_kv_heads, BLOCK_SIZE=block_size, HEAD_DIM=head_dim,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)), BLOCK_M=t["block_m"],
        BLOCK_N=t["block_n"], KV_QUANT=("auto", "int8", "fp8").index(kv_cache_dtype),
        num_warps=t["num_warps"], num_stages=t["num_stages"])
    return out


def flash_attention_reference(q, k_cache, v_cache, query_start_loc, seq_lens, block_tables,
                              scale) -> torch.Tensor:
    """The naive version, one sequence at a time: gather K/V through the block table, build the
    full (q_len x seq_len) score matrix, mask it causally, softmax, multiply by V. In fp32."""
    out = torch.empty_like(q)
    block_size, group = k_cache.shape[1], q.shape[1] // k_cache.shape[2]
    for i, seq_len in enumerate(seq_lens.tolist()):
        start, end = query_start_loc[i].item(), query_start_loc[i + 1].item()
        pos = torch.arange(seq_len, device=q.device)                    # (L,)
        slots = block_tables[i, pos // block_size] * block_size + pos % block_size
        k = k_cache.flatten(0, 1)[slots].float().repeat_interleave(group, 1)   # (L, H, D)
        v = v_cache.flatten(0, 1)[slots].float().repeat_interleave(group, 1)   # (L, H, D)
        scores = torch.einsum("qhd,khd->hqk", q[start:end].float(), k) * scale  # (H, Lq, L)
        q_pos = seq_len - (end - start) + torch.arange(end - start, device=q.device)
        scores = scores.masked_fill(pos[None, None, :] > q_pos[None, :, None], float("-inf"))
        out[start:end] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).to(q.dtype)
    return out


# ------------------------------------------------------------------------------ test + benchmark
def test_flash_attention(device="cpu", dtype=torch.float32, head_dim=64):
    """A mixed batch: a fresh prompt, a chunk over cached context, a decode, GQA 3:1."""
    from kernels.paged_batch import random_paged_batch
    b = random_paged_batch(q_lens=[37, 20, 1], ctx_lens=[0, 27, 40], num_heads=9,
                           num_kv_heads=3, head_dim=head_dim, dtype=dtype, device=device)
    args = (b.q, b.k_cache, b.v_cache, b.query_start_loc, b.seq_lens, b.block_tables)
    out = flash_attention(*args, b.max_query_len, head_dim ** -0.5)
    ref = flash_attention_reference(*args, head_dim ** -0.5)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out, ref, atol=tol, rtol=tol)


def bench(seq_len=4096, num_heads=32, num_kv_heads=8, head_dim=128, dtype=torch.bfloat16,
          block_size=16, **tiles) -> dict:
    """One causal prefill of seq_len tokens on the GPU: TFLOP/s of this kernel (reading K/V
    through block tables) and of torch's SDPA flash backend on contiguous tensors."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    from kernels.paged_batch import random_paged_batch
    b = random_paged_batch([seq_len], [0], num_heads, num_kv_heads, head_dim, block_size,
                           dtype, "cuda", spare_blocks=0)
    scale = head_dim ** -0.5
    ms = do_bench(lambda: flash_attention(b.q, b.k_cache, b.v_cache, b.query_start_loc,
                                          b.seq_lens, b.block_tables, seq_len, scale, **tiles))
    q = b.q.transpose(0, 1)[None]                                         # (1, H, T, D)
    k = b.k_cache.flatten(0, 1)[:seq_len].transpose(0, 1)[None].contiguous()  # (1, Hkv, T, D)
    v = b.v_cache.flatten(0, 1)[:seq_len].transpose(0, 1)[None].contiguous()
    # SDPA's flash backend wants equal head counts; expanding K/V costs it nothing measurable
    # in a compute-bound prefill.
    k, v = (x.repeat_interleave(num_heads // num_kv_heads, 1) for x in (k, v))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        sdpa_ms = do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=scale))
    flops = 4 * num_heads * head_dim * seq_len * (seq_len + 1) / 2   # QK^T and PV, causal half
    return {"tokens": seq_len, "ms": ms, "TFLOP/s": flops / ms / 1e9,
            "sdpa_ms": sdpa_ms, "sdpa_TFLOP/s": flops / sdpa_ms / 1e9, "vs_sdpa": sdpa_ms / ms}


if __name__ == "__main__":   # python -m kernels.flash_attention (CPU: TRITON_INTERPRET=1 first)
    if torch.cuda.is_available():
        test_flash_attention("cuda", torch.bfloat16, head_dim=128)
        print(bench())
    else:
        test_flash_attention()
        print("flash_attention matches the naive reference (interpreter)")
