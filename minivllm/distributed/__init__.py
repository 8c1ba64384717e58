"""More than one process (vLLM twin: vllm/distributed/): torch.distributed, no RPC of our own.

    parallel.py     tensor parallelism: the process group, the parallel layers, the worker processes
    kv_transfer/    prefill/decode disaggregation: the KV connector and the DisaggLLM front
"""
