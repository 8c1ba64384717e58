"""Every `minivllm bench NAME` in one table (vLLM twin: vllm/entrypoints/cli/benchmark/main.py).

Each benchmark is a module with vLLM's two functions:

    add_cli_args(parser)   its own flags
    run(args)              measure and print

BENCHMARKS names them, with the line `minivllm bench --help` shows and the flags several of
them share (SHARED_ARGS: --model, --dtype, --seed), which are added here, once, to each
benchmark that takes them. The CLI (minivllm/entrypoints/cli.py) calls `add_cli_args` on its
`bench` parser and `run` on what it parsed. vLLM collects its subcommands by subclassing
BenchmarkSubcommandBase; a dict is the same table without the class hierarchy. Leaves out
vLLM's `bench sweep` and its multimodal benchmarks.
"""

from __future__ import annotations

import argparse

import minivllm.platforms  # noqa: F401, I001  (first: Triton's interpreter switch, before kernels/)
import kernels.bench as kernels_bench
from minivllm.benchmarks import (ablation, beam, cpu, disagg, gpu, guided, host, latency, load,
                                 lora)
from minivllm.benchmarks import compile as compile_bench     # (not the builtin `compile`)
from minivllm.benchmarks import (offload, parallel, prefix_caching, quant, routing, serve,
                                 spec)
from minivllm.benchmarks import throughput, tp

# The flags more than one benchmark takes, each defined once.
SHARED_ARGS = {
    "model": dict(default=None, help="checkpoint directory, .gguf file or hub id (default: "
                                     "the packaged SmolLM2-135M-Instruct)"),
    "dtype": dict(default="auto", help="auto (fp32 on CPU, bf16 on CUDA), float32, bfloat16, "
                                       "float16"),
    "seed": dict(type=int, default=0, help="seeds the workload"),
}

# `minivllm bench NAME`: (module, its line in --help, the SHARED_ARGS it takes)
BENCHMARKS = {
    "serve": (serve, "open-loop load test of an OpenAI-compatible server (HTTP)", ("seed",)),
    "throughput": (throughput, "mixed workload: minivllm (continuous, static) vs transformers' "
                               "generate", ("model", "dtype", "seed")),
    "decode": (latency, "decode tokens/s of one batch vs transformers' generate",
               ("model", "dtype")),
    "prefix": (prefix_caching, "prefix caching on vs off: shared system prompt, growing "
                               "conversation", ("model", "dtype")),
    "offload": (offload, "the CPU offloading tier off vs on: multi-turn chats that outgrow the "
                         "GPU pool, preemption under a small pool", ("model", "dtype")),
    "load": (load, "load time of the default model, first and cached", ()),
    "spec": (spec, "speculative decoding (n-gram) on vs off: repetitive and free-form text, "
                   "batch 1 and 8", ("model", "dtype")),
    "tp": (tp, "tensor parallelism: gloo all-reduce vs size; tp=1 vs tp=N", ("model",)),
    "parallel": (parallel, "pipeline parallelism: one process vs pp stages, 1 and pp batches "
                           "in flight; data parallelism: round-robin vs V1's score",
                 ("model",)),
    "routing": (routing, "data parallelism's routing: round-robin vs V1's load score vs "
                         "prefix-aware (the replicas' KV events) on multi-turn chats",
                ("model",)),
    "host": (host, "the host's share of a decode step: sync vs async scheduling, a tiny model "
                   "and the default", ()),
    "compile": (compile_bench, "decode step: op time vs Python, eager vs torch.compile",
                ("model",)),
    "guided": (guided, "guided decoding: grammar compile time, bitmask cost per step at batch 1 "
                       "and 32", ("model", "dtype")),
    "quant": (quant, "weight (int8/int4) and KV (int8/fp8) quantization: perplexity, "
                     "agreement, bytes, KV capacity, decode tok/s", ("model",)),
    "lora": (lora, "multi-LoRA: a mixed batch of N adapters vs one adapter at a time vs the "
                   "base model; memory per adapter", ("model", "dtype")),
    "beam": (beam, "beam search on forks (V0) vs V1's way (prefix cache on and off) vs k "
                   "independent greedy sequences: tokens computed, blocks shared and copied",
             ("model", "dtype")),
    "ablation": (ablation, "one workload, each mechanism switched off in turn", ("model",)),
    "disagg": (disagg, "prefill/decode split vs colocated: running decodes while long prompts "
                       "arrive", ("model",)),
    "cpu": (cpu, "the CPU path: fp32/bf16 vs transformers, step breakdown, batch-1 roofline",
            ("model",)),
    "gpu": (gpu, "the engine on a CUDA GPU: random weights of real shapes vs transformers",
            ()),
    "kernels": (kernels_bench, "the Triton attention kernels on a CUDA GPU vs SDPA (GB/s, "
                               "TFLOP/s)", ()),
}


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    """One subcommand per benchmark under `parser` (the CLI's `bench`)."""
    sub = parser.add_subparsers(dest="benchmark", required=True, metavar="NAME")
    for name, (module, line, shared) in BENCHMARKS.items():
        p = sub.add_parser(name, help=line, description=module.__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        for flag in shared:
            p.add_argument(f"--{flag}", **SHARED_ARGS[flag])
        module.add_cli_args(p)


def run(args: argparse.Namespace) -> None:
    module = BENCHMARKS[args.benchmark][0]
    module.run(args)
