"""Weight-only quantized matmul: y = x @ dequant(W).T, dequantizing each weight tile as it loads.

What you will learn:
  * why weight-only quantization speeds up decode: at batch 1 a linear layer reads N x K
    weights to do 2 x N x K FLOPs, so the time is the bytes; int8 reads 1/2 of bf16's, int4 1/4;
  * how to keep that saving inside the kernel: the weights travel from memory as int8 / packed
    int4 and become floats only in registers, one (BLOCK_N, BLOCK_K) tile at a time, never as a
    dequantized matrix in memory (that would read and write the float weights again);
  * the two formats' arithmetic: int8 scales by output channel, so the scale multiplies the
    finished dot product once; int4 scales and shifts by group along K, so each tile applies
    its group's (scale, min) before the dot.

Formats (defined here, in torch, by quantize_int8 / quantize_int4; minivllm/quantization/weight_only.py uses them):
    int8          qweight (N, K) int8, scales (N,):      W = q * s[n]
    int4, group G qweight (N, K/2) uint8, two per byte (column 2j low nibble, 2j + 1 high),
                  scales, mins (N, K/G):                 W = q * d[n, k // G] + m[n, k // G]

Grid: (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N)); each program walks K in BLOCK_K steps.

Left out: split-K for batch-1 shapes (the GPU is under-filled when M is 1 and N small),
Marlin-style weight reordering for coalesced int4 loads, fp8 weights and activation
quantization. On a CPU the engine uses torch's own int8/int4 kernels instead (quant.py); this
kernel runs there only under the interpreter, in the tests.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w (N, K) -> q (N, K) int8, scales (N,): one scale per output channel (row)."""
    scales = w.abs().amax(dim=1).float().clamp(min=1e-8) / 127
    q = torch.round(w.float() / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scales


def quantize_int4(w: torch.Tensor, group_size: int):
    """w (N, K) -> packed (N, K/2) uint8, scales (N, K/G), mins (N, K/G): w ~ q * d + m.

    Asymmetric: each group of G weights maps its own [min, max] onto the 16 levels 0..15.
    Two 4-bit values per byte, column 2j in the low nibble and 2j + 1 in the high one."""
    N, K = w.shape
    if K % group_size:
        raise ValueError(f"int4 group size {group_size} does not divide the input dimension {K}")
    g = w.float().reshape(N, K // group_size, group_size)
    lo, hi = g.amin(-1), g.amax(-1)                                   # (N, K/G)
    scales = (hi - lo).clamp(min=1e-8) / 15
    q = torch.round((g - lo[..., None]) / scales[..., None]).clamp(0, 15).to(torch.uint8)
    q = q.reshape(N, K)
    return q[:, 0::2] | (q[:, 1::2] << 4), scales, lo


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """(N, K/2) uint8 -> (N, K) uint8 in 0..15."""
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2)


def dequantize_int8(q, scales) -> torch.Tensor:
    return q.float() * scales[:, None]


def dequantize_int4(packed, scales, mins, group_size: int) -> torch.Tensor:
    q = unpack_int4(packed).float()                                   # (N, K)
    N, K = q.shape
    g = q.reshape(N, K // group_size, group_size)
    return (g * scales[..., None] + mins[..., None]).reshape(N, K)


@triton.jit
def _quant_matmul_kernel(
    X,                        # [M, K] activations (fp32 / fp16 / bf16)
    W,                        # int8 [N, K], or uint8 [N, K/2] for int4
    Scales, Mins,             # int8: [N]; int4: [N, K/G] each (Mins unused for int8)
    Y,                        # [M, N] output, X's dtype
    M, N, K,
    stride_xm, stride_wn, stride_sn, stride_ym,   # row strides (columns are contiguous)
    INT4: tl.constexpr,       # False: int8 per channel; True: packed int4 in groups
    GROUP: tl.constexpr,      # int4 group size along K (divides K, multiple of BLOCK_K)
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok, n_ok = offs_m < M, offs_n < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_ok = offs_k < K
        x = tl.load(X + offs_m[:, None] * stride_xm + offs_k[None, :],
                    mask=m_ok[:, None] & k_ok[None, :], other=0.0)          # (BM, BK)
        w_mask = n_ok[:, None] & k_ok[None, :]
        if INT4:
            # Column k sits in byte k // 2, low nibble if k is even: each byte is loaded for
            # two columns (the second load hits the cache) and shifted to its nibble.
            byte = tl.load(W + offs_n[:, None] * stride_wn + (offs_k // 2)[None, :],
                           mask=w_mask, other=0)                           # (BN, BK) uint8
            q = (byte >> ((offs_k % 2) * 4)[None, :].to(tl.uint8)) & 0xF
            g = k0 // GROUP                   # a BLOCK_K tile lies inside one group
            d = tl.load(Scales + offs_n * stride_sn + g, mask=n_ok, other=0.0)   # (BN,)
            mn = tl.load(Mins + offs_n * stride_sn + g, mask=n_ok, other=0.0)
            w = q.to(tl.float32) * d[:, None] + mn[:, None]                 # (BN, BK)
        else:
            w = tl.load(W + offs_n[:, None] * stride_wn + offs_k[None, :], mask=w_mask,
                        other=0).to(tl.float32)                            # (BN, BK), q only
        acc += tl.dot(x.to(tl.float32), tl.trans(w))                        # (BM, BN)
    if not INT4:                             # per-channel scale: once, after the whole dot
        s = tl.load(Scales + offs_n, mask=n_ok, other=0.0)
        acc = acc * s[None, :]
    tl.store(Y + offs_m[:, None] * stride_ym + offs_n[None, :], acc.to(Y.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])


def quant_matmul(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                 mins: torch.Tensor | None = None, group_size: int = 0,
                 block_m: int = 16, block_n: int = 64, block_k: int = 32) -> torch.Tensor:
    """x (M, K) @ dequant(W).T -> (M, N). int4 when mins is given (group_size > 0)."""
    M, K = x.shape
    int4 = mins is not None
    N = qweight.shape[0]
    assert qweight.shape[1] == (K // 2 if int4 else K), (qweight.shape, x.shape)
    if int4:
        block_k = min(block_k, group_size)
        assert group_size % block_k == 0 and K % group_size == 0
    x = x.contiguous()
    y = torch.empty(M, N, device=x.device, dtype=x.dtype)
    grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n))
    _quant_matmul_kernel[grid](
        x, qweight, scales, mins if int4 else scales, y, M, N, K,
        x.stride(0), qweight.stride(0), scales.stride(0), y.stride(0),
        INT4=int4, GROUP=max(group_size, 1), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)
    return y


def quant_matmul_reference(x, qweight, scales, mins=None, group_size: int = 0) -> torch.Tensor:
    """The slow, obvious way: dequantize the whole matrix, then one float matmul."""
    w = (dequantize_int8(qweight, scales) if mins is None
         else dequantize_int4(qweight, scales, mins, group_size))
    return (x.float() @ w.T).to(x.dtype)


# ------------------------------------------------------------------------------ test + benchmark
def _random_weights(N, K, group_size, device):
    g = torch.Generator().manual_seed(0)
    if group_size == 0:
        q = torch.randint(-127, 128, (N, K), generator=g, dtype=torch.int8)
        return q.to(device), (torch.rand(N, generator=g) * 0.01).to(device), None
    packed = torch.randint(0, 256, (N, K // 2), generator=g, dtype=torch.uint8)
    scales = torch.rand(N, K // group_size, generator=g) * 0.02
    mins = -torch.rand(N, K // group_size, generator=g) * 0.15
    return packed.to(device), scales.to(device), mins.to(device)


def test_quant_matmul(device="cpu", dtype=torch.float32, M=3, N=80, K=128, group_size=0):
    """Random int8 / int4 weights and a ragged (M, N) against the dequantize-then-matmul
    reference; fp32 exact up to summation order."""
    qweight, scales, mins = _random_weights(N, K, group_size, device)
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(1)).to(device, dtype)
    out = quant_matmul(x, qweight, scales, mins, group_size)
    ref = quant_matmul_reference(x, qweight, scales, mins, group_size)
    tol = 1e-4 if dtype == torch.float32 and device == "cpu" else 2e-2
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)


def bench(M=1, N=4096, K=4096, dtype=torch.bfloat16) -> dict:
    """GB/s of weight traffic on the GPU for bf16, int8 and int4-g128 at batch M."""
    from triton.testing import do_bench
    x = torch.randn(M, K, device="cuda", dtype=dtype)
    w = torch.randn(N, K, device="cuda", dtype=dtype)
    res = {"bf16": w.numel() * 2 / do_bench(lambda: x @ w.T) / 1e6}
    for name, g in (("int8", 0), ("int4-g128", 128)):
        qw, s, mn = _random_weights(N, K, g, "cuda")
        ms = do_bench(lambda: quant_matmul(x, qw, s, mn, g))
        res[name] = qw.numel() * qw.element_size() / ms / 1e6
    return {"M": M, "N": N, "K": K, "GB/s": res}


if __name__ == "__main__":   # python -m kernels.quant_matmul (CPU: TRITON_INTERPRET=1 first)
    if torch.cuda.is_available():
        for g in (0, 32, 128):
            test_quant_matmul("cuda", torch.bfloat16, group_size=g)
        print(bench())
    else:
        for g in (0, 32, 64):
            test_quant_matmul(group_size=g)
        print("quant_matmul matches the reference (interpreter)")
