"""Model implementations (vLLM twin: vllm/model_executor/models/ and model_loader/).

    llama.py    LlamaForCausalLM: Llama, Qwen2 and Qwen3 over a flat token batch
    loader.py   the packaged GGUF model, or a Hugging Face checkpoint, into the model

One file covers the Llama family; vLLM has one per architecture and a registry to find it.
"""

from minivllm.models.llama import LlamaForCausalLM

__all__ = ["LlamaForCausalLM"]
