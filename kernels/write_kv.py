"""Write this step's K and V into their slots of the paged cache: one Triton program per token.

What you will learn:
  * the simplest Triton kernel shape: one program per row, a 2-D tile of offsets, a masked
    load and a masked store;
  * what `slot_mapping` means on the device: token t's K/V row goes to the flat slot
    slot_mapping[t] = block * block_size + offset, wherever that block is in the pool.

The cache layout is the engine's (minivllm/core/kv_cache.py): [num_blocks, block_size, num_kv_heads,
head_dim], so one slot holds num_kv_heads x head_dim contiguous elements and a token's write is a
single contiguous copy. Every step of every layer runs this once before attention reads the
cache back (PagedAttention, Kwon et al. 2023; vLLM calls it `reshape_and_cache`).

Quantized caches (lesson 13): with kv_cache="int8" or "fp8" the pool is int8 storage and each
(slot, head) row holds head_dim one-byte values followed by the 4 bytes of its fp32 scale,

    row = [q_0 .. q_{D-1} | scale]      x ~ q * scale,  scale = max|x_row| / 127 (int8)
                                                        or  / 448 (fp8 e4m3's largest normal)

so a row is D + 4 bytes instead of 2D (bf16) or 4D (fp32), and every block copy (copy-on-write,
swap) carries the scales along. The scale is set per token and head when the row is written:
no calibration pass. (vLLM keeps per-tensor k_scale / v_scale from the checkpoint instead.)
`quantize_kv` / `dequantize_kv` are the torch definition of the row; the kernel below, the
attention kernels and minivllm/attention/torch_attention.py all follow it.

Left out: the "flash" layout that splits K and V across different strides. A slot of -1 means
"padding, write nothing", as in vLLM.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


KV_QUANT_FORMATS = {"int8": (torch.int8, 127.0), "fp8": (torch.float8_e4m3fn, 448.0)}


def quantize_kv(x: torch.Tensor, kv_cache_dtype: str) -> torch.Tensor:
    """x (..., D) float -> (..., D + 4) int8 rows: D quantized values, then the fp32 scale."""
    fmt, qmax = KV_QUANT_FORMATS[kv_cache_dtype]
    scale = x.float().abs().amax(-1, keepdim=True).clamp(min=1e-8) / qmax     # (..., 1)
    y = x.float() / scale
    q = (y.round().clamp(-qmax, qmax).to(torch.int8) if fmt == torch.int8
         else y.to(fmt).view(torch.int8))
    return torch.cat([q, scale.view(torch.int8)], dim=-1)


def dequantize_kv(rows: torch.Tensor, kv_cache_dtype: str, dtype=torch.float32) -> torch.Tensor:
    """(..., D + 4) int8 rows -> (..., D) in dtype."""
    fmt, _ = KV_QUANT_FORMATS[kv_cache_dtype]
    d = rows.shape[-1] - 4
    scale = rows[..., d:].contiguous().view(torch.float32)                    # (..., 1)
    return (rows[..., :d].view(fmt).float() * scale).to(dtype)


@triton.jit
def _store_quantized(cache, scales, x, dst, mask, scale_at, h_ok, KV_QUANT: tl.constexpr,
                     QMAX: tl.constexpr):
    """x (BLOCK_H, BLOCK_D): one row per head -> its bytes at dst, its scale at scale_at."""
    x = x.to(tl.float32)
    s = tl.maximum(tl.max(tl.abs(x), 1), 1e-8) / QMAX                            # (BLOCK_H,)
    y = x / s[:, None]
    if KV_QUANT == 1:         # round half away from zero (the int8 cast alone truncates)
        y = tl.where(y >= 0, tl.floor(y + 0.5), tl.ceil(y - 0.5))
        tl.store(cache + dst, tl.minimum(tl.maximum(y, -QMAX), QMAX).to(tl.int8), mask=mask)
    else:                     # fp8 e4m3: round to its grid in fp32 first (3 mantissa bits; a
        # fixed step of 2^-9 below 2^-6), so the cast is exact. The interpreter's own rounding
        # drops the carry when the mantissa rounds up (124.3 -> 64 instead of 128).
        step = tl.exp2(tl.maximum(tl.floor(tl.log2(tl.abs(y) + 1e-30)), -6.0) - 3.0)
        y = tl.floor(y / step + 0.5) * step
        tl.store(cache + dst, y.to(tl.float8e4nv), mask=mask)
    tl.store(scales + scale_at, s, mask=h_ok)


@triton.jit
def _write_kv_kernel(
    K, V,                     # this step's keys and values, [num_tokens, num_kv_heads, head_dim]
    K_cache, V_cache,         # the layer's pool, [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping,             # [num_tokens] int64: flat slot of each token, -1 = skip
    stride_kt, stride_kh,     # K: token and head strides (head_dim is contiguous)
    stride_vt, stride_vh,
    stride_cs, stride_ch,     # caches: slot and head strides (same layout for K and V)
    K_scale, V_scale,         # quantized pools: the same bytes as fp32 (scale of row r at
                              # r * (D + 4) / 4 + D / 4); unused otherwise
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,    # NUM_KV_HEADS rounded up to a power of two (tl.arange needs one)
    BLOCK_D: tl.constexpr,    # HEAD_DIM rounded up to a power of two
    KV_QUANT: tl.constexpr,   # 0: store as is; 1: int8 rows + scale; 2: fp8 e4m3 rows + scale
    QMAX: tl.constexpr,       # 127 (int8) or 448 (fp8 e4m3's largest value)
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
    if KV_QUANT == 0:
        tl.store(K_cache + dst, k, mask=mask)
        tl.store(V_cache + dst, v, mask=mask)
    else:                     # one scale per (token, head) row, then one byte per element
        scale_at = (slot * stride_cs + offs_h * stride_ch + HEAD_DIM) // 4          # (BLOCK_H,)
        h_ok = offs_h < NUM_KV_HEADS
        _store_quantized(K_cache, K_scale, k, dst, mask, scale_at, h_ok, KV_QUANT, QMAX)
        _store_quantized(V_cache, V_scale, v, dst, mask, scale_at, h_ok, KV_QUANT, QMAX)


def kv_cache_views(cache: torch.Tensor, kv_cache_dtype: str):
    """A quantized pool as the kernels read it: (values, scales) views of the same bytes,
    values typed int8 or fp8, scales fp32. An unquantized pool has no scales (None: Triton
    then compiles the kernels without that argument, so it costs no register)."""
    if kv_cache_dtype == "auto":
        return cache, None
    assert cache.dtype == torch.int8 and cache.shape[-1] % 4 == 0, (cache.dtype, cache.shape)
    return cache.view(KV_QUANT_FORMATS[kv_cache_dtype][0]), cache.view(torch.float32)


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor, kv_cache_dtype: str = "auto") -> None:
    """Scatter k, v ([num_tokens, kv_heads, head_dim]) into k_cache / v_cache at slot_mapping,
    quantizing each row on the way when kv_cache_dtype is "int8" or "fp8"."""
    num_tokens, num_kv_heads, head_dim = k.shape
    assert k.stride(-1) == v.stride(-1) == 1 and k_cache.is_contiguous() and v_cache.is_contiguous()
    row = head_dim if kv_cache_dtype == "auto" else head_dim + 4
    assert k_cache.shape[2:] == (num_kv_heads, row), (k_cache.shape, k.shape)
    if num_tokens == 0:
        return
    (kc, ks), (vc, vs) = kv_cache_views(k_cache, kv_cache_dtype), kv_cache_views(v_cache,
                                                                                 kv_cache_dtype)
    _write_kv_kernel[(num_tokens,)](
        k, v, kc, vc, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(1), k_cache.stride(2), ks, vs,
        NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
        BLOCK_H=triton.next_power_of_2(num_kv_heads), BLOCK_D=triton.next_power_of_2(head_dim),
        KV_QUANT=("auto", "int8", "fp8").index(kv_cache_dtype),
        QMAX=KV_QUANT_FORMATS.get(kv_cache_dtype, (None, 1.0))[1],
    )


def write_kv_reference(k, v, k_cache, v_cache, slot_mapping, kv_cache_dtype="auto") -> None:
    """The torch reference: the engine's own write (index_copy_ into the flattened pool),
    plus vLLM's "-1 means skip" rule."""
    keep = slot_mapping >= 0
    if kv_cache_dtype != "auto":
        k, v = quantize_kv(k, kv_cache_dtype), quantize_kv(v, kv_cache_dtype)
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


