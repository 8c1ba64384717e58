"""Prefill/decode disaggregation's front (vLLM twin: the disaggregated-serving proxy in
examples/online_serving/disaggregated_serving/; one server per role there).

    disagg_llm.py   DisaggLLM (the front of a pair, in the producer's process), launch() (both
                    roles here), and the consumer's loop (serve_decode, run_decode_role)

A front end over two LLMEngines, as engine/multiproc/ is a client over a core in another
process. The KV connector the engines use lives in minivllm/distributed/kv_transfer/, apart
from this front: the front builds engines, and the engine's core and worker import the
connector (one package holding both would import itself in a cycle).
"""
