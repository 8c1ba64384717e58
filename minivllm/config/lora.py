"""Multi-LoRA's slots (vLLM twin: vllm/config/lora.py). VllmConfig.lora_config is None unless
enable_lora."""

from __future__ import annotations

from dataclasses import dataclass

from minivllm.config.utils import check_positive_ints


@dataclass(slots=True)
class LoRAConfig:
    """Adapters served in max_loras slots of max_lora_rank (minivllm/lora/), and kept read in
    host memory up to max_cpu_loras (None: max_loras)."""

    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None

    def __post_init__(self):
        check_positive_ints(self, "max_loras", "max_lora_rank", "max_cpu_loras",
                            optional=("max_cpu_loras",))
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras "
                             f"({self.max_loras}): every adapter in a slot is also kept on host")
