"""`minivllm bench ablation`: one workload, the engine with each mechanism switched off in turn.

No vLLM twin (see the end of this docstring).

    uv run minivllm bench ablation                       # SmolLM2, 32 requests
    uv run minivllm bench ablation --num-requests 16 --max-model-len 512

The series ranks serving optimizations by their throughput impact; this tests the ranking on
this engine instead of asserting it. One seeded workload (log-normal prompt and output
lengths behind a shared system prompt, all arriving at once, greedy, EOS ignored) is served by
the full engine, then once with each mechanism off, over the same weights and the same bytes
of KV memory:

    paging              kv_layout="contiguous": one max_model_len slab per request
    continuous batching scheduling="static": a new batch only when the last one is done
    chunked prefill     enable_chunked_prefill=False (the token budget must then hold a whole
                        prompt: max_num_batched_tokens = max_model_len)
    prefix caching      enable_prefix_caching=False

Per row: engine steps, prompt tokens computed, output tokens per step (counts, the same on
every machine), output tokens/s (this machine's, noisy when it is shared), and each against
the full engine. Every row must produce the same tokens: a mechanism changes when work is
done, never what is computed. Part II's mechanisms (speculative decoding, quantization, CUDA
graphs, tensor parallelism) have their own benchmarks and are not on this ladder yet; vLLM
has no such ladder (its benchmarks compare whole configurations). Lesson 17 runs the ladder at
a small size and checks its counts; the site's Optimization catalog shows that run.
"""

from __future__ import annotations

import argparse

RUNGS = {                       # name -> the engine settings that switch one mechanism off
    "full engine": {},
    "no paging": {"kv_layout": "contiguous"},
    "no continuous batching": {"scheduling": "static"},
    "no chunked prefill": {"enable_chunked_prefill": False},
    "no prefix caching": {"enable_prefix_caching": False},
}


def ablation_workload(tokenizer, num_requests: int, system_tokens: int = 64, seed: int = 0,
                      prompt=(4.0, 0.7, 16, 200), output=(3.0, 0.6, 4, 64)):
    """Log-normal requests (by default prompts 16-200, outputs 4-64 tokens; lognormal_requests'
    (mu, sigma, min, max)) behind one system prompt."""
    from minivllm.benchmarks.workloads import Request, lognormal_requests, tool_catalog_prompt
    system = tool_catalog_prompt(tokenizer, "AblationBot", system_tokens)
    return [Request(system + r.prompt, r.params) for r in lognormal_requests(
        tokenizer, num_requests, prompt=prompt, output=output, seed=seed)]


def ablation_ladder(llm, requests, *, max_model_len: int = 512, slabs: int = 8,
                    max_num_seqs: int = 16, budget: int = 256) -> dict[str, dict]:
    """Serve `requests` once per rung; returns {rung: counts, seconds and tokens}. The KV
    budget is `slabs` slabs of max_model_len for every rung (paged: the same bytes in blocks).
    The engine's settings are put back afterwards."""
    from minivllm.core.kv_cache import kv_bytes_per_token
    from minivllm.benchmarks.workloads import serve
    engine = llm.engine
    kv_bytes = slabs * max_model_len * kv_bytes_per_token(engine.model_config, engine.dtype)
    base = dict(max_model_len=max_model_len, max_num_seqs=max_num_seqs, kv_layout="paged",
                kv_cache_memory=kv_bytes, num_kv_blocks=None, scheduling="continuous",
                enable_chunked_prefill=True, max_num_batched_tokens=budget,
                enable_prefix_caching=True)
    rows = {}
    before = {k: getattr(engine.config, k) for k in base}
    for name, off in RUNGS.items():
        settings = base | off
        if not settings["enable_chunked_prefill"]:
            settings["max_num_batched_tokens"] = max_model_len
        res = serve(llm.reconfigure(**settings), requests)
        rows[name] = {"steps": len(res.steps),
                      "prefill_tokens": sum(s.num_prefill_tokens for s in res.steps),
                      "output_tokens": res.num_output_tokens,
                      "tokens_per_step": res.num_output_tokens / len(res.steps),
                      "tokens_per_s": res.output_throughput, "seconds": res.elapsed,
                      "max_running": max(s.stats.num_running for s in res.steps),
                      "largest_step": max(s.num_batched_tokens for s in res.steps),
                      "tokens": [o.outputs[0].token_ids for o in res.outputs]}
    llm.reconfigure(**before)
    return rows


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--max-model-len", type=int, default=512)
    parser.add_argument("--slabs", type=int, default=8, help="KV budget, in max_model_len slabs")
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--max-num-batched-tokens", type=int, default=256)


def run(args: argparse.Namespace) -> None:
    from minivllm import LLM
    llm = LLM(args.model, max_model_len=args.max_model_len)
    requests = ablation_workload(llm.tokenizer, args.num_requests)
    ablation_ladder(llm, ablation_workload(llm.tokenizer, 2, seed=1),    # warm-up
                    max_model_len=args.max_model_len)
    rows = ablation_ladder(llm, requests, max_model_len=args.max_model_len, slabs=args.slabs,
                           max_num_seqs=args.max_num_seqs, budget=args.max_num_batched_tokens)
    full = rows["full engine"]
    print(f"{llm}\n{args.num_requests} requests, KV budget {args.slabs} x "
          f"{args.max_model_len} tokens, max_num_seqs {args.max_num_seqs}, token budget "
          f"{args.max_num_batched_tokens}\n")
    print(f"{'rung':<24}{'steps':>6}{'prefill tok':>12}{'at once':>8}{'tok/step':>9}"
          f"{'tok/s':>8}{'steps x':>8}{'tok/s x':>8}  same tokens")
    for name, r in rows.items():
        print(f"{name:<24}{r['steps']:6d}{r['prefill_tokens']:12d}{r['max_running']:8d}"
              f"{r['tokens_per_step']:9.2f}{r['tokens_per_s']:8.1f}"
              f"{r['steps'] / full['steps']:8.2f}{full['tokens_per_s'] / r['tokens_per_s']:8.2f}"
              f"  {r['tokens'] == full['tokens']}")
    print("\nsteps x = steps / the full engine's (counted); tok/s x = the full engine's tokens/s "
          "/ this rung's (timed: above 1, switching the mechanism off cost throughput).")
