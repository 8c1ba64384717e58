"""The engine's configuration, one class per concern (vLLM twin: vllm/config/).

    VllmConfig                     the whole, as one object (vllm.py)
      model_config: ModelConfig      the checkpoint (hf_config: HfConfig, its shape), dtype,
                                     device, max_model_len, weights' quantization (model.py)
      cache_config: CacheConfig      KV blocks, the pool's size, its dtype, prefix caching
      scheduler_config               max_num_seqs, the token budget, chunked prefill, preemption
      parallel_config                tensor parallelism and the executor backend
      lora_config                    multi-LoRA's slots (None: off)
      speculative_config             speculative decoding (None: off)
      compilation_config             torch.compile's level
      kv_transfer_config             prefill/decode disaggregation (None: off)
      kv_events_config               the prefix cache's events, for routing (None: off)

Users never build these by hand: LLM(**kwargs) and `minivllm serve` take flat settings with
vLLM's names, which EngineArgs (engine/arg_utils.py) turns into a VllmConfig. Left out of
vLLM's: its ~200 settings but those a lesson turns. Importing this package imports no torch.
"""

from minivllm.config.cache import CacheConfig
from minivllm.config.compilation import CompilationConfig
from minivllm.config.kv_events import KVEventsConfig
from minivllm.config.kv_transfer import KVTransferConfig
from minivllm.config.lora import LoRAConfig
from minivllm.config.model import (INT4_GROUP_SIZES, QUANTIZATION_METHODS, HfConfig, ModelConfig,
                                   resolve_device, resolve_dtype)
from minivllm.config.parallel import ParallelConfig
from minivllm.config.scheduler import SchedulerConfig
from minivllm.config.speculative import SpeculativeConfig
from minivllm.config.vllm import (CUDA_GRAPHS, INCOMPATIBLE, PER_REQUEST, VllmConfig,
                                  check_compatibility, incompatibility)

__all__ = ["CUDA_GRAPHS", "INCOMPATIBLE", "INT4_GROUP_SIZES", "PER_REQUEST",
           "QUANTIZATION_METHODS", "CacheConfig", "CompilationConfig", "HfConfig",
           "KVEventsConfig", "KVTransferConfig", "LoRAConfig", "ModelConfig", "ParallelConfig",
           "SchedulerConfig", "SpeculativeConfig", "VllmConfig", "check_compatibility",
           "incompatibility", "resolve_device", "resolve_dtype"]
