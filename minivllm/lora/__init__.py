"""Multi-LoRA serving (vLLM twin: vllm/lora/): one base model, many PEFT adapters in one batch.

    request.py   LoRARequest: the adapter a request names (minivllm.LoRARequest)
    layers.py    LoRALinear over a base projection, and LoRABatch: the step's slot per token
    models.py    adapter loading, and the LoRAManager: wrapping, host-memory LRU, GPU slots
"""
