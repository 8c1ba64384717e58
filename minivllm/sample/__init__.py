"""Sampling (vLLM twin: vllm/v1/sample/): logits -> tokens.

    sampler.py            temperature, top-k, top-p, seeds, logprobs; the exponential race
    logits_processor.py   min_tokens, penalties, the guided-decoding bitmask
"""
