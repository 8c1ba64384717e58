"""Paged decode attention, split along the context (flash-decoding), with GQA.

What you will learn:
  * why decode attention is a bandwidth problem: one query token per sequence reads that
    sequence's whole K/V history from HBM and does ~2 FLOPs per byte, so the kernel's speed is
    the speed at which it streams the cache;
  * flash-decoding (Flash-Decoding, Dao et al. 2023): with few sequences and long contexts, one
    program per (sequence, head) leaves most of the GPU idle, so the context is cut into
    partitions that run in parallel, each producing a partial result (O, m, l); a second small
    kernel merges them with the same rescaling rule as the online softmax;
  * GQA in a decode kernel: the query heads that share a KV head are the rows of one tile, so
    each K/V byte is read from HBM once per group, not once per query head.

Kernel 1 grid: (num_seqs, num_kv_heads, num_partitions). Program (s, g, p) loads the query rows
of the heads of group g, walks keys [p * PARTITION_SIZE, (p + 1) * PARTITION_SIZE) of sequence s
through its block table, and writes either the final output (one partition) or a partial one.
Kernel 2 grid: (num_seqs, num_heads): merge the partials, BLOCK_P partitions at a time.

The partials live in a DecodeScratch. The engine allocates one, once, for max_num_seqs
sequences of up to max_model_len tokens, and passes it to every call: then the grid and every
buffer address stay the same from step to step (what a CUDA graph needs), and nothing is
allocated per layer. Without one, a call allocates what its batch needs (tests, benchmarks).

Left out: multi-token decode (speculative verification uses flash_attention.py), ALiBi, sliding
windows. A quantized KV cache (int8 / fp8 rows with a scale, kernels/write_kv.py) is read
through load_kv_tile, which dequantizes each tile as it loads it. Follows PagedAttention (Kwon et al. 2023) for the cache layout; precision and
the interpreter's limits as in flash_attention.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.flash_attention import LOG2E, check_launch, load_kv_tile, online_softmax_step


@triton.jit
def _paged_decode_kernel(
    Q, K_cache, V_cache,      # q: [num_seqs, num_heads, D]; caches: [blocks, bs, Hkv, D]
    K_scale, V_scale,         # quantized caches: fp32 views of the pools (else unused)
    Out,                      # [num_seqs, num_heads, D]; written when there is one partition
    Part_O, Part_M, Part_L,   # [max_seqs, num_heads, num_partitions, BLOCK_D] and [.., .., parts]
    seq_lens,                 # [num_seqs] int64: tokens in the cache, the new one included
    block_tables,             # [num_seqs, max_blocks] int64
    qk_scale,                 # softmax scale x log2(e)
    stride_qs, stride_qh, stride_os, stride_oh,
    stride_kb, stride_ks, stride_kh, stride_bt,
    stride_ps, stride_ph,     # partials: sequence and head strides (partition stride = D or 1)
    NUM_QUERIES_PER_KV: tl.constexpr,
    BLOCK_H: tl.constexpr,    # NUM_QUERIES_PER_KV padded to >= 16 rows (tl.dot's minimum)
    BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,    # keys per tile (divides PARTITION_SIZE)
    PARTITION_SIZE: tl.constexpr,  # keys per program (a multiple of BLOCK_N)
    ONE_PARTITION: tl.constexpr,   # True: write the final output, skip kernel 2
    KV_QUANT: tl.constexpr,   # 0: float cache; 1 / 2: int8 / fp8 rows with a scale each
):
    seq, kv_head, part = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    seq_len = tl.load(seq_lens + seq).to(tl.int32)
    start = part * PARTITION_SIZE
    if start >= seq_len:                  # a shorter sequence than the longest in the batch
        return
    end = tl.minimum(start + PARTITION_SIZE, seq_len)

    offs_g = tl.arange(0, BLOCK_H)
    heads = kv_head * NUM_QUERIES_PER_KV + offs_g                 # query heads of this group
    offs_d = tl.arange(0, BLOCK_D)
    q_mask = (offs_g < NUM_QUERIES_PER_KV)[:, None] & (offs_d < HEAD_DIM)[None, :]
    q = tl.load(Q + seq * stride_qs + heads[:, None] * stride_qh + offs_d[None, :], mask=q_mask,
                other=0.0)                                        # (BLOCK_H, BLOCK_D)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    table_row = block_tables + seq * stride_bt
    kv_head_off = kv_head * stride_kh
    for start_n in range(start, end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        valid = offs_n < end
        k = load_kv_tile(K_cache, table_row, offs_n, valid, kv_head_off, stride_kb, stride_ks,
                         offs_d, HEAD_DIM, BLOCK_SIZE, K_scale, KV_QUANT)  # (BLOCK_N, BLOCK_D)
        v = load_kv_tile(V_cache, table_row, offs_n, valid, kv_head_off, stride_kb, stride_ks,
                         offs_d, HEAD_DIM, BLOCK_SIZE, V_scale, KV_QUANT)
        if KV_QUANT:                                              # dequantized: fp32 tiles
            k, v = k.to(q.dtype), v.to(q.dtype)
        s = tl.dot(q, tl.trans(k)) * qk_scale                     # (BLOCK_H, BLOCK_N)
        s = tl.where(valid[None, :], s, float("-inf"))            # the new token sees all keys
        acc, m_i, l_i = online_softmax_step(acc, m_i, l_i, s, v)

    out = acc / l_i[:, None]
    if ONE_PARTITION:
        tl.store(Out + seq * stride_os + heads[:, None] * stride_oh + offs_d[None, :],
                 out.to(Out.dtype.element_ty), mask=q_mask)
    else:                                 # partial result of this slice of the context
        row = seq * stride_ps + heads * stride_ph + part           # (BLOCK_H,) into Part_M/L
        h_mask = offs_g < NUM_QUERIES_PER_KV
        tl.store(Part_O + row[:, None] * BLOCK_D + offs_d[None, :], out, mask=q_mask)
        tl.store(Part_M + row, m_i, mask=h_mask)
        tl.store(Part_L + row, l_i, mask=h_mask)


@triton.jit
def _reduce_partitions_kernel(
    Out,                      # [num_seqs, num_heads, D]
    Part_O, Part_M, Part_L,   # kernel 1's partials: output, row max, row sum of each partition
    seq_lens,                 # [num_seqs] int64: how many partitions each sequence filled
    stride_os, stride_oh, stride_ps, stride_ph,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    PARTITION_SIZE: tl.constexpr,
    BLOCK_P: tl.constexpr,    # partitions merged per loop iteration (registers: BLOCK_P x BLOCK_D)
):
    seq, head = tl.program_id(0), tl.program_id(1)
    num_parts = tl.cdiv(tl.load(seq_lens + seq).to(tl.int32), PARTITION_SIZE)
    offs_d = tl.arange(0, BLOCK_D)
    base = seq * stride_ps + head * stride_ph
    # Partition p normalised its output by its own l_p under its own max m_p. Its share of the
    # whole softmax is l_p * 2^(m_p - m_max): the same rescaling as one online-softmax step, so
    # the partitions are merged BLOCK_P at a time with a running max, like keys in kernel 1.
    m_i = tl.full([], float("-inf"), tl.float32)
    l_i = tl.zeros([], tl.float32)
    acc = tl.zeros([BLOCK_D], tl.float32)
    for p0 in range(0, num_parts, BLOCK_P):
        offs_p = p0 + tl.arange(0, BLOCK_P)
        p_ok = offs_p < num_parts
        m = tl.load(Part_M + base + offs_p, mask=p_ok, other=float("-inf"))      # (P,)
        l = tl.load(Part_L + base + offs_p, mask=p_ok, other=0.0)                # (P,)
        o = tl.load(Part_O + (base + offs_p)[:, None] * BLOCK_D + offs_d[None, :],
                    mask=p_ok[:, None], other=0.0)                               # (P, BLOCK_D)
        m_new = tl.maximum(m_i, tl.max(m, 0))
        alpha = tl.exp2(m_i - m_new)                 # earlier partitions' weights were 2^-m_i
        w = l * tl.exp2(m - m_new)                                               # (P,)
        acc = acc * alpha + tl.sum(w[:, None] * o, 0)                            # (BLOCK_D,)
        l_i = l_i * alpha + tl.sum(w, 0)
        m_i = m_new
    tl.store(Out + seq * stride_os + head * stride_oh + offs_d,
             (acc / l_i).to(Out.dtype.element_ty), mask=offs_d < HEAD_DIM)


def default_decode_tiles(on_gpu: bool) -> dict:
    """512-token partitions on a GPU (64 sequences x 8 KV heads x 2k context -> 2,048
    programs); 32 under the interpreter, so that short test contexts still take the split path.
    block_n is a ceiling: paged_decode_attention lowers it to divide partition_size.
    `python -m kernels.bench sweep` measures other choices."""
    if on_gpu:
        return dict(partition_size=512, block_n=64, num_warps=4, num_stages=2)
    return dict(partition_size=32, block_n=16, num_warps=4, num_stages=1)


def decode_tiles(partition_size: int | None = None, on_gpu: bool = True, **tiles) -> dict:
    """The tiles one launch uses: defaults, overrides, and a block_n that divides the partition
    (the kernel walks a partition block_n keys at a time)."""
    t = {**default_decode_tiles(on_gpu), **tiles}
    if partition_size is not None:
        t["partition_size"] = partition_size
    part = t["partition_size"]
    if part < 16 or part % 16:
        raise ValueError(f"partition_size must be a multiple of 16 (tl.dot's smallest tile), "
                         f"got {part}")
    if "block_n" in tiles:
        if part % tiles["block_n"]:
            raise ValueError(f"block_n ({tiles['block_n']}) must divide partition_size ({part})")
    else:                         # the default, lowered to a power of two dividing the partition
        t["block_n"] = math.gcd(t["block_n"], part)
    return t


REDUCE_BLOCK_P = 16   # partitions merged per reduce iteration: 16 x 128 fp32 over 128 threads


@dataclass
class DecodeScratch:
    """Where the split path's partial results go: fixed-size, allocated once per engine."""

    part_o: torch.Tensor      # [max_num_seqs, num_heads, max_partitions, BLOCK_D] fp32
    part_m: torch.Tensor      # [max_num_seqs, num_heads, max_partitions] fp32: row max
    part_l: torch.Tensor      # [max_num_seqs, num_heads, max_partitions] fp32: row sum
    partition_size: int

    @classmethod
    def allocate(cls, max_num_seqs: int, num_heads: int, head_dim: int, max_seq_len: int,
                 device, partition_size: int | None = None) -> DecodeScratch:
        """Room for max_num_seqs sequences of up to max_seq_len tokens. 64 sequences x 32
        heads x 16 partitions (8k tokens) x 128 x 4 bytes = 16 MiB."""
        device = torch.device(device)
        part = decode_tiles(partition_size, on_gpu=device.type == "cuda")["partition_size"]
        shape = (max_num_seqs, num_heads, triton.cdiv(max_seq_len, part))
        block_d = max(16, triton.next_power_of_2(head_dim))
        return cls(torch.empty(*shape, block_d, device=device, dtype=torch.float32),
                   torch.empty(shape, device=device, dtype=torch.float32),
                   torch.empty(shape, device=device, dtype=torch.float32), part)

    @property
    def max_partitions(self) -> int:
        return self.part_m.shape[2]


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           seq_lens: torch.Tensor, block_tables: torch.Tensor, max_seq_len: int,
                           scale: float, scratch: DecodeScratch | None = None,
                           kv_cache_dtype: str = "auto", **tiles) -> torch.Tensor:
    """Attention of one new token per sequence (q: [num_seqs, num_heads, head_dim]) over all
    of that sequence's paged K/V, its own included. Returns q's shape.

    scratch: the engine's fixed partials buffer (its partition size and count are used); None
    allocates for this batch. tiles: override default_decode_tiles (partition_size, block_n,
    num_warps, num_stages); on_gpu=True takes the GPU's tile sizes on any device.
    """
    num_seqs, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads "
                         f"({num_kv_heads})")
    assert seq_lens.shape[0] == num_seqs, "decode attention takes exactly one token per sequence"
    assert q.stride(-1) == 1 and k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1
    check_launch(q, _paged_decode_kernel)
    on_gpu = tiles.pop("on_gpu", q.is_cuda)
    if scratch is not None:
        if tiles.get("partition_size", scratch.partition_size) != scratch.partition_size:
            raise ValueError(f"partition_size {tiles['partition_size']} differs from the "
                             f"scratch's ({scratch.partition_size})")
        tiles["partition_size"] = scratch.partition_size
    t = decode_tiles(on_gpu=on_gpu, **tiles)
    group = num_heads // num_kv_heads
    block_d = max(16, triton.next_power_of_2(head_dim))
    out = torch.empty_like(q)
    if num_seqs == 0:
        return out
    if scratch is None:
        scratch = DecodeScratch.allocate(num_seqs, num_heads, head_dim, max_seq_len, q.device,
                                         t["partition_size"])
    num_parts = scratch.max_partitions
    if (num_seqs > scratch.part_m.shape[0] or scratch.part_m.shape[1] != num_heads
            or max_seq_len > num_parts * t["partition_size"]):
        raise ValueError(f"the decode scratch holds {scratch.part_m.shape[0]} sequences x "
                         f"{scratch.part_m.shape[1]} heads x {num_parts * t['partition_size']} "
                         f"tokens; this batch has {num_seqs} x {num_heads} x {max_seq_len}")
    from kernels.write_kv import kv_cache_views
    (kc, ks), (vc, vs) = (kv_cache_views(c, kv_cache_dtype) for c in (k_cache, v_cache))
    _paged_decode_kernel[(num_seqs, num_kv_heads, num_parts)](
        q, kc, vc, ks, vs, out, scratch.part_o, scratch.part_m, scratch.part_l, seq_lens,
        block_tables, scale * LOG2E,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        scratch.part_m.stride(0), scratch.part_m.stride(1),
        NUM_QUERIES_PER_KV=group, BLOCK_H=max(16, triton.next_power_of_2(group)),
        BLOCK_SIZE=block_size, HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_N=t["block_n"],
        PARTITION_SIZE=t["partition_size"], ONE_PARTITION=num_parts == 1,
        KV_QUANT=("auto", "int8", "fp8").index(kv_cache_dtype),
        num_warps=t["num_warps"], num_stages=t["num_stages"])
    if num_parts > 1:
        _reduce_partitions_kernel[(num_seqs, num_heads)](
            out, scratch.part_o, scratch.part_m, scratch.part_l, seq_lens,
            out.stride(0), out.stride(1), scratch.part_m.stride(0), scratch.part_m.stride(1),
            HEAD_DIM=head_dim, BLOCK_D=block_d, PARTITION_SIZE=t["partition_size"],
            BLOCK_P=REDUCE_BLOCK_P, num_warps=4)
    return out


