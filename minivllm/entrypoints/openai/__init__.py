"""The OpenAI-compatible server (vLLM twin: vllm/entrypoints/openai/).

    api_server.py   FastAPI app: routes, auth, errors, /metrics
    serving.py      completions and chat completions, streaming
    protocol.py     request and response bodies (pydantic)
    cli_args.py     the flags of `minivllm serve` (the engine's: engine/arg_utils.py)
"""
