"""The KV cache: how big it is, and the classic way to hold it (one slab per request).
vLLM twin: vllm/v1/kv_cache_interface.py (bytes per token and per block); the slab allocator
has none: it is the baseline vLLM replaced. The pool tensors themselves are the worker's
(worker/model_runner.py, allocate_kv_cache): the core holds sizes and block ids, no tensor.

Every generated token needs the keys and values of every earlier token, at every layer. Storing
them instead of recomputing turns each decode step from O(n^2) work into O(n), at a price in
memory that this one formula gives:

    bytes per token = 2 (K and V) x layers x kv_heads x head_dim x bytes per element

SmolLM2-135M in fp32: 2 x 30 x 3 x 64 x 4 = 46,080 bytes (45 KiB) per token.
Llama-3-8B in bf16:   2 x 32 x 8 x 128 x 2 = 131,072 bytes (128 KiB) per token.

`ContiguousAllocator` is the baseline vLLM replaced: each request reserves max_model_len slots
when it starts, whether it will use 30 of them or 3,000. Lesson 01 measures what that wastes;
lesson 02 replaces it with `block_manager.BlockManager`. Both hand the engine the same thing, a
block table per request, so the attention code cannot tell them apart: a contiguous slab is one
block of max_model_len tokens.

Quantized pools (kv_cache_dtype "fp8" / "int8", lesson 13) hold 1 byte per element plus a scale.
Left out, compared with vLLM: per-tensor calibrated KV scales, per-layer cache specs for hybrid
models, and the NHD/HND layout choice per attention backend.
"""

from __future__ import annotations

from dataclasses import dataclass

from minivllm.config import HfConfig
from minivllm.core.request import Request

# Published shapes of well-known models (their config.json files): facts, no downloads needed.
#                 layers, query heads, kv heads, head_dim, hidden
REFERENCE_MODELS = {
    "SmolLM2-135M": (30, 9, 3, 64, 576),
    "Qwen3-0.6B": (28, 16, 8, 128, 1024),
    "Qwen3-8B": (36, 32, 8, 128, 4096),
    "Llama-3-8B": (32, 32, 8, 128, 4096),
    "Qwen3-32B": (64, 64, 8, 128, 5120),
    "Llama-3-70B": (80, 64, 8, 128, 8192),
}


def reference_config(name: str) -> HfConfig:
    """An HfConfig with the attention shape of a well-known model (for KV-cache arithmetic)."""
    layers, heads, kv_heads, head_dim, hidden = REFERENCE_MODELS[name]
    return HfConfig(architecture="LlamaForCausalLM", vocab_size=0, hidden_size=hidden,
                       intermediate_size=0, num_hidden_layers=layers, num_attention_heads=heads,
                       num_key_value_heads=kv_heads, head_dim=head_dim,
                       max_position_embeddings=0, rms_norm_eps=0.0, rope_theta=0.0)


# --8<-- [start:bytes_per_token]
def kv_bytes_per_token(config: HfConfig, dtype, kv_cache_dtype: str = "auto") -> int:
    """Bytes of K and V that one token occupies across all layers, in a torch dtype. A quantized
    cache ("fp8", "int8") stores a byte per element plus one fp32 scale per token and KV head."""
    row = config.head_dim * dtype.itemsize if kv_cache_dtype == "auto" else config.head_dim + 4
    return 2 * config.num_hidden_layers * config.num_key_value_heads * row
# --8<-- [end:bytes_per_token]


@dataclass(frozen=True, slots=True)
class KVCacheConfig:
    """The pools the executor allocated, what the scheduler manages (vLLM twin:
    vllm/v1/kv_cache_interface.py, KVCacheConfig): blocks on the device, blocks in host memory
    (the CPU tier's, or V0's swap pool), and one block's bytes on one device."""

    num_blocks: int
    num_cpu_blocks: int = 0
    block_bytes: int = 0


class ContiguousAllocator:
    """Static preallocation: every running request owns one slab of max_model_len slots.

    Same interface as BlockManager (can_allocate / allocate / append_slots / free), with a
    block as large as the longest request the engine accepts.
    """

    def __init__(self, num_slabs: int, max_model_len: int):
        self.num_blocks = num_slabs
        self.block_size = max_model_len
        self.free_slabs = list(range(num_slabs - 1, -1, -1))

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_slabs)

    def can_allocate(self, request: Request) -> bool:
        return bool(self.free_slabs)

    def allocate(self, request: Request, use_prefix_cache: bool = False) -> None:
        request.block_table = [self.free_slabs.pop()]

    def cache_computed_blocks(self, request: Request, num_computed_tokens: int | None = None
                              ) -> None:
        """Nothing to do: a private slab per request has nothing to share."""

    def can_append_slots(self, request: Request, num_lookahead_slots: int = 0) -> bool:
        return True            # the slab already reserved room up to max_model_len

    def append_slots(self, request: Request, num_lookahead_slots: int = 0) -> list[tuple[int, int]]:
        return []

    def free(self, request: Request) -> None:
        self.free_slabs.extend(reversed(request.block_table))
        request.block_table = []

