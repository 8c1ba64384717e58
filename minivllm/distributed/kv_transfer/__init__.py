"""Prefill/decode disaggregation's KV connector (vLLM twin: vllm/distributed/kv_transfer/).

    kv_connector.py   the connector's two sides (KVConnectorBase_V1's): KVConnectorScheduler in
                      the core (which blocks move) and KVConnectorWorker in the worker (the
                      transfer into and out of the KV cache), and the metadata between them
    kv_pipe.py        the transport: torch.distributed point-to-point between the two roles

The front that drives a pair (DisaggLLM) is in minivllm/engine/disagg/.
"""
