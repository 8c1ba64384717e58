"""`minivllm bench routing`: which replica a request goes to, under data parallelism
(minivllm/routing.py): round-robin vs vLLM V1's load score vs prefix-aware routing from the
replicas' KV events, on a multi-turn chat workload, side by side in one run.

vLLM twin: none in vLLM's benchmarks/ (routers built on its KV events, llm-d's and the
production-stack's, measure TTFT on multi-turn traffic the same way). The workload: --conversations
chats of --turns turns at once, each behind a system prompt of its own, every turn resending
its chat's whole history; a chat's next turn arrives when its last answer is done.

    uv run minivllm bench routing
    uv run minivllm bench routing --dp 2 --conversations 8 --turns 4
    uv run minivllm simulate --compare-routing -dp 8     # the same policies at scale, simulated

Per policy: prompt tokens, tokens computed in prefill, prompt tokens found in the prefix cache
(RequestOutput.num_cached_tokens, summed) and the hit rate, TTFT p50 and p90 (ms and steps),
output tokens/s, requests per replica, the share of later turns that stayed on their chat's
replica, and whether the outputs are the first policy's (they must be).
"""

from __future__ import annotations

import argparse
from collections import Counter

from minivllm.benchmarks.offload import quantile

POLICIES = ("round_robin", "score", "prefix")


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dp", type=int, default=2, help="replicas")
    parser.add_argument("--num-kv-blocks", type=int, default=256, help="each replica's pool")
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--system-tokens", type=int, default=192)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--think-time", type=float, default=0.0,
                        help="seconds a user waits after an answer before the next turn")


def rotating_chats(llm, num_chats: int = 3, num_turns: int = 3, max_tokens: int = 4) -> dict:
    """Chats on a data-parallel LLM, each turn's prompt the chat's whole history (its last
    prompt, the answer, the next message); a round's turns are sent together in an order that
    rotates every round, so the load score, which places them by arrival order alone, moves
    chats between replicas. -> `where`: per chat, its turns' replicas; `expected`: the cached
    tokens the router expected for each later turn; `sent`: every prompt with its tokens, in
    the order sent; `hits`: the replicas' prefix-cache hit tokens since the last reconfigure."""
    from minivllm import SamplingParams
    client, tok = llm.engine.engine_core, llm.tokenizer
    greedy = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    history = [tok.encode(f"Chat {c}: " + " ".join(f"note{c}x{j}" for j in range(12)))
               for c in range(num_chats)]
    where: dict[int, list[int]] = {c: [] for c in range(num_chats)}
    expected, sent = [], []
    for turn in range(num_turns):
        order = [(turn + k) % num_chats for k in range(num_chats)]
        outs = llm.generate([history[c] for c in order], greedy, use_tqdm=False)
        for c, choice, out in zip(order, list(client.router.choices)[-num_chats:], outs):
            where[c].append(choice.rank)
            expected += [choice.expected_cached_tokens] if turn else []
            sent.append((history[c], list(out.outputs[0].token_ids)))
            history[c] = history[c] + sent[-1][1] + tok.encode(f" And {turn}?")
    hits = sum(s.prefix_cache_hit_tokens for s in client.replica_stats(fresh=True))
    return {"where": where, "expected": expected, "sent": sent, "hits": hits}


def run(args: argparse.Namespace) -> None:
    from minivllm import LLM
    from minivllm.benchmarks.workloads import multi_turn_requests, serve
    llm = LLM(args.model, data_parallel_size=args.dp, max_model_len=2048,
              num_kv_blocks=args.num_kv_blocks,
              kv_events_config={"enable_kv_cache_events": True})
    client = llm.engine.engine_core
    requests = multi_turn_requests(llm.tokenizer, args.conversations, args.turns,
                                   args.system_tokens, args.max_tokens, args.think_time)
    print(f"{llm!r}\ndp={args.dp}, {args.num_kv_blocks} blocks a replica; {args.conversations} "
          f"chats x {args.turns} turns behind {args.system_tokens}-token system prompts, "
          f"{args.max_tokens} tokens an answer. Greedy, EOS ignored.")
    print(f"{'policy':<12} {'prompt':>7} {'computed':>8} {'cached':>7} {'hit':>5} "
          f"{'TTFT p50':>9} {'p90':>7} {'steps p50':>9} {'p90':>4} {'out tok/s':>9} "
          f"{'per replica':>12} {'stayed':>6}")
    tokens = {}
    try:
        for policy in POLICIES:
            llm.reset_prefix_cache()                  # every replica, and the router's index
            client.balance = policy
            served = serve(llm, requests)
            choices = list(client.router.choices)[-len(requests):]
            rank = {c.request_id: c.rank for c in choices}
            replica = [rank[o.request_id] for o in served.outputs]   # in request order
            stayed = [replica[i] == replica[r.follows] for i, r in enumerate(requests)
                      if r.follows is not None]
            prompt = sum(len(o.prompt_token_ids) for o in served.outputs)
            cached = sum(o.num_cached_tokens for o in served.outputs)
            computed = sum(s.num_tokens for step in served.steps for s in step.scheduled
                           if s.is_prefill)
            ttft = [1000 * t for t in served.ttfts]
            per_replica = Counter(replica)
            tokens[policy] = [o.outputs[0].token_ids for o in served.outputs]
            print(f"{policy:<12} {prompt:>7} {computed:>8} {cached:>7} {cached / prompt:>5.0%} "
                  f"{quantile(ttft, .5):>7.0f}ms {quantile(ttft, .9):>5.0f}ms "
                  f"{quantile(served.ttft_steps, .5):>9.0f} {quantile(served.ttft_steps, .9):>4.0f}"
                  f" {served.output_throughput:>9.1f} "
                  f"{'/'.join(str(per_replica[r]) for r in range(args.dp)):>12} "
                  f"{sum(stayed) / len(stayed):>6.0%}")
    finally:
        client.balance = "score"
        llm.engine.shutdown()
    same = all(t == tokens[POLICIES[0]] for t in tokens.values())
    print(f"identical outputs under every policy: {same}")
