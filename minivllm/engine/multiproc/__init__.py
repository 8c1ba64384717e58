"""The EngineCore in a process of its own (vLLM twin: vllm/v1/engine/core_client.py's MPClient and
vllm/v1/engine/core.py's EngineCoreProc): what `minivllm serve` runs, and LLM or LLMEngine with
multiprocess_mode=True.

    client.py      SyncMPClient: the front end's end (start, send, read outputs, utility calls)
    dp_client.py   DPLBClient: data parallelism, several cores behind one front end, each
                   request sent to the least loaded (vLLM V1's score) and kept there
    core_proc.py   EngineCoreProc: the core's end (the busy loop), `python -m` this module

An add-on beside the in-process client (engine/core_client.py), which lessons use and a student
reads first: the same EngineCore and the same messages, carried over two ZMQ sockets.
"""