def test_write_kv_quantized(kv_cache_dtype="int8", device="cpu", dtype=torch.float32):
    """Quantized rows from the kernel dequantize to what the torch definition gives, and
    within the format's error bound of the float input (half a step of the row's scale for
    int8; fp8 e4m3 keeps 3 mantissa bits: 1/16 relative, plus the scale's share)."""
    torch.manual_seed(0)
    num_blocks, block_size, kv_heads, head_dim, num_tokens = 4, 8, 3, 64, 13
    k = torch.randn(num_tokens, kv_heads, head_dim, device=device, dtype=dtype) * 3
    v = torch.randn_like(k)
    slots = torch.randperm(num_blocks * block_size, device=device)[:num_tokens]
    caches = [torch.zeros(num_blocks, block_size, kv_heads, head_dim + 4, device=device,
                          dtype=torch.int8) for _ in range(4)]
    write_kv(k, v, caches[0], caches[1], slots, kv_cache_dtype)
    write_kv_reference(k, v, caches[2], caches[3], slots, kv_cache_dtype)
    for ours, ref, x in ((caches[0], caches[2], k), (caches[1], caches[3], v)):
        got = dequantize_kv(ours.flatten(0, 1)[slots], kv_cache_dtype)
        want = dequantize_kv(ref.flatten(0, 1)[slots], kv_cache_dtype)
        step = x.float().abs().amax(-1, keepdim=True) / KV_QUANT_FORMATS[kv_cache_dtype][1]
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
        bound = 0.5 * step if kv_cache_dtype == "int8" else x.float().abs() / 16 + step
        assert ((got - x.float()).abs() <= bound * 1.0001).all()


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
        test_write_kv_quantized("int8")
        test_write_kv_quantized("fp8")
        print("write_kv matches the reference (interpreter)")
