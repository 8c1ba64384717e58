"""The `minivllm` command: serve a model over HTTP, run the benchmarks, run a P/D pair.

vLLM twin: vllm/entrypoints/cli/ (main.py, serve.py, benchmark/), in one file.

    minivllm serve [MODEL] [--host 127.0.0.1] [--port 8000] [--max-model-len N] ...
    minivllm serve --no-multiprocess-mode      # the EngineCore in the server's own process
    minivllm serve -dp 2 -dpl 1 --data-parallel-address A    # + `serve --headless` on host 2
    minivllm serve --kv-transfer-config '{"kv_role": "kv_producer"}'   # a prefill/decode pair
    minivllm bench serve --request-rate 4 --num-prompts 64     # load test a running server
    minivllm bench NAME ...                # every benchmark: minivllm/benchmarks/main.py
    minivllm disagg [MODEL] [--role both|producer|consumer] [--kv-ip IP --kv-port PORT] ...
    minivllm simulate --model Llama-3-70B --profile H100 -tp 8 ...   # minivllm/simulator/cli.py

Engine flags keep vLLM's names (minivllm/engine/arg_utils.py), so a vLLM command line works
after `s/vllm/minivllm/` for the flags minivllm has. With no MODEL, the packaged
SmolLM2-135M-Instruct is served (no network). `serve`'s own flags are in
entrypoints/openai/cli_args.py. Leaves out vLLM's `chat`, `complete` and `collect-env`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from minivllm.benchmarks import main as benchmarks
from minivllm.engine.arg_utils import add_cli_args, engine_kwargs
from minivllm.entrypoints.openai.cli_args import DEFAULT_MODEL_NAME, make_arg_parser
from minivllm.simulator import cli as simulator


def make_engine(args: argparse.Namespace):
    """The engine `minivllm serve` serves: an LLMEngine with its EngineCore in a process of
    its own (unless --no-multiprocess-mode), or with --kv-transfer-config the front of a
    disaggregated pair (minivllm/engine/disagg/disagg_llm.py). On a CPU with no token budget
    given, the budget that keeps a step under --cpu-max-step-seconds is measured."""
    from minivllm.engine.llm_engine import LLMEngine
    kv = args.kv_transfer_config
    if kv is None:
        engine = LLMEngine(args.model, multiprocess_mode=args.multiprocess_mode,
                           **engine_kwargs(args))
        if (args.max_num_batched_tokens is None and engine.device.type == "cpu"
                and engine.vllm_config.scheduler_config.enable_chunked_prefill):
            from minivllm.entrypoints.step_budget import fit_step_budget
            print(f"minivllm: {fit_step_budget(engine, args.cpu_max_step_seconds)}", flush=True)
        return engine
    from minivllm.config import KVTransferConfig
    from minivllm.engine.disagg.disagg_llm import DisaggLLM, launch
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
    if args.headless and args.nnodes > 1:      # node k's ranks of a replica on node 0
        from minivllm.executor.multiproc_executor import run_node
        raise SystemExit(run_node(args.master_addr, args.master_port, args.node_rank))
    if args.headless:          # data-parallel replicas for a front end on another host
        from minivllm.engine.multiproc.core_proc import run_headless
        raise SystemExit(run_headless(args.data_parallel_address, args.data_parallel_rpc_port,
                                      args.data_parallel_start_rank,
                                      args.data_parallel_size_local or 1))

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
    api_key = args.api_key or os.environ.get("MINIVLLM_API_KEY")   # the env: not seen in ps
    try:
        if hasattr(engine, "structured_output"):      # not the front of a disaggregated pair
            engine.structured_output.compile_limits = (args.max_grammar_compile_seconds,
                                                       args.max_grammar_compile_memory_mb)
        Server(AsyncLLMEngine(engine), sock, name, api_key=api_key,
               log_level=args.uvicorn_log_level, max_request_body_mb=args.max_request_body_mb,
               max_prompts_per_request=args.max_prompts_per_request,
               disable_fastapi_docs=args.disable_fastapi_docs).run()
    except KeyboardInterrupt:     # uvicorn re-raises Ctrl-C after its clean shutdown
        pass
    finally:
        engine.shutdown()        # the core's process, or a disaggregated pair's consumer


def disagg(argv: list[str]) -> None:
    """`minivllm disagg`: both roles here (default), or one role of a two-machine pair."""
    from minivllm.engine.disagg import disagg_llm
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
    add_cli_args(p)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    kwargs = engine_kwargs(args)
    if args.role != "both" and args.kv_port is None:
        p.error("--kv-port is needed when the roles start apart")
    where = {"kv_ip": args.kv_ip, "kv_port": args.kv_port, "timeout": args.timeout}
    if args.role == "consumer":
        config = {"kv_role": "kv_consumer", "kv_ip": args.kv_ip, "kv_port": args.kv_port,
                  "kv_connector_extra_config": {"timeout": args.timeout}}
        return disagg_llm.run_decode_role(args.model, {**kwargs, "kv_transfer_config": config})
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
    make_arg_parser(sub.add_parser("serve", help="OpenAI-compatible HTTP server"))
    benchmarks.add_cli_args(sub.add_parser(
        "bench", help="benchmarks: serve (against a server), the offline ones, gpu and kernels",
        description="Every benchmark; `minivllm bench NAME --help` for its flags."))
    d = sub.add_parser("disagg", add_help=False, help="prefill and decode roles in two "
                       "processes (minivllm/engine/disagg/disagg_llm.py)")
    d.add_argument("rest", nargs=argparse.REMAINDER)
    simulator.add_cli_args(sub.add_parser(
        "simulate", help="the engine's scheduler on a simulated deployment (cost model)",
        description=simulator.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.command == "serve":
        serve(args)
    elif args.command == "simulate":
        simulator.run(args)
    else:
        benchmarks.run(args)


if __name__ == "__main__":
    main()
