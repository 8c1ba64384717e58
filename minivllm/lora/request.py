"""LoRARequest: which adapter a request runs under (vLLM twin: vllm/lora/request.py).

A name, a unique positive id (the engine's key for the adapter: its slot, its host-memory copy,
its part of the prefix-cache key) and a PEFT directory. Exported as `minivllm.LoRARequest`.

Left out, compared with vLLM: the base-model name, long-context scaling, and tensorizer paths.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LoRARequest:
    """vLLM's LoRARequest: a name, a unique positive id (the engine's key) and a PEFT dir."""

    lora_name: str
    lora_int_id: int
    lora_path: str

    def __post_init__(self):
        if not isinstance(self.lora_int_id, int) or self.lora_int_id < 1:
            raise ValueError(f"lora_int_id must be a positive integer, got {self.lora_int_id!r}")
