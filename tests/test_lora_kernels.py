"""kernels/lora.py: BGMV and SGMV shrink/expand under Triton (the interpreter on a CPU) against
the torch reference, on a flat batch that mixes adapters, ranks and base-model tokens."""

import minivllm.platforms  # noqa: F401, I001  (TRITON_INTERPRET before kernels/ defines its kernels)

import pytest
import torch

from conftest import gpu

from kernels.lora import (bgmv_expand, bgmv_shrink, lora_expand_ref, lora_shrink_ref, segments,
                          sgmv_expand, sgmv_shrink)


def make(dtype, T=7, K=40, N=24, S=3, R=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, K, generator=g).to(dtype)
    a = torch.randn(S, R, K, generator=g).to(dtype)
    b = torch.randn(S, N, R, generator=g).to(dtype)
    a[1, 4:] = 0                                  # slot 1 holds a rank-4 adapter, zero-padded
    b[1, :, 4:] = 0
    y = torch.randn(T, N, generator=g).to(dtype)
    return x, a, b, y


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_bgmv_matches_reference(dtype):
    x, a, b, y = make(dtype)
    slots = torch.tensor([2, -1, 0, 2, 1, -1, 0])          # interleaved, as in decode
    buf = bgmv_shrink(x, a, slots)
    ref_buf = lora_shrink_ref(x.float(), a.float(), slots)
    torch.testing.assert_close(buf, ref_buf, rtol=1e-3, atol=1e-3)
    assert buf[1].abs().sum() == 0 and buf[5].abs().sum() == 0     # base tokens: no LoRA
    out = bgmv_expand(y.clone(), buf, b, slots)
    ref = lora_expand_ref(y.float().clone(), ref_buf, b.float(), slots)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), ref, rtol=tol, atol=tol * 10)
    torch.testing.assert_close(out[1], y[1])                        # base rows untouched
    assert (out.float() - y.float()).abs()[[0, 2, 3, 4, 6]].min(dim=1).values.gt(0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_sgmv_matches_reference(dtype):
    x, a, b, y = make(dtype, T=37)
    # Segments as a step lays them out: a 20-token prefill (crosses BLOCK_M = 16), a base
    # sequence, two decodes of one adapter, a prefill of another.
    slots = torch.tensor([1] * 20 + [-1] * 5 + [0, 0] + [2] * 10)
    seg_start, seg_slots, longest = segments(slots)
    assert seg_start.tolist() == [0, 20, 25, 27, 37] and seg_slots.tolist() == [1, -1, 0, 2]
    buf = sgmv_shrink(x, a, seg_start, seg_slots, longest)
    ref_buf = lora_shrink_ref(x.float(), a.float(), slots)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(buf, ref_buf, rtol=tol, atol=tol * 10)
    out = sgmv_expand(y.clone(), buf, b, seg_start, seg_slots, longest)
    ref = lora_expand_ref(y.float().clone(), ref_buf, b.float(), slots)
    torch.testing.assert_close(out.float(), ref, rtol=tol, atol=tol * 100)
    torch.testing.assert_close(out[20:25], y[20:25])               # the base segment


def test_reference_is_the_merged_weight():
    """y + s (x A^T) B^T per token equals x (W + s B A)^T: the adapter, merged, row by row."""
    x, a, b, _ = make(torch.float64, S=2)
    w = torch.randn(24, 40, dtype=torch.float64)
    slots = torch.tensor([0, 1, 1, 0, -1, 1, 0])
    out = lora_expand_ref(x @ w.T, lora_shrink_ref(x, a, slots).double(), b, slots)
    for t, s in enumerate(slots.tolist()):
        merged = w + (b[s] @ a[s] if s >= 0 else 0)
        torch.testing.assert_close(out[t], merged @ x[t], rtol=1e-5, atol=1e-5)   # fp32 buf


@gpu
def test_kernels_on_cuda_bf16_and_the_engine_path():
    """On a GPU: bf16 BGMV and SGMV (real tl.dot on tensor cores) against the fp32 reference,
    at SmolLM2's q_proj and down_proj widths, with slots of rank 16."""
    for K, N in ((576, 576), (1536, 576)):
        x, a, b, y = (t.cuda() for t in make(torch.bfloat16, T=300, K=K, N=N, S=4, R=16))
        slots = torch.tensor([0] * 200 + [-1] * 40 + [3] * 50 + [1, 2] * 5).cuda()
        ref = lora_expand_ref(y.float().clone(), lora_shrink_ref(x.float(), a.float(), slots),
                              b.float(), slots)
        scale = ref.abs().max().item()
        out = bgmv_expand(y.clone(), bgmv_shrink(x, a, slots), b, slots)
        torch.testing.assert_close(out.float(), ref, rtol=0, atol=2e-2 * scale)
        seg = segments(slots)
        out = sgmv_expand(y.clone(), sgmv_shrink(x, a, *seg), b, *seg)
        torch.testing.assert_close(out.float(), ref, rtol=0, atol=2e-2 * scale)
