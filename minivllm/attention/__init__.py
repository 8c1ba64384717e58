"""Attention over the paged KV cache (vLLM twin: vllm/v1/attention/ and vllm/attention/).

    metadata.py          AttentionMetadata: where this step's tokens go and what they may see
    layer.py             Attention: one layer's write-then-attend, and the backend choice
    torch_attention.py   the torch reference: gather through block tables + SDPA with a mask
    cpu_attention.py     the CPU fast path's adapter (kernels/cpu_attention.py): the CPU default
    triton_attention.py  the Triton backend's adapter (kernels/)
"""
