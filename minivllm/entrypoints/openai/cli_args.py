"""The flags of `minivllm serve` (vLLM twin: vllm/entrypoints/openai/cli_args.py, make_arg_parser).

The server's own flags (the model, where to listen, the API key, the log level, the P/D role,
where the engine core runs) and then the engine's (minivllm/engine/arg_utils.py). Its own
module, apart from cli.py, as in vLLM. The benchmarks never import it (the CLI imports them):
`minivllm bench serve --compare-offline` reads its `--server-args` as MODEL and the engine's
flags only.

Leaves out vLLM's TLS, CORS, tool-calling, chat-template and LoRA-module flags.
"""

from __future__ import annotations

import argparse
import json

from minivllm.engine import arg_utils

DEFAULT_MODEL_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"   # its name on the hub


def make_arg_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """`minivllm serve [MODEL] ...`: the server's flags, then the engine's."""
    parser.add_argument("model", nargs="?", default=None,
                        help="checkpoint directory, .gguf file or hub id (default: the "
                             "packaged SmolLM2-135M-Instruct)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (0.0.0.0 for every interface)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", default=None,
                        help="the name clients send as `model` (default: MODEL, or "
                             f"{DEFAULT_MODEL_NAME})")
    parser.add_argument("--api-key", default=None,
                        help="require 'Authorization: Bearer KEY' on /v1/* (401 otherwise); "
                             "default: $MINIVLLM_API_KEY, which `ps` does not show")
    parser.add_argument("--disable-fastapi-docs", action="store_true",
                        help="no /docs, /redoc or /openapi.json")
    parser.add_argument("--max-request-body-mb", type=float, default=16,
                        help="a larger request body is refused (413) before it is parsed")
    parser.add_argument("--max-prompts-per-request", type=int, default=256,
                        help="prompts one /v1/completions request may carry, and prompts x n "
                             "(400 beyond)")
    parser.add_argument("--max-grammar-compile-seconds", type=float, default=30.0,
                        help="CPU seconds one guided-decoding constraint may take to compile "
                             "(in a child process; 400 beyond)")
    parser.add_argument("--max-grammar-compile-memory-mb", type=int, default=2048,
                        help="memory one constraint's compile may take (400 beyond)")
    parser.add_argument("--uvicorn-log-level", default="info")
    parser.add_argument("--multiprocess-mode", action=argparse.BooleanOptionalAction,
                        default=True,
                        help="the EngineCore in a process of its own, as vLLM's AsyncLLM runs "
                             "it (default); --no-multiprocess-mode steps it in the server's "
                             "process, on the engine thread")
    parser.add_argument("--kv-transfer-config", type=json.loads, default=None,
                        help="prefill/decode disaggregation, as JSON: kv_role kv_producer "
                             "serves the front of a pair (with no kv_port, it spawns the "
                             "kv_consumer here); kv_role kv_consumer runs a decode role for "
                             "the producer at kv_ip:kv_port")
    parser.add_argument("--cpu-max-step-seconds", type=float, default=1.0,
                        help="on a CPU without --max-num-batched-tokens: the token budget is "
                             "measured at start-up so that one step, which every stream waits "
                             "through, stays under this (minivllm/entrypoints/step_budget.py)")
    return arg_utils.add_cli_args(parser)
