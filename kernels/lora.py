"""Multi-LoRA matmuls: many adapters in one flat batch, shrink then expand.

What you will learn:
  * why a batch whose tokens use different LoRA adapters needs its own GEMM: the base layer
    y = x @ W^T is one matmul for every token, but the low-rank update y += (x @ A_i^T) @ B_i^T
    has a different A_i, B_i per token. Merging W + B_i A_i would need a copy of W per adapter;
    looping over adapters would launch a matmul per adapter per layer;
  * the two steps every multi-LoRA server uses (Punica, Chen et al. 2023; S-LoRA, Sheng et al.
    2023; vLLM's punica kernels): *shrink* x (K wide) down to the rank r (r <= 64, tiny), then
    *expand* r back up to the layer's width N, added into the base output;
  * two ways to index adapters: BGMV (batched gather matrix-vector) reads one adapter index per
    token: right for decode, where each sequence brings one token; SGMV (segmented gather
    matmul) reads one per *segment* of consecutive tokens that share an adapter: a prefill's
    hundreds of tokens become one tile-by-tile matmul with tl.dot.

Layout. The adapters live in S fixed slots, each zero-padded to the largest rank R, so one
tensor holds them all and a kernel finds slot s by an offset (no pointer arrays):

    x            (T, K)      the layer's input: one row per token of the step
    lora_a       (S, R, K)   every slot's A (PEFT's lora_A.weight is (r, K))
    lora_b       (S, N, R)   every slot's B (lora_B.weight is (N, r)), times the adapter's scale
    buf          (T, R)      shrink's output, fp32: each token's rank-R code
    y            (T, N)      the base layer's output; expand adds buf @ B^T into it
    token_slots  (T,)        BGMV: each token's slot, -1 for the base model (no LoRA)
    seg_start    (G + 1,)    SGMV: tokens seg_start[g] : seg_start[g + 1] use slot seg_slots[g]

Zero padding makes a rank-4 adapter in a rank-16 slot exact: the extra rows of A and columns
of B are zero. The cost is reading them: slots are sized for the largest rank (max_lora_rank).

Left out, compared with vLLM's punica kernels: the fused q/k/v (and gate/up) variants that
shrink once for several outputs, split-K for very wide inputs, LoRA on the embeddings and the
LM head, and the CUDA-graph-friendly fixed-size metadata.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _bgmv_shrink_kernel(
    X, A, Buf,                 # x: (T, K); A: (S, R, K); buf: (T, R) fp32
    token_slots,               # (T,) int64: slot of each token, -1 = no LoRA
    K, R,                      # input width, max rank
    stride_xt, stride_as, stride_ar, stride_bt,   # innermost strides are 1
    BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr,
):
    """One program per token: buf[t] = A[slot] @ x[t], a (R x K) matrix-vector product."""
    t = tl.program_id(0)
    slot = tl.load(token_slots + t)
    if slot < 0:                                           # base-model token: nothing to add
        return
    offs_r = tl.arange(0, BLOCK_R)
    acc = tl.zeros((BLOCK_R,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(X + t * stride_xt + offs_k, mask=offs_k < K, other=0.0)       # (BK,)
        a = tl.load(A + slot * stride_as + offs_r[:, None] * stride_ar + offs_k[None, :],
                    mask=(offs_r[:, None] < R) & (offs_k[None, :] < K), other=0.0)  # (BR, BK)
        acc += tl.sum(a.to(tl.float32) * x.to(tl.float32)[None, :], axis=1)
    tl.store(Buf + t * stride_bt + offs_r, acc, mask=offs_r < R)


@triton.jit
def _bgmv_expand_kernel(
    Buf, B, Y,                 # buf: (T, R) fp32; B: (S, N, R); y: (T, N), updated in place
    token_slots,               # (T,) int64
    N, R,                      # output width, max rank
    stride_bt, stride_bs, stride_bn, stride_yt,
    BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
):
    """One program per (token, BLOCK_N outputs): y[t, n] += B[slot, n, :] . buf[t]."""
    t, pid_n = tl.program_id(0), tl.program_id(1)
    slot = tl.load(token_slots + t)
    if slot < 0:
        return
    offs_r = tl.arange(0, BLOCK_R)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    v = tl.load(Buf + t * stride_bt + offs_r, mask=offs_r < R, other=0.0)          # (BR,)
    b = tl.load(B + slot * stride_bs + offs_n[:, None] * stride_bn + offs_r[None, :],
                mask=(offs_n[:, None] < N) & (offs_r[None, :] < R), other=0.0)      # (BN, BR)
    delta = tl.sum(b.to(tl.float32) * v[None, :], axis=1)                          # (BN,)
    y_ptr = Y + t * stride_yt + offs_n
    y = tl.load(y_ptr, mask=offs_n < N, other=0.0)
    tl.store(y_ptr, (y.to(tl.float32) + delta).to(y.dtype), mask=offs_n < N)


@triton.jit
def _sgmv_shrink_kernel(
    X, A, Buf,                 # as in BGMV
    seg_start, seg_slots,      # (G + 1,), (G,) int64: segment bounds and each one's slot
    K, R,
    stride_xt, stride_as, stride_ar, stride_bt,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr,
):
    """One program per (segment, BLOCK_M of its tokens): buf[rows] = x[rows] @ A[slot]^T."""
    g, pid_m = tl.program_id(0), tl.program_id(1)
    slot = tl.load(seg_slots + g)
    start, end = tl.load(seg_start + g), tl.load(seg_start + g + 1)
    if (slot < 0) | (start + pid_m * BLOCK_M >= end):   # base segment, or past its end
        return
    rows = start + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_r = tl.arange(0, BLOCK_R)
    acc = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(X + rows[:, None] * stride_xt + offs_k[None, :],
                    mask=(rows[:, None] < end) & (offs_k[None, :] < K), other=0.0)  # (BM, BK)
        a_t = tl.load(A + slot * stride_as + offs_r[None, :] * stride_ar + offs_k[:, None],
                      mask=(offs_r[None, :] < R) & (offs_k[:, None] < K), other=0.0)  # (BK, BR)
        acc += tl.dot(x, a_t.to(x.dtype))
    tl.store(Buf + rows[:, None] * stride_bt + offs_r[None, :], acc,
             mask=(rows[:, None] < end) & (offs_r[None, :] < R))


@triton.jit
def _sgmv_expand_kernel(
    Buf, B, Y,
    seg_start, seg_slots,
    N, R,
    stride_bt, stride_bs, stride_bn, stride_yt,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
):
    """One program per (segment, BLOCK_M tokens, BLOCK_N outputs): y += buf @ B[slot]^T."""
    g, pid_m, pid_n = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    slot = tl.load(seg_slots + g)
    start, end = tl.load(seg_start + g), tl.load(seg_start + g + 1)
    if (slot < 0) | (start + pid_m * BLOCK_M >= end):
        return
    rows = start + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_r = tl.arange(0, BLOCK_R)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    v = tl.load(Buf + rows[:, None] * stride_bt + offs_r[None, :],
                mask=(rows[:, None] < end) & (offs_r[None, :] < R), other=0.0)     # (BM, BR)
    b_t = tl.load(B + slot * stride_bs + offs_n[None, :] * stride_bn + offs_r[:, None],
                  mask=(offs_n[None, :] < N) & (offs_r[:, None] < R), other=0.0)   # (BR, BN)
    delta = tl.dot(v.to(b_t.dtype), b_t)                                           # (BM, BN)
    mask = (rows[:, None] < end) & (offs_n[None, :] < N)
    y_ptr = Y + rows[:, None] * stride_yt + offs_n[None, :]
    y = tl.load(y_ptr, mask=mask, other=0.0)
    tl.store(y_ptr, (y.to(tl.float32) + delta).to(y.dtype), mask=mask)


def _block_r(R: int) -> int:
    return max(16, triton.next_power_of_2(R))      # tl.dot wants every dimension >= 16


def bgmv_shrink(x: torch.Tensor, lora_a: torch.Tensor, token_slots: torch.Tensor) -> torch.Tensor:
    """x (T, K), lora_a (S, R, K), token_slots (T,) -> buf (T, R) fp32 (zeros for slot -1)."""
    T, K = x.shape
    R = lora_a.shape[1]
    buf = torch.zeros(T, R, dtype=torch.float32, device=x.device)
    _bgmv_shrink_kernel[(T,)](x, lora_a, buf, token_slots, K, R, x.stride(0), lora_a.stride(0),
                              lora_a.stride(1), buf.stride(0), BLOCK_K=64, BLOCK_R=_block_r(R))
    return buf


def bgmv_expand(y: torch.Tensor, buf: torch.Tensor, lora_b: torch.Tensor,
                token_slots: torch.Tensor) -> torch.Tensor:
    """y (T, N) += buf (T, R) @ lora_b[slot]^T per token, in place; returns y."""
    T, N = y.shape
    R = lora_b.shape[2]
    grid = (T, triton.cdiv(N, 64))
    _bgmv_expand_kernel[grid](buf, lora_b, y, token_slots, N, R, buf.stride(0),
                              lora_b.stride(0), lora_b.stride(1), y.stride(0),
                              BLOCK_N=64, BLOCK_R=_block_r(R))
    return y


def segments(token_slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Runs of equal slot in token_slots -> (seg_start (G + 1,), seg_slots (G,), longest run)."""
    slots, counts = torch.unique_consecutive(token_slots, return_counts=True)
    seg_start = torch.zeros(len(counts) + 1, dtype=torch.int64, device=token_slots.device)
    seg_start[1:] = counts.cumsum(0)
    return seg_start, slots.to(torch.int64), int(counts.max())


