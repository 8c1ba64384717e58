"""The `minivllm` command: serve a model over HTTP, and run the benchmarks (vLLM's CLI, small;
vLLM twin: vllm/entrypoints/cli/, main.py, serve.py and benchmark/).

    minivllm serve [MODEL] [--host 127.0.0.1] [--port 8000] [--max-model-len N] ...
    minivllm serve --kv-transfer-config '{"kv_role": "kv_producer"}'   # a prefill/decode pair
    minivllm bench serve --request-rate 4 --num-prompts 64     # load test a running server
    minivllm bench {throughput,decode,prefix,load,spec,tp,compile,guided,quant,lora,ablation} ...
    minivllm bench disagg                  # prefill/decode split vs colocated
    minivllm bench cpu                     # the CPU path: fp32/bf16 vs transformers, roofline
    minivllm disagg [MODEL] [--role both|producer|consumer] [--kv-ip IP --kv-port PORT] ...

Engine flags keep vLLM's names, so a vLLM command line works after `s/vllm/minivllm/` for the
flags minivllm has. With no MODEL, the packaged SmolLM2-135M-Instruct is served (no network).
`minivllm disagg` has no twin: vLLM starts one server per role and a proxy in front.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

DEFAULT_MODEL_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"   # its name on the hub
BENCHMARKS = ("throughput", "decode", "prefix", "load", "spec", "tp", "compile",
              "guided", "quant", "lora", "ablation")   # minivllm/benchmarks/bench.py's


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
    p.add_argument("--kv-transfer-config", type=json.loads, default=None,
                   help="prefill/decode disaggregation, as JSON: kv_role kv_producer serves "
                        "the front of a pair (with no kv_port, it spawns the kv_consumer here); "
                        "kv_role kv_consumer runs a decode role for the producer at kv_ip:kv_port")
    add_engine_args(p)
    return p


def make_engine(args: argparse.Namespace):
    """The engine `minivllm serve` serves: an LLMEngine, or with --kv-transfer-config the
    front of a disaggregated pair (minivllm/distributed/kv_transfer/disagg_llm.py)."""
    from minivllm.engine.llm_engine import LLMEngine
    kv = args.kv_transfer_config
    if kv is None:
        return LLMEngine(args.model, **engine_kwargs(args))
    from minivllm.config import KVTransferConfig
    from minivllm.distributed.kv_transfer.disagg_llm import DisaggLLM, launch
    from minivllm.entrypoints.openai.api_server import DisaggFront
    c = KVTransferConfig.from_dict(kv)
    if c.kv_role != "kv_producer":
        raise ValueError("--kv-transfer-config: the HTTP front is the kv_producer's; start a "
                         "kv_consumer with `minivllm disagg --role consumer --kv-port PORT`")
    where = {"kv_ip": c.kv_ip, "timeout": c.timeout}
    return DisaggFront(DisaggLLM(args.model, kv_port=c.kv_port, **where, **engine_kwargs(args))
                       if "kv_port" in kv else launch(args.model, **where, **engine_kwargs(args)))


def serve(args: argparse.Namespace) -> None:
    from minivllm.engine.async_llm_engine import AsyncLLMEngine
    from minivllm.entrypoints.openai.api_server import Server, bind_socket

    sock = bind_socket(args.host, args.port)    # a taken port fails now, not after the load
    name = args.served_model_name or args.model or DEFAULT_MODEL_NAME
    try:
        engine = make_engine(args)
    except (ValueError, TypeError, FileNotFoundError, RuntimeError) as e:
        sock.close()
        raise SystemExit(f"minivllm serve: {e}") from None
    logging.getLogger("minivllm").info("%r", engine)
    print(f"minivllm: serving {name} ({engine!r}) at http://{args.host}:{args.port}/v1",
          flush=True)
    try:
        Server(AsyncLLMEngine(engine), sock, name, api_key=args.api_key,
               log_level=args.uvicorn_log_level).run()
    finally:
        if hasattr(engine, "close"):            # a disaggregated pair: stop the consumer
            engine.close()


def disagg(argv: list[str]) -> None:
    """`minivllm disagg`: both roles here (default), or one role of a two-machine pair."""
    from minivllm.distributed.kv_transfer import disagg_llm
    from minivllm.distributed.kv_transfer.kv_connector import run_decode_role
    from minivllm.sampling_params import SamplingParams
    p = argparse.ArgumentParser(prog="minivllm disagg", description=disagg_llm.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?", default=None)
    p.add_argument("--role", choices=("both", "producer", "consumer"), default="both")
    p.add_argument("--kv-ip", default="127.0.0.1", help="the producer's address")
    p.add_argument("--kv-port", type=int, default=None,
                   help="its port (default: a free one; both roles must name the same)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the peer")
    p.add_argument("--prompt", action="append", default=None, help="repeat for more prompts")
    p.add_argument("--max-tokens", type=int, default=32)
    add_engine_args(p)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    kwargs = engine_kwargs(args)
    if args.role != "both" and args.kv_port is None:
        p.error("--kv-port is needed when the roles start apart")
    where = {"kv_ip": args.kv_ip, "kv_port": args.kv_port, "timeout": args.timeout}
    if args.role == "consumer":
        config = {"kv_role": "kv_consumer", "kv_ip": args.kv_ip, "kv_port": args.kv_port,
                  "kv_connector_extra_config": {"timeout": args.timeout}}
        return run_decode_role(args.model, {**kwargs, "kv_transfer_config": config})
    llm = (disagg_llm.launch(args.model, **where, **kwargs) if args.role == "both"
           else disagg_llm.DisaggLLM(args.model, **where, **kwargs))
    with llm:
        prompts = args.prompt or ["The capital of France is"]
        params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
        for out in llm.generate(prompts, params):
            print(f"{out.prompt!r} -> {out.outputs[0].text!r}")
        print(llm.stats())
    print("kv_consumer:", llm.report, file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["disagg"]:     # its flags may come first, which REMAINDER would refuse
        return disagg(argv[1:])
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
                                      "(minivllm/distributed/kv_transfer/disagg_llm.py)", add_help=False)
    d.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.command == "serve":
        serve(args)
    elif args.benchmark == "cpu":
        from minivllm.benchmarks import cpu as bench_cpu
        bench_cpu.main(args.rest)
    elif args.benchmark == "disagg":
        from minivllm.benchmarks import disagg as bench_disagg
        bench_disagg.main(args.rest)
    elif args.benchmark == "serve":
        from minivllm.benchmarks import serve as bench_serve
        bench_serve.main(args.rest)
    else:
        from minivllm.benchmarks import bench
        bench.main([args.benchmark, *args.rest])


if __name__ == "__main__":
    main()
