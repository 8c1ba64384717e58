"""How users reach the engine (vLLM twin: vllm/entrypoints/).

    cli.py     the `minivllm` command: serve, disagg, bench
    openai/    the OpenAI-compatible HTTP server
"""