def sgmv_shrink(x: torch.Tensor, lora_a: torch.Tensor, seg_start: torch.Tensor,
                seg_slots: torch.Tensor, max_seg_len: int, block_m: int = 16) -> torch.Tensor:
    """The segmented shrink: same result as bgmv_shrink for the tokens' slots."""
    T, K = x.shape
    R = lora_a.shape[1]
    buf = torch.zeros(T, R, dtype=torch.float32, device=x.device)
    grid = (len(seg_slots), triton.cdiv(max_seg_len, block_m))
    _sgmv_shrink_kernel[grid](x, lora_a, buf, seg_start, seg_slots, K, R, x.stride(0),
                              lora_a.stride(0), lora_a.stride(1), buf.stride(0),
                              BLOCK_M=block_m, BLOCK_K=64, BLOCK_R=_block_r(R))
    return buf


def sgmv_expand(y: torch.Tensor, buf: torch.Tensor, lora_b: torch.Tensor, seg_start: torch.Tensor,
                seg_slots: torch.Tensor, max_seg_len: int, block_m: int = 16) -> torch.Tensor:
    """The segmented expand: y[rows of segment g] += buf[rows] @ lora_b[seg_slots[g]]^T."""
    T, N = y.shape
    R = lora_b.shape[2]
    grid = (len(seg_slots), triton.cdiv(max_seg_len, block_m), triton.cdiv(N, 64))
    _sgmv_expand_kernel[grid](buf, lora_b, y, seg_start, seg_slots, N, R, buf.stride(0),
                              lora_b.stride(0), lora_b.stride(1), y.stride(0),
                              BLOCK_M=block_m, BLOCK_N=64, BLOCK_R=_block_r(R))
    return y


