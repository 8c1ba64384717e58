"""The Triton attention backend as the engine calls it: one function per layer and step.

minivllm/attention.py's `Attention.forward` calls `triton_attention` when the engine runs with
attention_backend="triton" (the default on CUDA). It does what the torch reference does, in two
kernel launches (three for a long decode):

    write_kv                 this step's K/V into their slots           (kernels/write_kv.py)
    paged_decode_attention   if every sequence brings exactly one token (paged_attention.py)
    flash_attention          otherwise: prefills, chunks over cached context, mixed batches
                                                                        (flash_attention.py)

A decode batch gets its own kernel because its shape is different: one query row per sequence,
so the work is all in streaming the context, and the context is what gets split.
"""

from __future__ import annotations

import os
import sys

import torch

# Triton's own library functions (tl.sum, tl.max, ...) are kernels too, defined when
# triton.language is first imported. If that happened before TRITON_INTERPRET=1 was set (torch
# can import Triton on its own), they cannot run on a CPU: say so, clearly, before we start.
if os.environ.get("TRITON_INTERPRET") == "1" and "triton.language" in sys.modules:
    import triton.language as tl
    from triton.runtime.jit import JITFunction
    if isinstance(tl.sum, JITFunction):
        raise ImportError(
            "Triton was imported before its interpreter was switched on, so its kernels "
            "cannot run on this CPU. Set TRITON_INTERPRET=1 in the environment, or import "
            "minivllm before anything else imports torch's Triton-backed parts.")

from kernels.flash_attention import flash_attention  # noqa: E402
from kernels.paged_attention import paged_decode_attention  # noqa: E402
from kernels.write_kv import write_kv  # noqa: E402


# --8<-- [start:triton_attention]
def triton_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                     v_cache: torch.Tensor, md, scale: float) -> torch.Tensor:
    """q: (T, H, D), k/v: (T, Hkv, D), md: minivllm.attention.AttentionMetadata -> (T, H, D)."""
    write_kv(k, v, k_cache, v_cache, md.slot_mapping)
    if md.max_query_len == 1:         # pure decode: one query per sequence, split the context
        return paged_decode_attention(q, k_cache, v_cache, md.seq_lens, md.block_tables,
                                      md.max_seq_len, scale)
    return flash_attention(q, k_cache, v_cache, md.query_start_loc, md.seq_lens,
                           md.block_tables, md.max_query_len, scale)
# --8<-- [end:triton_attention]