def paged_decode_reference(q, k_cache, v_cache, seq_lens, block_tables, scale) -> torch.Tensor:
    """The naive version: per sequence, gather its K/V, repeat each KV head for the query heads
    that share it, softmax over every key. In fp32."""
    block_size, group = k_cache.shape[1], q.shape[1] // k_cache.shape[2]
    out = torch.empty_like(q)
    for i, seq_len in enumerate(seq_lens.tolist()):
        pos = torch.arange(seq_len, device=q.device)
        slots = block_tables[i, pos // block_size] * block_size + pos % block_size
        k = k_cache.flatten(0, 1)[slots].float().repeat_interleave(group, 1)   # (L, H, D)
        v = v_cache.flatten(0, 1)[slots].float().repeat_interleave(group, 1)   # (L, H, D)
        p = (torch.einsum("hd,lhd->hl", q[i].float(), k) * scale).softmax(-1)  # (H, L)
        out[i] = torch.einsum("hl,lhd->hd", p, v).to(q.dtype)
    return out


# ------------------------------------------------------------------------------ test + benchmark
def test_paged_decode(device="cpu", dtype=torch.float32, head_dim=64, **tiles):
    """Contexts of 1, 15, 16, 17 and 100 tokens in one batch; GQA 3:1."""
    from kernels.paged_batch import random_paged_batch
    ctx = [0, 14, 15, 16, 99]
    b = random_paged_batch([1] * len(ctx), ctx, 9, 3, head_dim, dtype=dtype, device=device)
    args = (b.q, b.k_cache, b.v_cache, b.seq_lens, b.block_tables)
    out = paged_decode_attention(*args, b.max_seq_len, head_dim ** -0.5, **tiles)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out, paged_decode_reference(*args, head_dim ** -0.5),
                               atol=tol, rtol=tol)


