"""Prefill/decode disaggregation (vLLM twin: vllm/distributed/kv_transfer/).

    kv_connector.py   KVConnector: the producer sends a prefilled request's KV, the consumer admits it
    disagg_llm.py     DisaggLLM and launch(): the front of a disaggregated pair
"""
