"""The engine loop (vLLM twin: vllm/v1/engine/): requests in, one step at a time, outputs out.

    llm_engine.py         LLMEngine: add_request, step (schedule -> execute -> update -> outputs)
    async_llm_engine.py   AsyncLLMEngine: the same loop on its own thread, for the HTTP server
    processor.py          requests in: every check a request can fail, before it is queued
    output_processor.py   tokens out: stop checks, RequestOutput
    parallel_sampling.py  n > 1 as n child requests, gathered into one RequestOutput (V1)
    detokenizer.py        incremental detokenization
    stats.py              EngineStats and StepRecord: what the engine reports about itself
    disagg/               DisaggLLM: the front of a prefill/decode pair (two engines, the KV
                          connector of minivllm/distributed/kv_transfer/ between them)
"""
