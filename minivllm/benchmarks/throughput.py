"""`minivllm bench throughput`: a seeded mixed workload, minivllm against transformers.

vLLM twin: vllm/benchmarks/throughput.py (`vllm bench throughput`: offline, every request at
once, output tokens per second). Three runs of the same requests, EOS ignored so each produces
exactly its max_tokens:

    minivllm, continuous batching (the engine as it ships)
    minivllm, static batches of --static-batch (lesson 04's baseline: what continuous batching
              buys, apart from what the flat, unpadded batch buys)
    transformers' generate on padded static batches of each --hf-batch-sizes

    uv run minivllm bench throughput
    uv run minivllm bench throughput --num-requests 16 --hf-batch-sizes     # no transformers

Peak memory beside each (the CUDA allocator's peak, or the resident set on a CPU). Nothing here
asserts a speed. Leaves out vLLM's dataset choice (ShareGPT, sonnet, ...): the workload is
workloads.lognormal_requests, seeded.
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import torch


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


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--hf-batch-sizes", type=int, nargs="*", default=[8, 16, 32, 64],
                        help="transformers' static batch sizes to try (none: skip transformers)")
    parser.add_argument("--static-batch", type=int, default=32,
                        help="batch size of minivllm's own static-batching run")


def run(args: argparse.Namespace) -> None:
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
        served = serve(llm, requests)
    assert served.num_output_tokens == n_out, (served.num_output_tokens, n_out)
    print(f"minivllm      : {served.output_throughput:8.1f} output tok/s  "
          f"({served.elapsed:6.1f} s, {len(served.steps)} steps, KV utilization "
          f"{served.kv_utilization:.1%}, peak memory {mem.peak / 2**30:.2f} GiB)")

    # The same engine with continuous batching off: a new batch of static_batch requests is
    # admitted only when the previous batch has completely finished (lesson 04's baseline).
    # This separates what continuous batching buys from what the flat, unpadded batch buys.
    llm.reconfigure(scheduling="static", max_num_seqs=args.static_batch)
    static = serve(llm, requests)
    llm.reconfigure(scheduling="continuous", max_num_seqs=args.max_num_seqs)
    assert static.num_output_tokens == n_out
    print(f"minivllm      : {static.output_throughput:8.1f} output tok/s  "
          f"({static.elapsed:6.1f} s, {len(static.steps)} steps, static batches of "
          f"{args.static_batch}: continuous is {static.elapsed / served.elapsed:.2f}x faster)")
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
    print(f"ratio (minivllm / best transformers): {served.output_throughput / best:.2f}x")
