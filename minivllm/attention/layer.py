"""Attention: one layer's "store this step's K/V, then attend over the cache", and the choice of
backend that does it (vLLM twin: vllm/attention/layer.py and vllm/v1/attention/selector.py).

    torch    on a CPU, and in fp32: the CPU fast path (attention/cpu_attention.py), or the padded
             reference (attention/torch_attention.py) when USE_REFERENCE is set
    triton   on CUDA in bf16/fp16: the kernels of kernels/ (attention/triton_attention.py)

Under torch.compile (compilation_config=3) attention runs as one custom op the graph cannot
see into, `minivllm::unified_attention` (vLLM's name): it takes q, k, v and the layer's name,
and finds the layer and the step's metadata in the forward context (minivllm/forward_context.py).
Left out (vLLM has them): FlashInfer / FlashAttention-3 backends, sliding windows, ALiBi.
"""

from __future__ import annotations

import torch

import minivllm.platforms  # noqa: F401  (first: Triton's interpreter switch, before kernels/)
from minivllm.attention.cpu_attention import cpu_attention
from minivllm.attention.metadata import AttentionMetadata
from minivllm.attention.torch_attention import paged_attention, write_kv_cache
from minivllm.forward_context import get_forward_context


def resolve_attention_backend(backend: str, device: torch.device, dtype: torch.dtype) -> str:
    """'auto' -> the Triton kernels on CUDA in bf16/fp16, the torch backend otherwise.
    'triton' on a CPU runs the kernels through Triton's interpreter (switched on by
    minivllm/platforms.py): exact in fp32 and fp16, very slow, and refused in bf16."""
    if backend == "auto":
        return "triton" if device.type == "cuda" and dtype != torch.float32 else "torch"
    if backend == "triton" and device.type == "cpu":
        import triton

        from kernels.flash_attention import _flash_attention_kernel
        if isinstance(_flash_attention_kernel, triton.runtime.JITFunction):
            raise ValueError("attention_backend='triton' on device='cpu' runs Triton's "
                             "interpreter, but Triton was imported before it was switched on: "
                             "set TRITON_INTERPRET=1, or import minivllm.platforms before kernels/")
        if dtype == torch.bfloat16:
            raise ValueError("attention_backend='triton' on device='cpu' cannot run dtype "
                             "torch.bfloat16: the interpreter's bf16 tl.dot returns wrong "
                             "numbers in this Triton version; use float32 or float16")
    return backend


# True: the torch backend runs the padded reference (attention/torch_attention.py), not the fast
# path where each sequence pays its own length (tests/test_cpu_attention.py compares the two).
USE_REFERENCE = False


class Attention(torch.nn.Module):
    """One layer's attention: store this step's K/V, then attend over the cache.

    The ModelRunner binds `k_cache` / `v_cache` (views into the engine's KV pool) after it has
    sized the pool; until then the layer cannot run.
    """

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int):
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = head_dim ** -0.5
        self.k_cache = self.v_cache = None   # (num_blocks, block_size, Hkv, D), bound later
        self.backend = "torch"          # or "triton", set by the ModelRunner
        self.kv_cache_dtype = "auto"    # or "fp8" / "int8": rows of D bytes + a scale (lesson 13)
        self.layer_name = ""            # model.layers.N.self_attn.attn, set by the model

    def forward(self, q, k, v, md: AttentionMetadata | None) -> torch.Tensor:
        # q: (T, H, D), k/v: (T, Hkv, D)
        if torch.compiler.is_compiling():   # traced: one opaque op, the metadata stays out
            return torch.ops.minivllm.unified_attention(q, k, v, self.layer_name)
        return self.attend(q, k, v, md)

    def attend(self, q, k, v, md: AttentionMetadata) -> torch.Tensor:
        if self.backend == "triton":    # the same two steps as fused kernels
            from minivllm.attention.triton_attention import triton_attention  # only when asked
            return triton_attention(q, k, v, self.k_cache, self.v_cache, md, self.scale,
                                    md.decode_scratch, self.kv_cache_dtype)
        if self.kv_cache_dtype != "auto":   # quantized pool: quantize the rows as written
            from kernels.write_kv import quantize_kv
            k, v = quantize_kv(k, self.kv_cache_dtype), quantize_kv(v, self.kv_cache_dtype)
        write_kv_cache(k, v, self.k_cache, self.v_cache, md.slot_mapping)
        attend = paged_attention if USE_REFERENCE else cpu_attention
        return attend(q, self.k_cache, self.v_cache, md, self.scale, self.kv_cache_dtype)


@torch.library.custom_op("minivllm::unified_attention", mutates_args=())
def unified_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      layer_name: str) -> torch.Tensor:
    """One layer's attention for a compiled graph: the layer and this step's metadata come from
    the forward context. It also writes the step's K/V into the layer's pool, which the graph
    does not see (the pool is no input of it), as in vLLM."""
    context = get_forward_context()
    return context.attention_layers[layer_name].attend(q, k, v, context.attn_metadata)


@unified_attention.register_fake
def _(q, k, v, layer_name):      # what the tracer needs: the output's shape and dtype
    return torch.empty_like(q)
