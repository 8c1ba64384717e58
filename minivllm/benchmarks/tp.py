"""`minivllm bench tp`: all-reduce time against message size, and tp=1 against tp=N.

No vLLM twin (vLLM runs `bench throughput` once per --tensor-parallel-size). Leaves out
multi-GPU runs: here the ranks are processes on one machine, over gloo. --tp must divide the
model's KV heads (the packaged SmolLM2 has 3: tp 1 or 3).

    uv run minivllm bench tp                       # gloo all-reduce sizes, SmolLM2 tp=1 vs tp=3
    uv run minivllm bench tp --tp 3 --num-prompts 8 --max-tokens 32

All-reduce: ranks in processes on this machine, over gloo (loopback TCP), median of repeats,
beside what the same message would take on NVLink 4 (H100 SXM, 450 GB/s per direction) and on
PCIe 5.0 x16 (64 GB/s per direction), computed from bandwidth alone (a ring all-reduce moves
2 (N-1)/N of the message through each link; latency left out, so small messages look better
there than they are).

Throughput: the same greedy requests with tensor_parallel_size=1 and N. On one CPU, tp cannot
win: the N ranks share the same cores and the same memory bandwidth, so splitting the matmuls
divides no work that was not already spread over those cores, and every layer adds two
all-reduces through the kernel's TCP stack. tp pays where each rank brings its own GPU: its own
memory bandwidth for its 1/N of the weights, and its own HBM for 1/N of the KV cache.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time

import torch
import torch.distributed as dist

NVLINK4_BYTES_S = 450e9         # H100 SXM NVLink 4: 900 GB/s both directions, 450 each way
PCIE5_BYTES_S = 64e9            # PCIe 5.0 x16, one direction, nominal


def ring_all_reduce_seconds(nbytes: int, tp: int, bytes_per_s: float) -> float:
    """A ring all-reduce (reduce-scatter + all-gather) sends 2 (tp-1)/tp x nbytes per link."""
    return 2 * (tp - 1) / tp * nbytes / bytes_per_s


def _timed_all_reduces(group, sizes: list[int], repeats: int) -> dict[int, float]:
    out = {}
    for nbytes in sizes:
        x = torch.ones(max(1, nbytes // 4))                 # fp32
        group.all_reduce(x)                                 # warm up the connection
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            group.all_reduce(x)
            times.append(time.perf_counter() - t0)
        out[nbytes] = statistics.median(times)
    return out


def _worker(rank, size, port, sizes, repeats):
    from minivllm.distributed.parallel_state import TensorParallelGroup
    torch.set_num_threads(1)      # forked after OpenMP ran: more threads would hang (executor.py)
    store = dist.TCPStore("127.0.0.1", port, size, False, timeout=datetime.timedelta(seconds=120))
    _timed_all_reduces(TensorParallelGroup(rank, size, store, "gloo"), sizes, repeats)


def measure_all_reduce(sizes: list[int], tp: int = 2, repeats: int = 20) -> dict[int, float]:
    """Median seconds of a gloo all-reduce of each size (bytes, fp32), over tp processes."""
    from minivllm.distributed.parallel_state import TensorParallelGroup
    store = dist.TCPStore("127.0.0.1", 0, tp, True, wait_for_workers=False)
    ctx = torch.multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_worker, args=(r, tp, store.port, sizes, repeats), daemon=True)
             for r in range(1, tp)]
    for p in procs:
        p.start()
    try:
        return _timed_all_reduces(TensorParallelGroup(0, tp, store, "gloo"), sizes, repeats)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()


def tp_throughput(tp: int, num_prompts: int, max_tokens: int, model: str | None = None) -> dict:
    """Output tokens/s of the same greedy requests at tensor_parallel_size=tp."""
    from minivllm import LLM, SamplingParams
    t0 = time.perf_counter()
    llm = LLM(model, tensor_parallel_size=tp, max_model_len=512, num_kv_blocks=256)
    start = time.perf_counter() - t0
    prompts = [f"Write a short note about the number {i}." for i in range(num_prompts)]
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    llm.generate(prompts[:1], SamplingParams(max_tokens=2), use_tqdm=False)   # warm up
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - t0
    runner = llm.engine.runner
    res = {"tp": tp, "start_s": start, "tok_s": num_prompts * max_tokens / seconds,
           "tokens": [o.outputs[0].token_ids for o in outs],
           "weight_mib_per_rank": [b["total"] / 2**20 for b in getattr(
               llm.engine.model_executor, "rank_weight_bytes", [{"total": sum(
                   p.numel() * p.element_size() for p in runner.model.parameters())}])]}
    llm.engine.shutdown()
    return res


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tp", type=int, default=3)
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=20)


def run(args: argparse.Namespace) -> None:
    sizes = [1 << k for k in (10, 12, 14, 16, 18, 20, 22, 24)]       # 1 KiB .. 16 MiB
    print(f"all-reduce over gloo, 2 processes on this machine (median of {args.repeats}), "
          "beside bandwidth-only figures for 2 GPUs")
    print(f"{'bytes':>10}{'gloo us':>10}{'GB/s':>8}{'NVLink4 us':>12}{'PCIe5 us':>10}")
    for nbytes, s in measure_all_reduce(sizes, 2, args.repeats).items():
        print(f"{nbytes:>10}{1e6 * s:10.0f}{nbytes / s / 1e9:8.2f}"
              f"{1e6 * ring_all_reduce_seconds(nbytes, 2, NVLINK4_BYTES_S):12.2f}"
              f"{1e6 * ring_all_reduce_seconds(nbytes, 2, PCIE5_BYTES_S):10.2f}")
    one, many = (tp_throughput(n, args.num_prompts, args.max_tokens, args.model)
                 for n in (1, args.tp))
    print(f"\n{args.num_prompts} greedy requests x {args.max_tokens} tokens")
    for r in (one, many):
        print(f"  tp={r['tp']}: {r['tok_s']:6.1f} output tok/s, started in {r['start_s']:.1f} s,"
              f" weights per rank {', '.join(f'{m:.0f}' for m in r['weight_mib_per_rank'])} MiB")
    print(f"  tp={args.tp} / tp=1: {many['tok_s'] / one['tok_s']:.2f}x; same tokens: "
          f"{many['tokens'] == one['tokens']}")
