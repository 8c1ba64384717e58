"""The torch reference for paged attention: clear and obvious, the yardstick for every fast path
(vLLM twin: none in V1; V0's vllm/attention/backends/torch_sdpa.py is the nearest).

It gathers each sequence's K/V through its block table into a padded rectangle and calls
torch's scaled_dot_product_attention with a mask (the layout: attention/metadata.py). The
Triton kernels in kernels/ compute the same thing without the gather and are checked against
this, and so is the CPU fast path (attention/cpu_attention.py: no padding to the longest
sequence), which is what the engine runs on a CPU unless `layer.USE_REFERENCE` is set.
A contiguous, per-request cache (lesson 01's baseline) is the special case block_size =
max_model_len with one block per sequence, so it runs through the same code. A quantized pool
(kv_cache_dtype "int8" / "fp8", lesson 13) stores rows of head_dim bytes plus an fp32 scale:
new rows are quantized before the write, gathered rows dequantized before SDPA.
Left out, on purpose: speed. Every sequence is padded to the longest one of the step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

import minivllm.platforms  # noqa: F401  (first: Triton's interpreter switch, before kernels/)
from minivllm.attention.metadata import AttentionMetadata


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
        num_seqs = md.seq_lens.shape[0]
        device = md.seq_lens.device
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