def bench(batch=64, context=2048, num_heads=32, num_kv_heads=8, head_dim=128,
          dtype=torch.bfloat16, block_size=16, **tiles) -> dict:
    """Achieved HBM bandwidth of one decode step on the GPU: the bytes that must move are the
    K/V of every cached token (plus q and out, which are tiny)."""
    from triton.testing import do_bench

    from kernels.paged_batch import random_paged_batch
    b = random_paged_batch([1] * batch, [context - 1] * batch, num_heads, num_kv_heads, head_dim,
                           block_size, dtype, "cuda", spare_blocks=0)
    ms = do_bench(lambda: paged_decode_attention(b.q, b.k_cache, b.v_cache, b.seq_lens,
                                                 b.block_tables, context, head_dim ** -0.5,
                                                 **tiles))
    kv_bytes = 2 * batch * context * num_kv_heads * head_dim * b.k_cache.element_size()
    moved = kv_bytes + 2 * b.q.numel() * b.q.element_size()
    return {"batch": batch, "context": context, "ms": ms, "GB/s": moved / ms / 1e6}


if __name__ == "__main__":   # python -m kernels.paged_attention (CPU: TRITON_INTERPRET=1 first)
    if torch.cuda.is_available():
        test_paged_decode("cuda", torch.bfloat16, head_dim=128)
        print(bench())
    else:
        test_paged_decode()
        test_paged_decode(partition_size=512)
        print("paged_decode_attention matches the naive reference (interpreter)")
