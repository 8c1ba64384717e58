"""The `minivllm` command: serve a model over HTTP, and run the benchmarks (vLLM's CLI, small).

    minivllm serve [MODEL] [--host 127.0.0.1] [--port 8000] [--max-model-len N] ...
    minivllm bench serve --request-rate 4 --num-prompts 64     # load test a running server
    minivllm bench {throughput,decode,prefix,load,spec,tp,compile,guided,quant,lora} ...    # = python -m minivllm.bench
    minivllm bench disagg                  # prefill/decode split vs colocated (bench_disagg.py)
    minivllm bench cpu                     # the CPU path: fp32/bf16 vs transformers, roofline
    minivllm disagg [MODEL] [--role both|producer|consumer] [--kv-ip IP --kv-port PORT] ...

Engine flags keep vLLM's names, so a vLLM command line works after `s/vllm/minivllm/` for the
flags minivllm has. With no MODEL, the packaged SmolLM2-135M-Instruct is served (no network).
"""

from __future__ import annotations

import argparse
import logging
import sys

DEFAULT_MODEL_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"   # its name on the hub
BENCHMARKS = ("throughput", "decode", "prefix", "load", "spec", "tp", "compile",
              "guided", "quant", "lora")   # minivllm/bench.py's


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """The engine's flags, with vLLM's names; `engine_kwargs` turns them into LLMEngine's."""
    g = p.add_argument_group("engine (vLLM's flag names)")
    g.add_argument("--dtype", default="auto", help="auto (fp32 on CPU, bf16 on CUDA), float32, "
                   "bfloat16, float16")
    g.add_argument("--device", default="auto", help="auto, cpu or cuda")
    g.add_argument("--max-model-len", type=int, default=None,
                   help="longest prompt + output (default: the model's context length)")
    g.add_argument("--max-num-seqs", type=int, default=64, help="sequences per batch, at most")
    g.add_argument("--max-num-batched-tokens", type=int, default=2048,
                   help="tokens per forward pass, at most (the token budget)")
    g.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    g.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                   default=True, help="reuse the KV blocks of shared prompt prefixes")
    g.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="share of the GPU the engine may fill (CUDA)")
    g.add_argument("--num-gpu-blocks-override", type=int, default=None,
                   help="KV pool size in blocks, instead of the memory rule")
    g.add_argument("--tensor-parallel-size", "-tp", type=int, default=1,
                   help="split the model across this many processes (GPUs)")
    g.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs for decode")


def engine_kwargs(args: argparse.Namespace) -> dict:
    return dict(dtype=args.dtype, device=args.device, max_model_len=args.max_model_len,
                max_num_seqs=args.max_num_seqs,
                max_num_batched_tokens=args.max_num_batched_tokens,
                block_size=args.block_size, enable_prefix_caching=args.enable_prefix_caching,
                gpu_memory_utilization=args.gpu_memory_utilization,
                num_kv_blocks=args.num_gpu_blocks_override,
                tensor_parallel_size=args.tensor_parallel_size, enforce_eager=args.enforce_eager)


def serve_parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("model", nargs="?", default=None,
                   help="checkpoint directory, .gguf file or hub id (default: the packaged "
                        "SmolLM2-135M-Instruct)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (0.0.0.0 for every interface)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None,
                   help="the name clients send as `model` (default: MODEL, or "
                        f"{DEFAULT_MODEL_NAME})")
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on /v1/* (401 otherwise)")
    p.add_argument("--uvicorn-log-level", default="info")
    add_engine_args(p)
    return p


def serve(args: argparse.Namespace) -> None:
    from minivllm.async_engine import AsyncLLMEngine
    from minivllm.server import Server, bind_socket

    sock = bind_socket(args.host, args.port)    # a taken port fails now, not after the load
    name = args.served_model_name or args.model or DEFAULT_MODEL_NAME
    try:
        aengine = AsyncLLMEngine.from_engine_args(args.model, **engine_kwargs(args))
    except (ValueError, TypeError, FileNotFoundError) as e:
        sock.close()
        raise SystemExit(f"minivllm serve: {e}") from None
    logging.getLogger("minivllm").info("%r", aengine.engine)
    print(f"minivllm: serving {name} ({aengine.engine!r}) at http://{args.host}:{args.port}/v1",
          flush=True)
    Server(aengine, sock, name, api_key=args.api_key,
           log_level=args.uvicorn_log_level).run()


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="minivllm", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    serve_parser(sub.add_parser("serve", help="OpenAI-compatible HTTP server"))
    b = sub.add_parser("bench", help="benchmarks: serve (against a server), "
                                     + ", ".join(BENCHMARKS) + " (offline)")
    b.add_argument("benchmark", choices=("serve", "disagg", "cpu") + BENCHMARKS)
    b.add_argument("rest", nargs=argparse.REMAINDER, help="the benchmark's own flags "
                   "(minivllm bench NAME --help)")
    d = sub.add_parser("disagg", help="prefill and decode roles in two processes "
                                      "(minivllm/disagg_llm.py)", add_help=False)
    d.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command == "disagg":
        from minivllm import disagg_llm
        return disagg_llm.main(args.rest)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.command == "serve":
        serve(args)
    elif args.benchmark == "cpu":
        from minivllm import bench_cpu
        bench_cpu.main(args.rest)
    elif args.benchmark == "disagg":
        from minivllm import bench_disagg
        bench_disagg.main(args.rest)
    elif args.benchmark == "serve":
        from minivllm import bench_serve
        bench_serve.main(args.rest)
    else:
        from minivllm import bench
        bench.main([args.benchmark, *args.rest])


if __name__ == "__main__":
    main()
