"""Structured output (vLLM twin: vllm/v1/structured_output/): grammars as a logits mask.

    manager.py   StructuredOutputManager: compile (cached), one matcher per sequence, bitmasks
"""
