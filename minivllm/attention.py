"""Attention over a block-addressed KV cache: the torch reference backend.

Every token's K and V live in a pool of fixed-size blocks, one pool per layer:

    k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim]

A sequence's `block_table` lists its blocks in order, so token j of that sequence sits in block
block_table[j // block_size], at offset j % block_size. Its *slot* is the flat index
block * block_size + offset. One step of the model does two things per layer:

  1. write the K/V of this step's new tokens into their slots (`slot_mapping`), then
  2. let each new token attend to every earlier token of its own sequence, wherever its blocks
     are (`block_tables`), causally.

The batch is flat: the new tokens of all sequences are concatenated ([num_tokens, ...]), and
`query_start_loc` marks where each sequence's tokens begin, as FlashAttention's varlen API and
vLLM do. A sequence may bring one token (decode), its whole prompt (prefill), or a chunk of it
over K/V already cached (chunked prefill, prefix-cache hits): the same code handles all three.

This file is the reference: clear and obvious. It gathers each sequence's K/V into a padded
rectangle and calls torch's scaled_dot_product_attention with a mask. The Triton kernels in
kernels/ compute the same thing without the gather and are checked against this, and so is the
torch backend's fast path (kernels/cpu_attention.py: no padding to the longest sequence).
A contiguous, per-request cache (lesson 01's baseline) is the special case block_size =
max_model_len with one block per sequence, so it runs through the same code. A quantized pool
(kv_cache_dtype "int8" / "fp8", lesson 13) stores rows of head_dim bytes plus an fp32 scale:
new rows are quantized before the write, gathered rows dequantized before SDPA.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernels.cpu_attention import VarlenLayout, varlen_attention


@dataclass(slots=True)
class AttentionMetadata:
    """Where this step's tokens go and what they may see. Built by the ModelRunner each step."""

    slot_mapping: torch.Tensor      # [num_tokens] int64: cache slot of each new token
    query_start_loc: torch.Tensor   # [num_seqs + 1] int64: cumulative new-token counts
    seq_lens: torch.Tensor          # [num_seqs] int64: tokens in the cache after this step
    block_tables: torch.Tensor      # [num_seqs, max_blocks] int64, padded with 0
    max_query_len: int
    max_seq_len: int
    # The torch backend's gather indices depend on the batch, not on the layer: the first layer
    # builds them, the other layers of the step reuse them.
    torch_layout: TorchBatchLayout | None = None
    varlen_layout: VarlenLayout | None = None   # the fast path's (kernels/cpu_attention.py)
    # The Triton backend's decode partials: the ModelRunner's, allocated once per engine.
    decode_scratch: object | None = None    # kernels.paged_attention.DecodeScratch


