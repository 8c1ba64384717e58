"""Write this step's K and V into their slots of the paged cache: one Triton program per token.

What you will learn:
  * the simplest Triton kernel shape: one program per row, a 2-D tile of offsets, a masked
    load and a masked store;
  * what `slot_mapping` means on the device: token t's K/V row goes to the flat slot
    slot_mapping[t] = block * block_size + offset, wherever that block is in the pool.

The cache layout is the engine's (minivllm/kv_cache.py): [num_blocks, block_size, num_kv_heads,
head_dim], so one slot holds num_kv_heads x head_dim contiguous elements and a token's write is a
single contiguous copy. Every step of every layer runs this once before attention reads the
cache back (PagedAttention, Kwon et al. 2023; vLLM calls it `reshape_and_cache`).

Left out: KV quantization (fp8/int8 scales, lesson 13) and the "flash" layout that splits K
and V across different strides. A slot of -1 means "padding, write nothing", as in vLLM.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _write_kv_kernel(
    K, V,                     # this step's keys and values, [num_tokens, num_kv_heads, head_dim]
    K_cache, V_cache,         # the layer's pool, [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping,             # [num_tokens] int64: flat slot of each token, -1 = skip
    stride_kt, stride_kh,     # K: token and head strides (head_dim is contiguous)
    stride_vt, stride_vh,
    stride_cs, stride_ch,     # caches: slot and head strides (same layout for K and V)
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,    # NUM_KV_HEADS rounded up to a power of two (tl.arange needs one)
    BLOCK_D: tl.constexpr,    # HEAD_DIM rounded up to a power of two
):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping + token)
    if slot < 0:              # a padded token (e.g. a CUDA-graph batch rounded up): no write
        return
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_h[:, None] < NUM_KV_HEADS) & (offs_d[None, :] < HEAD_DIM)  # (BLOCK_H, BLOCK_D)

    k = tl.load(K + token * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :], mask=mask)
    v = tl.load(V + token * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :], mask=mask)
    # The slot index is int64: slot * stride can pass 2^31 elements in a large pool.
    dst = slot * stride_cs + offs_h[:, None] * stride_ch + offs_d[None, :]
    tl.store(K_cache + dst, k, mask=mask)
    tl.store(V_cache + dst, v, mask=mask)


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Scatter k, v ([num_tokens, kv_heads, head_dim]) into k_cache / v_cache at slot_mapping."""
    num_tokens, num_kv_heads, head_dim = k.shape
    assert k.stride(-1) == v.stride(-1) == 1 and k_cache.is_contiguous() and v_cache.is_contiguous()
    assert k_cache.shape[2:] == (num_kv_heads, head_dim), (k_cache.shape, k.shape)
    if num_tokens == 0:
        return
    _write_kv_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(1), k_cache.stride(2),
        NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
        BLOCK_H=triton.next_power_of_2(num_kv_heads), BLOCK_D=triton.next_power_of_2(head_dim),
    )


def write_kv_reference(k, v, k_cache, v_cache, slot_mapping) -> None:
    """The torch reference: the engine's own write (index_copy_ into the flattened pool),
    plus vLLM's "-1 means skip" rule."""
    keep = slot_mapping >= 0
    num_kv_heads, head_dim = k.shape[1:]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping[keep], k[keep])
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping[keep], v[keep])


# ------------------------------------------------------------------------------ test + benchmark
def test_write_kv(device="cpu", dtype=torch.float32):
    """Random tokens into random, shuffled slots (one of them padding) match the reference."""
    torch.manual_seed(0)
    num_blocks, block_size, kv_heads, head_dim, num_tokens = 6, 16, 3, 64, 21
    k = torch.randn(num_tokens, kv_heads, head_dim, device=device, dtype=dtype)
    v = torch.randn_like(k)
    slots = torch.randperm(num_blocks * block_size, device=device)[:num_tokens]
    slots[5] = -1
    caches = [torch.zeros(num_blocks, block_size, kv_heads, head_dim, device=device, dtype=dtype)
              for _ in range(4)]
    write_kv(k, v, caches[0], caches[1], slots)
    write_kv_reference(k, v, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])


def bench(num_tokens=8192, kv_heads=8, head_dim=128, dtype=torch.bfloat16) -> dict:
    """GB/s of the write on the GPU: it reads and writes 2 x num_tokens x kv_heads x head_dim
    elements, so it should run close to the HBM bandwidth."""
    from triton.testing import do_bench
    k = torch.randn(num_tokens, kv_heads, head_dim, device="cuda", dtype=dtype)
    v = torch.randn_like(k)
    num_blocks = num_tokens // 16 * 2
    k_cache = torch.zeros(num_blocks, 16, kv_heads, head_dim, device="cuda", dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    slots = torch.randperm(num_blocks * 16, device="cuda")[:num_tokens]
    ms = do_bench(lambda: write_kv(k, v, k_cache, v_cache, slots))
    moved = 2 * 2 * k.numel() * k.element_size()          # K and V, read once, written once
    return {"tokens": num_tokens, "ms": ms, "GB/s": moved / ms / 1e6}


if __name__ == "__main__":   # python -m kernels.write_kv
    if torch.cuda.is_available():
        test_write_kv("cuda", torch.bfloat16)
        print(bench())
    else:
        test_write_kv()
        print("write_kv matches the reference (interpreter)")
