"""Weight-only quantization (vLLM twin: vllm/model_executor/layers/quantization/).

    weight_only.py   int8 per channel and int4 in groups: QuantLinear, quantize_model
"""