@dataclass(slots=True)
class TorchBatchLayout:
    """How the flat batch maps onto the padded rectangles that SDPA takes."""

    block_size: int
    slots: torch.Tensor     # (B, L) pool slot of each sequence's key positions 0..L-1
    seq_idx: torch.Tensor   # (T,) the sequence each new token belongs to
    row_idx: torch.Tensor   # (T,) its row among that sequence's new tokens
    mask: torch.Tensor      # (B, 1, Lq, L) what each query may see: causal, no padding

    @classmethod
    def build(cls, md: AttentionMetadata, block_size: int) -> TorchBatchLayout:
        num_seqs, device = md.seq_lens.shape[0], md.seq_lens.device
        # Key position j of sequence b lives in block block_tables[b, j // block_size].
        pos = torch.arange(md.max_seq_len, device=device)                  # (L,)
        blocks = md.block_tables.gather(1, (pos // block_size).expand(num_seqs, -1))
        slots = blocks * block_size + pos % block_size                     # (B, L)
        # New token t is row row_idx[t] of sequence seq_idx[t].
        q_lens = md.query_start_loc[1:] - md.query_start_loc[:-1]          # (B,)
        seq_idx = torch.repeat_interleave(torch.arange(num_seqs, device=device), q_lens)
        row_idx = torch.arange(seq_idx.shape[0], device=device) - md.query_start_loc[seq_idx]
        # Query i of a sequence sits at position (seq_len - q_len + i) and sees keys up to it.
        q_pos = (md.seq_lens - q_lens)[:, None] + torch.arange(md.max_query_len, device=device)
        mask = pos[None, None, :] <= q_pos[:, :, None]                    # (B, Lq, L)
        return cls(block_size, slots, seq_idx, row_idx, mask[:, None])


# --8<-- [start:write_kv]
def write_kv_cache(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                   v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Scatter new K/V ([num_tokens, kv_heads, head_dim]) into their slots of the block pool."""
    num_kv_heads, head_dim = k.shape[1:]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, v)
# --8<-- [end:write_kv]


# --8<-- [start:paged_attention]
def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    md: AttentionMetadata, scale: float, kv_cache_dtype: str = "auto"
                    ) -> torch.Tensor:
    """Causal attention of the new tokens over their sequences' cached K/V.

    q: [num_tokens, num_heads, head_dim] -> returns the same shape. kv_cache_dtype "fp8" or
    "int8": the pool holds quantized rows (kernels/write_kv.py), dequantized once gathered.
    """
    block_size = k_cache.shape[1]
    if md.torch_layout is None or md.torch_layout.block_size != block_size:
        md.torch_layout = TorchBatchLayout.build(md, block_size)   # once per step
    layout = md.torch_layout

    # 1. Gather each sequence's K/V through its block table: [num_seqs, max_seq_len, kv_heads, D].
    k = k_cache.flatten(0, 1)[layout.slots]                            # (B, L, Hkv, D)
    v = v_cache.flatten(0, 1)[layout.slots]
    if kv_cache_dtype != "auto":
        from kernels.write_kv import dequantize_kv
        k, v = dequantize_kv(k, kv_cache_dtype, q.dtype), dequantize_kv(v, kv_cache_dtype, q.dtype)

    # 2. Lay the flat queries out as a padded rectangle: [num_seqs, max_query_len, heads, D].
    #    In a pure decode step every sequence has exactly one query: nothing to pad.
    if md.max_query_len == 1:
        q_pad = q[:, None]
    else:
        q_pad = q.new_zeros(layout.mask.shape[0], md.max_query_len, *q.shape[1:])
        q_pad[layout.seq_idx, layout.row_idx] = q

    # 3. Attend, each query masked to its own sequence's past; back to the flat layout.
    out = F.scaled_dot_product_attention(
        q_pad.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),   # (B, H, Lq|L, D)
        attn_mask=layout.mask, scale=scale, enable_gqa=True)
    out = out.transpose(1, 2)                                          # (B, Lq, H, D)
    return out[:, 0] if md.max_query_len == 1 else out[layout.seq_idx, layout.row_idx]
# --8<-- [end:paged_attention]


def resolve_attention_backend(backend: str, device: torch.device, dtype: torch.dtype) -> str:
    """'auto' -> the Triton kernels on CUDA in bf16/fp16, this file's torch reference otherwise.
    'triton' on a CPU runs the kernels through Triton's interpreter (switched on by
    minivllm/__init__.py): exact in fp32 and fp16, very slow, and refused in bf16."""
    if backend == "auto":
        return "triton" if device.type == "cuda" and dtype != torch.float32 else "torch"
    if backend == "triton" and device.type == "cpu":
        import triton

        from kernels.flash_attention import _flash_attention_kernel
        if isinstance(_flash_attention_kernel, triton.runtime.JITFunction):
            raise ValueError("attention_backend='triton' on device='cpu' runs Triton's "
                             "interpreter, but Triton was imported before it was switched on: "
                             "set TRITON_INTERPRET=1, or import minivllm before torch and triton")
        if dtype == torch.bfloat16:
            raise ValueError("attention_backend='triton' on device='cpu' cannot run dtype "
                             "torch.bfloat16: the interpreter's bf16 tl.dot returns wrong "
                             "numbers in this Triton version; use float32 or float16")
    return backend


# True: the torch backend runs the padded reference above, not the fast path where each sequence
# pays its own length (kernels/cpu_attention.py; tests/test_cpu_attention.py compares the two).
USE_REFERENCE = False


class Attention(torch.nn.Module):
    """One layer's attention: store this step's K/V, then attend over the cache.

    The ModelRunner binds `k_cache` / `v_cache` (views into the engine's KV pool) after it has
    sized the pool; until then the layer cannot run.
    """

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = head_dim ** -0.5
        self.k_cache = self.v_cache = None   # (num_blocks, block_size, Hkv, D), bound later
        self.backend = "torch"          # or "triton", set by the ModelRunner
        self.kv_cache_dtype = "auto"    # or "fp8" / "int8": rows of D bytes + a scale (lesson 13)

    def forward(self, q, k, v, md: AttentionMetadata) -> torch.Tensor:
        # q: (T, H, D), k/v: (T, Hkv, D)
        if self.backend == "triton":    # the same two steps as fused kernels
            from minivllm.triton_attention import triton_attention  # imported only when asked
            return triton_attention(q, k, v, self.k_cache, self.v_cache, md, self.scale,
                                    md.decode_scratch, self.kv_cache_dtype)
        if self.kv_cache_dtype != "auto":   # quantized pool: quantize the rows as written
            from kernels.write_kv import quantize_kv
            k, v = quantize_kv(k, self.kv_cache_dtype), quantize_kv(v, self.kv_cache_dtype)
        write_kv_cache(k, v, self.k_cache, self.v_cache, md.slot_mapping)
        attend = paged_attention if USE_REFERENCE else _varlen_attention
        return attend(q, self.k_cache, self.v_cache, md, self.scale, self.kv_cache_dtype)


def _varlen_attention(q, k_cache, v_cache, md: AttentionMetadata, scale, kv_cache_dtype):
    if md.varlen_layout is None or md.varlen_layout.block_size != k_cache.shape[1]:
        md.varlen_layout = VarlenLayout.build(md.query_start_loc, md.seq_lens, md.block_tables,
                                              k_cache.shape[1])   # once per step
    return varlen_attention(q, k_cache, v_cache, md.varlen_layout, scale, kv_cache_dtype)
