"""Speculative decoding (vLLM twin: vllm/v1/spec_decode/): propose k tokens cheaply, verify
them in one target forward, keep exactly what the target would have produced.

    decoder.py       SpeculativeDecoder, the n-gram proposer and the acceptance rules
    draft_model.py   the draft-model proposer
"""
