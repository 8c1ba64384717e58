"""Benchmarks that print numbers, minivllm and transformers side by side in one invocation.

    uv run python -m minivllm.benchmarks.bench load               # default model: first and cached load
    uv run python -m minivllm.benchmarks.bench decode             # decode tok/s at batch 1 and 8 vs HF
    uv run python -m minivllm.benchmarks.bench throughput         # a mixed workload, minivllm vs HF
    uv run python -m minivllm.benchmarks.bench prefix             # prefix caching on vs off
    uv run python -m minivllm.benchmarks.bench spec               # speculative decoding on vs off
    uv run python -m minivllm.benchmarks.bench guided             # guided decoding: compile, mask cost
    uv run python -m minivllm.benchmarks.bench quant              # int8/int4 weights, int8/fp8 KV cache
    uv run python -m minivllm.benchmarks.bench lora               # N LoRA adapters mixed vs one by one

Same weights (the converted checkpoint), same dtype, same prompts, greedy, EOS ignored so both
produce exactly max_tokens per sequence. Each measurement is the best of --repeats runs after a
warm-up run. Nothing here asserts a speed: the numbers are for reading. (`prefix` and `spec`
compare minivllm with itself, on two workloads; each is served once per engine; `spec` lives
in minivllm/benchmarks/spec.py.)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time

import torch


def _timed(fn, repeats: int) -> float:
    fn()                                        # warm-up: allocator, caches, lazy imports
    best = float("inf")
    for _ in range(repeats):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


def bench_load(args) -> None:
    """Load the packaged model twice in fresh processes: into an empty cache, then cached."""
    code = ("import time; t = time.perf_counter(); from minivllm import LLM; llm = LLM(); "
            "print(f'{time.perf_counter() - t:.2f}')")
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "MINIVLLM_CACHE": cache}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        times = [float(subprocess.run([sys.executable, "-c", code], env=env, check=True,
                                      capture_output=True, text=True).stdout.split()[-1])
                 for _ in range(2)]
    print(f"default model load, first (GGUF -> cache): {times[0]:6.2f} s")
    print(f"default model load, cached:                {times[1]:6.2f} s")


def _prompt_batch(tokenizer, batch: int, prompt_len: int) -> list[list[int]]:
    """`batch` different prompts of exactly prompt_len tokens (no padding needed anywhere)."""
    text = ("The history of computing is a story of memory and bandwidth. Engineers learned "
            "again and again that moving data costs more than computing on it. ") * 20
    ids = tokenizer.encode(text)
    return [ids[i * 7: i * 7 + prompt_len] for i in range(batch)]


def hf_generate_fn(model, prompts: list[list[int]], max_tokens: int):
    ids = torch.tensor(prompts, device=model.device)

    def run():
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                                 pad_token_id=0)
        assert out.shape[1] == ids.shape[1] + max_tokens
    return run


def bench_decode(args) -> None:
    from transformers import AutoModelForCausalLM

    from minivllm import LLM, SamplingParams
    llm = LLM(args.model, dtype=args.dtype, max_model_len=args.prompt_len + args.max_tokens + 16)
    hf = AutoModelForCausalLM.from_pretrained(llm.engine.model_path, dtype=llm.engine.dtype)
    hf = hf.to(llm.engine.device).eval()
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    print(f"{llm!r}\nthreads={torch.get_num_threads()}  prompt={args.prompt_len} tokens  "
          f"output={args.max_tokens} tokens/seq  best of {args.repeats}")
    print(f"{'batch':>5} {'minivllm tok/s':>15} {'transformers tok/s':>19} {'ratio':>6}")
    for batch in args.batch_sizes:
        prompts = _prompt_batch(llm.tokenizer, batch, args.prompt_len)
        ours = _timed(lambda: llm.generate(prompts, params, use_tqdm=False), args.repeats)
        theirs = _timed(hf_generate_fn(hf, prompts, args.max_tokens), args.repeats)
        n = batch * args.max_tokens
        print(f"{batch:>5} {n / ours:>15.1f} {n / theirs:>19.1f} {theirs / ours:>6.2f}x")


class PeakMemory:
    """Peak memory while the block runs: CUDA allocator peak, or the process's resident set
    sampled every 5 ms on a CPU."""

    def __enter__(self):
        self.peak = 0
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        else:
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self):
        page = os.sysconf("SC_PAGE_SIZE")
        while not self._stop.wait(0.005):
            with open("/proc/self/statm") as f:
                self.peak = max(self.peak, int(f.read().split()[1]) * page)

    def __exit__(self, *exc):
        if torch.cuda.is_available():
            self.peak = torch.cuda.max_memory_allocated()
        else:
            self._stop.set()
            self._thread.join()


def run_hf_static(model, requests, batch_size: int, pad_id: int) -> int:
    """transformers' generate on padded static batches (arrival order), EOS ignored: each
    batch runs until its longest request is done. Returns the useful tokens produced."""
    useful = 0
    workload = [(r.prompt, r.params.max_tokens) for r in requests]
    for start in range(0, len(workload), batch_size):
        chunk = workload[start:start + batch_size]
        width = max(len(ids) for ids, _ in chunk)
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p, _ in chunk])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in chunk])
        new = max(o for _, o in chunk)
        with torch.no_grad():
            model.generate(ids.to(model.device), attention_mask=mask.to(model.device),
                           do_sample=False, max_new_tokens=new, min_new_tokens=new,
                           pad_token_id=pad_id)
        useful += sum(o for _, o in chunk)
    return useful


def bench_throughput(args) -> None:
    from transformers import AutoModelForCausalLM

    from minivllm import LLM
    from minivllm.benchmarks.workloads import lognormal_requests, serve
    llm = LLM(args.model, dtype=args.dtype, max_model_len=1100,
              max_num_seqs=args.max_num_seqs)
    requests = lognormal_requests(llm.tokenizer, args.num_requests, seed=args.seed)
    n_out = sum(r.params.max_tokens for r in requests)
    print(f"{llm!r}\nthreads={torch.get_num_threads()}  {len(requests)} requests, "
          f"{sum(len(r.prompt) for r in requests)} prompt tokens, {n_out} output tokens "
          f"(seed {args.seed}, EOS ignored)")
    serve(llm, requests[:4])                                    # warm-up
    with PeakMemory() as mem:
        run = serve(llm, requests)
    assert run.num_output_tokens == n_out, (run.num_output_tokens, n_out)
    print(f"minivllm      : {run.output_throughput:8.1f} output tok/s  ({run.elapsed:6.1f} s, "
          f"{len(run.steps)} steps, KV utilization {run.kv_utilization:.1%}, peak memory "
          f"{mem.peak / 2**30:.2f} GiB)")

    # The same engine with continuous batching off: a new batch of static_batch requests is
    # admitted only when the previous batch has completely finished (lesson 04's baseline).
    # This separates what continuous batching buys from what the flat, unpadded batch buys.
    llm.reconfigure(scheduling="static", max_num_seqs=args.static_batch)
    static = serve(llm, requests)
    llm.reconfigure(scheduling="continuous", max_num_seqs=args.max_num_seqs)
    assert static.num_output_tokens == n_out
    print(f"minivllm      : {static.output_throughput:8.1f} output tok/s  "
          f"({static.elapsed:6.1f} s, {len(static.steps)} steps, static batches of "
          f"{args.static_batch}: continuous is {static.elapsed / run.elapsed:.2f}x faster)")
    if not args.hf_batch_sizes:
        return

    hf = AutoModelForCausalLM.from_pretrained(llm.engine.model_path, dtype=llm.engine.dtype)
    hf = hf.to(llm.engine.device).eval()
    pad = llm.tokenizer.pad_token_id or 0
    best = None
    for bs in args.hf_batch_sizes:
        run_hf_static(hf, requests[:2], 2, pad)                 # warm-up
        with PeakMemory() as mem:
            t0 = time.perf_counter()
            useful = run_hf_static(hf, requests, bs, pad)
            secs = time.perf_counter() - t0
        print(f"transformers  : {useful / secs:8.1f} output tok/s  ({secs:6.1f} s, static "
              f"batches of {bs}, peak memory {mem.peak / 2**30:.2f} GiB)")
        best = max(best or 0, useful / secs)
    print(f"ratio (minivllm / best transformers): {run.output_throughput / best:.2f}x")


def bench_prefix(args) -> None:
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
        ttft, tokens = {}, {}
        for flag in (False, True):
            llm.reconfigure(enable_prefix_caching=flag)         # a fresh, empty cache
            run = serve(llm, requests)
            prompt_tokens = sum(len(o.prompt_token_ids) for o in run.outputs)
            hits = hit_tokens[name, flag] = run.steps[-1].stats.prefix_cache_hit_tokens
            ttft[flag] = sum(run.ttfts) / len(run.ttfts)
            tokens[flag] = [o.outputs[0].token_ids for o in run.outputs]
            print(f"{name:<14} {'on' if flag else 'off':>7} {prompt_tokens:>10} "
                  f"{prompt_tokens - hits:>9} {hits / prompt_tokens:>8.1%} "
                  f"{1000 * ttft[flag]:>8.0f}ms {run.output_throughput:>9.1f}")
        print(f"{'':<14} TTFT off/on: {ttft[False] / ttft[True]:.2f}x; identical outputs: "
              f"{tokens[False] == tokens[True]}")
    skipped = hit_tokens["shared prefix", True] / (args.num_questions * args.prefix_tokens)
    print(f"shared-prefix tokens skipped (all {args.num_questions} requests, the first "
          f"included): {skipped:.1%}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m minivllm.benchmarks.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("load", help="load time of the default model, first and cached")
    p = sub.add_parser("decode", help="decode tokens/s vs transformers' generate")
    p.add_argument("--model", default=None, help="checkpoint dir, .gguf or hub id "
                                                 "(default: the packaged SmolLM2)")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p = sub.add_parser("throughput", help="mixed workload: minivllm vs transformers' generate")
    p.add_argument("--model", default=None)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--hf-batch-sizes", type=int, nargs="*", default=[8, 16, 32, 64],
                   help="transformers' static batch sizes to try (none: skip transformers)")
    p.add_argument("--static-batch", type=int, default=32,
                   help="batch size of minivllm's own static-batching run")
    p.add_argument("--seed", type=int, default=0)
    p = sub.add_parser("prefix", help="prefix caching on vs off: shared system prompt, "
                                      "growing conversation")
    p.add_argument("--model", default=None)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--prefix-tokens", type=int, default=1024, help="shared system prompt")
    p.add_argument("--num-questions", type=int, default=32)
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=16)
    from minivllm.benchmarks import ablation as bench_ablation
    from minivllm.benchmarks import compile as bench_compile
    from minivllm.benchmarks import guided as bench_guided
    from minivllm.benchmarks import lora as bench_lora_module
    from minivllm.benchmarks import quant as bench_quant
    from minivllm.benchmarks import tp as bench_tp
    from minivllm.benchmarks.spec import add_parser, bench_spec
    add_parser(sub)
    from minivllm.benchmarks.lora import bench_lora
    for module in (bench_tp, bench_compile, bench_guided, bench_quant, bench_lora_module,
                   bench_ablation):
        module.add_parser(sub)
    args = parser.parse_args(argv)
    {"load": bench_load, "decode": bench_decode, "throughput": bench_throughput,
     "prefix": bench_prefix, "spec": bench_spec, "tp": bench_tp.bench_tp,
     "compile": bench_compile.bench_compile, "guided": bench_guided.bench_guided,
     "quant": bench_quant.bench_quant, "lora": bench_lora,
     "ablation": bench_ablation.bench_ablation}[args.command](args)


if __name__ == "__main__":
    main()
