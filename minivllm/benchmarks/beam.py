"""`minivllm bench beam`: what beam search costs, counted (no vLLM twin).

    uv run minivllm bench beam
    uv run minivllm bench beam --beam-width 8 --max-tokens 32

Beam search the two ways, on the same prompts: V0's design (core/v0/beam_group.py: the beams fork
block tables inside the engine core, copy-on-write) and vLLM V1's (minivllm/beam_search.py:
each beam a one-token request whose prompt is its whole history) with the prefix cache on,
then off; against k independent greedy sequences of the same length from the same prompts
(EOS ignored, the cache off: k sequences that share nothing). Per row: engine steps, tokens
the forward passes computed, tokens found in the prefix cache, the most KV blocks in use at
once, the most of them held by more than one sequence, blocks copied on write, and wall
seconds, side by side in one run. The fork design computes each token once; V1's way gets the
shared history back from the cache, block by block, recomputing each beam's last partial block
every step; without the cache every beam recomputes its whole history at every step.
"""

from __future__ import annotations

import argparse
import time

PROMPTS = ["The capital of France is", "def fibonacci(n):\n    ", "1, 1, 2, 3, 5, 8,",
           "Once upon a time, in a small village by the sea,"]


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--beam-width", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=16)


def counted(llm, work) -> dict:
    """Run work() on `llm` and count what its engine did."""
    in_use, shared = [], []     # KV blocks held while each step runs (after it, they are freed)
    bm = llm.engine.block_manager
    copies = bm.num_copy_on_write

    def watch():
        in_use.append(bm.num_blocks - bm.num_free_blocks)
        shared.append(sum(1 for refs in bm.ref_counts if refs > 1))
    llm.engine.add_schedule_callback(watch)
    t0 = time.perf_counter()
    with llm.engine.trace() as steps:
        result = work()
    llm.engine.remove_schedule_callback(watch)
    return {"steps": len(steps), "computed": sum(s.num_batched_tokens for s in steps),
            "cached": steps[-1].stats.prefix_cache_hit_tokens, "peak blocks": max(in_use),
            "shared": max(shared), "copied": bm.num_copy_on_write - copies,
            "seconds": time.perf_counter() - t0, "result": result}


def run(args: argparse.Namespace) -> None:
    from minivllm import LLM, BeamSearchParams, SamplingParams
    from minivllm.config.scheduler import V0_SCHEDULER, V1_SCHEDULER
    llm = LLM(args.model, dtype=args.dtype, max_model_len=512, max_num_seqs=64)
    k, n = args.beam_width, args.max_tokens
    prompts = [llm.tokenizer.encode(p) for p in PROMPTS]
    beams = BeamSearchParams(beam_width=k, max_tokens=n, ignore_eos=True)
    greedy = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    llm.beam_search(prompts[:1], BeamSearchParams(beam_width=2, max_tokens=2))     # warm-up
    rows = {}
    llm.reconfigure(enable_prefix_caching=True, scheduler_cls=V0_SCHEDULER)   # V0's forks
    rows["beam search, V0's design: forks in the core"] = counted(
        llm, lambda: llm.beam_search(prompts, beams, method="fork"))
    for caching in (True, False):                               # a fresh, empty cache
        llm.reconfigure(enable_prefix_caching=caching, scheduler_cls=V1_SCHEDULER)
        rows[f"beam search, V1's way, cache {'on' if caching else 'off'}"] = counted(
            llm, lambda: llm.beam_search(prompts, beams))
    rows[f"{k} independent greedy sequences"] = counted(
        llm, lambda: llm.generate([p for p in prompts for _ in range(k)], greedy, use_tqdm=False))
    llm.reconfigure(enable_prefix_caching=True)
    print(f"{llm!r}\n{len(prompts)} prompts ({sum(map(len, prompts))} tokens), beam width {k}, "
          f"{n} tokens, EOS ignored")
    print(f"{'':<44} {'steps':>6} {'computed':>9} {'cached':>7} {'peak blocks':>11} "
          f"{'shared':>7} {'copied':>7} {'seconds':>8}")
    for name, r in rows.items():
        print(f"{name:<44} {r['steps']:>6} {r['computed']:>9} {r['cached']:>7} "
              f"{r['peak blocks']:>11} {r['shared']:>7} {r['copied']:>7} {r['seconds']:>8.2f}")
    fork, on, off, _ = rows.values()            # forks, V1 cache on, cache off, independent
    same = all([b.tokens for b in x.sequences] == [b.tokens for b in y.sequences]
               == [b.tokens for b in z.sequences]
               for x, y, z in zip(fork["result"], on["result"], off["result"]))
    print(f"V1's way computes {on['computed'] / fork['computed']:.1f}x the tokens of the forks "
          f"({off['computed'] / fork['computed']:.1f}x without the cache); the beams of all three "
          f"identical: {same}")
