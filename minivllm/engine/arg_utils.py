"""The engine's command-line flags (vLLM twin: vllm/engine/arg_utils.py, EngineArgs.add_cli_args).

One place for the flags that configure an LLMEngine, with vLLM's names, so `minivllm serve`,
`minivllm disagg` and `minivllm bench serve --compare-offline` parse the same engine from the
same command line:

    add_cli_args(parser)   adds the group "engine (vLLM's flag names)"
    engine_kwargs(args)    the parsed flags as LLMEngine's keyword arguments

Leaves out vLLM's EngineArgs dataclass (a dict of keyword arguments is what LLMEngine takes)
and the ~150 flags minivllm has no mechanism for; a flag here is a knob the engine has.
"""

from __future__ import annotations

import argparse


def add_cli_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The engine's flags, with vLLM's names; `engine_kwargs` turns them into LLMEngine's."""
    g = parser.add_argument_group("engine (vLLM's flag names)")
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
    g.add_argument("--distributed-executor-backend", choices=("uni", "mp"), default=None,
                   help="uni: one process; mp: a process per rank (default with -tp > 1)")
    g.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs for decode")
    return parser


def engine_kwargs(args: argparse.Namespace) -> dict:
    """LLMEngine's keyword arguments from the flags `add_cli_args` added (vLLM's
    EngineArgs.from_cli_args; the one rename: --num-gpu-blocks-override is num_kv_blocks)."""
    return dict(dtype=args.dtype, device=args.device, max_model_len=args.max_model_len,
                max_num_seqs=args.max_num_seqs,
                max_num_batched_tokens=args.max_num_batched_tokens,
                block_size=args.block_size, enable_prefix_caching=args.enable_prefix_caching,
                gpu_memory_utilization=args.gpu_memory_utilization,
                num_kv_blocks=args.num_gpu_blocks_override,
                tensor_parallel_size=args.tensor_parallel_size, enforce_eager=args.enforce_eager,
                distributed_executor_backend=args.distributed_executor_backend)