def slot_groups(token_slots: torch.Tensor) -> list[tuple[int, torch.Tensor | None]]:
    """[(slot, row indices of its tokens)] for every slot >= 0 in the batch; rows is None when
    one adapter has every token (then no gather or scatter is needed)."""
    slots = token_slots.unique().tolist()
    if len(slots) == 1:
        return [(slots[0], None)] if slots[0] >= 0 else []
    return [(s, (token_slots == s).nonzero().squeeze(1)) for s in slots if s >= 0]


def lora_shrink_ref(x, lora_a, token_slots, groups=None) -> torch.Tensor:
    """The torch reference (and the engine's CPU path): one matmul per adapter in the batch."""
    buf = torch.zeros(x.shape[0], lora_a.shape[1], dtype=torch.float32, device=x.device)
    for slot, rows in groups if groups is not None else slot_groups(token_slots):
        if rows is None:
            buf = (x @ lora_a[slot].T).float()                              # (T, R)
        else:
            buf[rows] = (x[rows] @ lora_a[slot].T).float()                  # (t_s, R)
    return buf


def lora_expand_ref(y, buf, lora_b, token_slots, groups=None) -> torch.Tensor:
    for slot, rows in groups if groups is not None else slot_groups(token_slots):
        if rows is None:
            y.addmm_(buf.to(y.dtype), lora_b[slot].T.to(y.dtype))           # (T, N)
        else:
            y.index_add_(0, rows, (buf[rows].to(lora_b.dtype) @ lora_b[slot].T).to(y.dtype))
    return y
