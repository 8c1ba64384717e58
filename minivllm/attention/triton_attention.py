"""The Triton attention backend as the engine calls it: one function per layer and step
(vLLM twin: vllm/v1/attention/backends/triton_attn.py).

This is the adapter between the engine and kernels/: it reads the engine's AttentionMetadata
and hands the kernels plain tensors and ints (kernels/ imports nothing from minivllm).
`Attention.forward` (minivllm/attention/layer.py) calls `triton_attention` when the engine runs with
attention_backend="triton" (the default on CUDA). It does what the torch reference does, in two
kernel launches (three for a long decode):

    write_kv                 this step's K/V into their slots           (kernels/write_kv.py)
    paged_decode_attention   if every sequence brings exactly one token (paged_attention.py)
    flash_attention          otherwise: prefills, chunks over cached context, mixed batches
                                                                        (flash_attention.py)

A decode batch gets its own kernel because its shape is different: one query row per sequence,
so the work is all in streaming the context, and the context is what gets split. Its partial
results go to a DecodeScratch the ModelRunner allocates once (max_num_seqs x the partitions of
max_model_len), so no step allocates and the launch is the same every step.

Left out (vLLM has them): a metadata builder per backend, FlashInfer / FlashAttention-3
backends, cascade attention for shared prefixes.
"""

from __future__ import annotations

import torch

import minivllm.platforms  # noqa: F401  (first: Triton's interpreter switch, before kernels/)
from kernels.flash_attention import flash_attention
from kernels.paged_attention import DecodeScratch, paged_decode_attention
from kernels.write_kv import write_kv
from minivllm.attention.metadata import AttentionMetadata

__all__ = ["DecodeScratch", "triton_attention"]


# --8<-- [start:triton_attention]
def triton_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                     v_cache: torch.Tensor, md: AttentionMetadata, scale: float,
                     scratch: DecodeScratch | None = None, kv_cache_dtype: str = "auto"
                     ) -> torch.Tensor:
    """q: (T, H, D), k/v: (T, Hkv, D) -> (T, H, D). scratch: the engine's decode partials.
    kv_cache_dtype "fp8" / "int8": the kernels quantize on write and dequantize per tile."""
    write_kv(k, v, k_cache, v_cache, md.slot_mapping, kv_cache_dtype)
    if md.max_query_len == 1:         # pure decode: one query per sequence, split the context
        return paged_decode_attention(q, k_cache, v_cache, md.seq_lens, md.block_tables,
                                      md.max_seq_len, scale, scratch, kv_cache_dtype)
    return flash_attention(q, k_cache, v_cache, md.query_start_loc, md.seq_lens,
                           md.block_tables, md.max_query_len, scale, kv_cache_dtype)
# --8<-- [end:triton_attention]
