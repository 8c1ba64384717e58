"""`minivllm bench offload`: the CPU offloading tier (minivllm/kv_offload/) off against on.

vLLM twin: none in vLLM's benchmarks/ for the tier alone (its measurements are in the
offloading connector's blog post: TTFT on prefixes that no longer fit the GPU). Two workloads,
each served with the tier off and on, on the same small GPU pool:

    multi-turn   --conversations chats of --turns turns at once, each behind a system prompt
                 of its own: their histories together are several times the GPU pool, so a
                 chat's next turn finds its prefix evicted from the GPU, and in the tier
    preemption   --requests requests admitted while their prompts fit, on a pool too small
                 for their answers: recompute preemption computes a preempted request
                 again, the tier loads its full blocks back

    uv run minivllm bench offload
    uv run minivllm bench offload --num-kv-blocks 48 --kv-offloading-size 1

Per workload and setting: prompt tokens, tokens computed in prefill (recomputes included),
prompt tokens found in each tier (GPU prefix cache, CPU tier), TTFT p50 and p90 (ms and
steps), output tokens/s, preemptions, and whether the outputs are identical (they must be).
"""

from __future__ import annotations

import argparse
import statistics


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--num-kv-blocks", type=int, default=64, help="the GPU pool, in blocks")
    parser.add_argument("--kv-offloading-size", type=float, default=0.5,
                        help="the CPU tier, GiB")
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--system-tokens", type=int, default=256)
    parser.add_argument("--requests", type=int, default=12, help="the preemption workload's")
    parser.add_argument("--max-tokens", type=int, default=16)


def quantile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=10, method="inclusive")[int(q * 10) - 1] \
        if len(values) > 1 else values[0]


def run(args: argparse.Namespace) -> None:
    from minivllm import LLM
    from minivllm.benchmarks.workloads import (Request, _greedy, multi_turn_requests, serve,
                                               tool_catalog_prompt)
    llm = LLM(args.model, dtype=args.dtype, max_model_len=2048, num_kv_blocks=args.num_kv_blocks)
    tok = llm.tokenizer
    long_requests = [Request(tool_catalog_prompt(tok, f"Agent{i}", args.system_tokens // 2),
                             _greedy(4 * args.max_tokens)) for i in range(args.requests)]
    workloads = {"multi-turn": multi_turn_requests(tok, args.conversations, args.turns,
                                                   args.system_tokens, args.max_tokens),
                 "preemption": long_requests}
    bs = llm.engine.vllm_config.cache_config.block_size
    print(f"{llm!r}\nGPU pool: {args.num_kv_blocks} blocks of {bs} tokens; CPU tier: "
          f"{args.kv_offloading_size} GiB. multi-turn: {args.conversations} chats x "
          f"{args.turns} turns behind {args.system_tokens}-token system prompts; preemption: "
          f"{args.requests} requests of ~{args.system_tokens // 2} prompt tokens, "
          f"{4 * args.max_tokens} out. Greedy, EOS ignored.")
    print(f"{'workload':<11} {'tier':>4} {'prompt':>7} {'computed':>8} {'GPU hit':>7} "
          f"{'CPU hit':>7} {'TTFT p50':>9} {'p90':>7} {'steps p50':>9} {'p90':>4} "
          f"{'out tok/s':>9} {'preempt':>7}")
    for name, requests in workloads.items():
        tokens, moved = {}, {}
        for size in (None, args.kv_offloading_size):
            llm.reconfigure(num_kv_blocks=args.num_kv_blocks, kv_offloading_size=size)
            served = serve(llm, requests)
            prompt = sum(len(o.prompt_token_ids) for o in served.outputs)
            computed = sum(s.num_tokens for step in served.steps for s in step.scheduled
                           if s.is_prefill)
            stats = served.steps[-1].stats        # counted since the reconfigure
            gpu_hits = stats.prefix_cache_hit_tokens
            cpu_hits = stats.external_prefix_cache_hit_tokens
            moved[size] = (stats.kv_offload_store_bytes, stats.kv_offload_load_bytes)
            ttft = [1000 * t for t in served.ttfts]
            steps = served.ttft_steps
            tokens[size] = [o.outputs[0].token_ids for o in served.outputs]
            print(f"{name:<11} {'on' if size else 'off':>4} {prompt:>7} {computed:>8} "
                  f"{gpu_hits:>7} {cpu_hits:>7} {quantile(ttft, .5):>7.0f}ms "
                  f"{quantile(ttft, .9):>5.0f}ms {quantile(steps, .5):>9.0f} "
                  f"{quantile(steps, .9):>4.0f} {served.output_throughput:>9.1f} "
                  f"{llm.engine.scheduler.num_preemptions:>7}")
        stored, loaded = moved[args.kv_offloading_size]
        print(f"{'':<11} identical outputs: {tokens[None] == tokens[args.kv_offloading_size]}; "
              f"the tier stored {stored / 2**20:.1f} MiB, loaded {loaded / 2**20:.1f} MiB")
