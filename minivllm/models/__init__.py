"""Model implementations. One file covers the Llama family (Llama, Qwen2, Qwen3)."""

from minivllm.models.llama import LlamaForCausalLM

__all__ = ["LlamaForCausalLM"]
