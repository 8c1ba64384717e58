"""Multi-LoRA serving (vLLM twin: vllm/lora/): one base model, many PEFT adapters in one batch.

    models.py   LoRARequest, adapter loading, LoRALinear, the LoRAManager and its GPU slots
"""
