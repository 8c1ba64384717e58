"""The KV cache: its blocks, its pool's size, its dtype, prefix caching, the CPU offloading
tier and V0's swap pool (vLLM twin: vllm/config/cache.py)."""

from __future__ import annotations

from dataclasses import dataclass

from minivllm.config.utils import check_bools, check_choice, check_positive_ints

KV_LAYOUTS = ("paged", "contiguous")
CACHE_DTYPES = ("auto", "fp8", "int8")


@dataclass(slots=True)
class CacheConfig:
    block_size: int = 16                  # tokens per KV block
    # The KV pool's size, first rule that applies: num_kv_blocks blocks (slabs, for the
    # contiguous baseline; vLLM's num_gpu_blocks_override); kv_cache_memory bytes, on any
    # device; on CUDA, what profiling one full step leaves within gpu_memory_utilization; on
    # CPU, 1 GiB.
    num_kv_blocks: int | None = None
    kv_cache_memory: int | None = None
    gpu_memory_utilization: float = 0.9   # share of the GPU the engine may fill (CUDA)
    enable_prefix_caching: bool = True    # reuse the K/V blocks of shared prompt prefixes
    swap_space: float = 1.0               # GiB of host memory for V0's swapped KV blocks
    # KV offloading (minivllm/kv_offload/): GiB of host memory where computed blocks stay, by
    # their prefix-cache hash, after the GPU pool drops them (None: off). vLLM's names.
    kv_offloading_size: float | None = None
    kv_offloading_backend: str = "native"    # vLLM also has "lmcache"; minivllm only this
    # "auto" (the model's dtype), "fp8" (e4m3) or "int8": one scale per token and KV head
    # (flag --kv-cache-dtype, as vLLM's).
    cache_dtype: str = "auto"
    kv_layout: str = "paged"              # or "contiguous": one max_model_len slab per request

    def __post_init__(self):
        check_positive_ints(self, "block_size", "num_kv_blocks", "kv_cache_memory",
                            optional=("num_kv_blocks", "kv_cache_memory"))
        check_bools(self, "enable_prefix_caching")
        check_choice(self, "kv_layout", KV_LAYOUTS)
        check_choice(self, "kv_offloading_backend", ("native",))
        check_positive_ints(self, "swap_space", "kv_offloading_size",
                            optional=("kv_offloading_size",), unit="number of GiB")
        check_choice(self, "cache_dtype", CACHE_DTYPES, setting="kv_cache_dtype")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got "
                             f"{self.gpu_memory_utilization}")
        if self.cache_dtype == "fp8":
            import torch
            if not hasattr(torch, "float8_e4m3fn"):
                raise ValueError(f"kv_cache_dtype='fp8' needs torch.float8_e4m3fn, which torch "
                                 f"{torch.__version__} lacks; use 'int8'")
