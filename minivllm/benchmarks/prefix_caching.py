"""`minivllm bench prefix`: prefix caching on against off, on two workloads that share prefixes.

vLLM twin: benchmarks/benchmark_prefix_caching.py (in vLLM's repository, beside the package;
the subcommand keeps minivllm's short name, `prefix`). The workloads:

    shared prefix   --num-questions questions behind one system prompt of --prefix-tokens
    conversation    --turns turns of a chat that grows, each turn resending the whole history

    uv run minivllm bench prefix
    uv run minivllm bench prefix --num-questions 16 --prefix-tokens 512

Per workload and setting: prompt tokens, tokens actually computed, the hit rate, mean TTFT and
output tokens/s, and whether the greedy outputs with and without the cache are identical (they
must be). Each workload is served once per setting, on a fresh cache. Leaves out vLLM's
random-prefix sampling and its ShareGPT-based workload.
"""

from __future__ import annotations

import argparse

import torch


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--prefix-tokens", type=int, default=1024, help="shared system prompt")
    parser.add_argument("--num-questions", type=int, default=32)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=16)


def run(args: argparse.Namespace) -> None:
    from minivllm import LLM
    from minivllm.benchmarks.workloads import conversation_requests, serve, shared_prefix_requests
    llm = LLM(args.model, dtype=args.dtype, max_model_len=args.max_model_len)
    tok = llm.tokenizer
    workloads = {
        "shared prefix": shared_prefix_requests(tok, args.num_questions, args.prefix_tokens,
                                                args.max_tokens),
        "conversation": conversation_requests(tok, args.turns, args.prefix_tokens // 2,
                                              args.max_tokens)}
    print(f"{llm!r}\nthreads={torch.get_num_threads()}  shared prefix: "
          f"{args.num_questions} questions behind {args.prefix_tokens} tokens; conversation: "
          f"{args.turns} turns over {args.prefix_tokens // 2} tokens; {args.max_tokens} output "
          "tokens per request, greedy, EOS ignored")
    serve(llm, workloads["shared prefix"][:1])                  # warm-up
    print(f"{'workload':<14} {'caching':>7} {'prompt tok':>10} {'computed':>9} "
          f"{'hit rate':>8} {'mean TTFT':>10} {'out tok/s':>9}")
    hit_tokens = {}
    for name, requests in workloads.items():
        ttft = {}
        tokens = {}
        for flag in (False, True):
            llm.reconfigure(enable_prefix_caching=flag)         # a fresh, empty cache
            served = serve(llm, requests)
            prompt_tokens = sum(len(o.prompt_token_ids) for o in served.outputs)
            hits = hit_tokens[name, flag] = served.steps[-1].stats.prefix_cache_hit_tokens
            ttft[flag] = sum(served.ttfts) / len(served.ttfts)
            tokens[flag] = [o.outputs[0].token_ids for o in served.outputs]
            print(f"{name:<14} {'on' if flag else 'off':>7} {prompt_tokens:>10} "
                  f"{prompt_tokens - hits:>9} {hits / prompt_tokens:>8.1%} "
                  f"{1000 * ttft[flag]:>8.0f}ms {served.output_throughput:>9.1f}")
        print(f"{'':<14} TTFT off/on: {ttft[False] / ttft[True]:.2f}x; identical outputs: "
              f"{tokens[False] == tokens[True]}")
    skipped = hit_tokens["shared prefix", True] / (args.num_questions * args.prefix_tokens)
    print(f"shared-prefix tokens skipped (all {args.num_questions} requests, the first "
          f"included): {skipped:.1%}")
