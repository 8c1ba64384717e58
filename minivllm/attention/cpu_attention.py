"""The CPU fast path as the engine calls it: the adapter from AttentionMetadata to
kernels/cpu_attention.py (vLLM twin: vllm/v1/attention/backends/cpu_attn.py).

The reference (attention/torch_attention.py) pads every sequence of a step to the longest one;
this path lets each sequence pay for its own length. Same numbers (tests/test_cpu_attention.py).
The batch layout depends on the step, not the layer: the first layer builds it, the rest reuse it.
It is the attention the engine runs on a CPU by default. Left out, compared with vLLM's: its
C++ kernels (oneDNN / AMX) and bf16 fast paths; this one is torch.
"""

from __future__ import annotations

import minivllm.platforms  # noqa: F401  (first: Triton's interpreter switch, before kernels/)
from kernels.cpu_attention import VarlenLayout, varlen_attention
from minivllm.attention.metadata import AttentionMetadata


def cpu_attention(q, k_cache, v_cache, md: AttentionMetadata, scale, kv_cache_dtype):
    if md.varlen_layout is None or md.varlen_layout.block_size != k_cache.shape[1]:
        md.varlen_layout = VarlenLayout.build(md.query_start_loc, md.seq_lens, md.block_tables,
                                              k_cache.shape[1])   # once per step
    return varlen_attention(q, k_cache, v_cache, md.varlen_layout, scale, kv_cache_dtype)
