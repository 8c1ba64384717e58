"""`minivllm bench cpu`: the CPU path at the machine's limit, in one invocation: throughput
against transformers in fp32 and bf16, where a step's time goes, and batch-1 decode against
the bandwidth roofline. No vLLM twin (vLLM's CPU backend has no benchmark of its own).

    minivllm bench cpu                          # 48 held-out requests, fp32 and bf16
    minivllm bench cpu --num-prompts 16 --dtypes float32 --hf-batch-sizes 8
    minivllm bench cpu --max-num-seqs 16        # the engine capped at transformers' batch

For each dtype, side by side in the same process:
  * the held-out mixed workload (prompts 16-192 tokens, outputs 8-160, EOS ignored, seed 1:
    not the seed the other benchmarks tune on) served by minivllm, by minivllm with the padded
    reference attention (attention.USE_REFERENCE, the path before kernels/cpu_attention.py),
    and by transformers' generate at each static batch size given (its best is the baseline;
    the default sizes include 48, the whole workload in one batch). minivllm runs with the
    engine's defaults, as a new user would: up to 64 sequences a step;
  * the end-to-end FLOP rate (2 x linear params x tokens processed, plus the LM head for each
    output token, over time) against a measured matmul peak (minivllm/benchmarks/roofline.py), and
    against the same linears timed alone at the run's step shapes: the rate the engine would
    reach if attention, norms and Python cost nothing (`matmul_ceiling`);
  * a torch.profiler breakdown of serving steps: matmul, attention (SDPA, K/V gathers and
    writes) and everything else, by each op's own CPU time;
  * batch-1 decode tok/s against its roofline, weight bytes over measured copy bandwidth, and
    against its GEMVs alone.

Whether the CPU has bf16 units (avx512_bf16 / amx) is printed: without them bf16 matmuls are
emulated and slower than fp32, so on such a CPU the engine's "auto" dtype stays fp32.

Leaves out the GPU: `minivllm bench gpu` (minivllm/benchmarks/gpu.py).
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from pathlib import Path

import torch
from torch import nn

import minivllm.attention.layer as attention
from minivllm.benchmarks.roofline import StepCost, measure_peaks
from minivllm.benchmarks.throughput import run_hf_static
from minivllm.benchmarks.workloads import lognormal_requests, serve
from minivllm.sampling_params import SamplingParams


def cpu_has_bf16_units() -> bool:
    """avx512_bf16 or AMX-BF16 in /proc/cpuinfo (Linux); False when it cannot tell."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def held_out_requests(tokenizer, num: int):
    return lognormal_requests(tokenizer, num, prompt=(4.3, 0.6, 16, 192),
                              output=(4.0, 0.8, 8, 160), seed=1)


def step_breakdown(llm, requests) -> dict[str, float]:
    """Share of own CPU time per kind of op while serving `requests`."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        serve(llm, requests)
    kinds = {"matmul": 0.0, "attention": 0.0, "other": 0.0}
    for e in prof.key_averages():
        name = e.key
        if name in ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear"):
            kinds["matmul"] += e.self_cpu_time_total
        elif "scaled_dot_product" in name or name in ("aten::index", "aten::index_copy_",
                                                        "aten::index_put_"):
            kinds["attention"] += e.self_cpu_time_total
        else:
            kinds["other"] += e.self_cpu_time_total
    total = sum(kinds.values())
    return {k: v / total for k, v in kinds.items()}


def read_bandwidth(threads: int, mib: int = 256) -> float:
    """Bytes/s of summing `mib` MiB of fp32 on `threads` threads: what a GEMV can stream."""
    x = torch.ones(mib * 2**18)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        x.sum()
        return max(x.numel() * 4 / _timed(x.sum) for _ in range(3))
    finally:
        torch.set_num_threads(before)


def linears_alone(model, rows: int, sampled: int) -> float:
    """Seconds one step's linear layers take with nothing between them: every nn.Linear of the
    model in order, through the model's own `linear`, at `rows` rows (the LM head at `sampled`).
    Attention, norms, rotary and the engine cost nothing here: the most a step could gain."""
    from minivllm.models.llama import linear
    dtype = next(model.parameters()).dtype
    head = model.lm_head
    inputs = {}                                  # one random input per width
    t = time.perf_counter()
    for m in model.modules():
        if isinstance(m, nn.Linear):
            n = sampled if m is head else rows
            x = inputs.setdefault((n, m.in_features), torch.randn(n, m.in_features, dtype=dtype))
            linear(m, x)
    return time.perf_counter() - t


def matmul_ceiling(model, steps) -> float:
    """Seconds the served steps' linears take alone, each distinct step shape timed (best of
    two) and counted as often as it ran. A sampled row per sequence: a prefill chunk that does
    not finish its prompt samples nothing, so this errs towards more matmul time, not less."""
    shapes = Counter((sum(x.num_tokens for x in s.scheduled), len(s.scheduled)) for s in steps)
    return sum(n * min(linears_alone(model, *key) for _ in range(2))
               for key, n in shapes.items())


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def batch1_decode(llm, prompt: list[int], tokens: int) -> float:
    """Decode tok/s of one request: the mean of its decode steps' durations."""
    engine = llm.engine
    with engine.trace() as steps:
        llm.generate([prompt],
                     SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True),
                     use_tqdm=False)
    decode = [s.duration for s in steps if not any(x.is_prefill for x in s.scheduled)]
    return len(decode) / sum(decode)


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--num-prompts", type=int, default=48)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--hf-batch-sizes", default="16,48", help="comma-separated; '' skips")
    parser.add_argument("--max-num-seqs", type=int, default=None,
                        help="default: the engine's (64)")
    parser.add_argument("--no-reference", action="store_true",
                        help="skip the padded-attention run")
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="cap every request's output (a quick run; default: the "
                             "workload's 8-160)")


def run(args: argparse.Namespace) -> None:
    from minivllm import LLM
    print(f"threads={torch.get_num_threads()}  cpu capability="
          f"{torch.backends.cpu.get_cpu_capability()}  bf16 units: {cpu_has_bf16_units()}")
    rows = []
    for dtype in args.dtypes.split(","):
        llm = LLM(args.model, dtype=dtype, device="cpu", max_model_len=512,
                  **({"max_num_seqs": args.max_num_seqs} if args.max_num_seqs else {}))
        dt = llm.engine.dtype
        requests = held_out_requests(llm.tokenizer, args.num_prompts)
        for r in requests if args.max_tokens else []:
            r.params.max_tokens = min(r.params.max_tokens, args.max_tokens)
        n_out = sum(r.params.max_tokens for r in requests)
        n_all = n_out + sum(len(r.prompt) for r in requests)
        peaks = measure_peaks("cpu", dt)
        cost = StepCost.of(llm.engine.model_config, dt)
        # Warm up on the whole workload: the CPU matmul libraries set up per new shape (every
        # batch size), and a run measured right after a short warm-up paid for that: in a
        # first version the run measured first was 10-30% slower than the same code after it.
        serve(llm, requests)
        row = {"dtype": dtype}
        if not args.no_reference:
            attention.USE_REFERENCE = True
            try:
                row["reference attention"] = serve(llm, requests).output_throughput
            finally:
                attention.USE_REFERENCE = False
        fast = serve(llm, requests)
        row["minivllm"] = fast.output_throughput
        # Every token through every projection, and each output token's row through the head.
        flops = 2 * cost.linear_params * n_all + 2 * cost.head_params * n_out
        flop_rate = flops / fast.elapsed
        model = llm.engine.runner.model
        ceiling = flops / matmul_ceiling(model, fast.steps)
        print(f"\n[{dtype}] {len(requests)} requests, {n_out} output tokens, {n_all} "
              f"tokens processed; peaks: {peaks.flops / 1e9:.0f} GFLOP/s matmul, "
              f"{peaks.bandwidth / 1e9:.1f} GB/s copy")
        print(f"minivllm            : {fast.output_throughput:7.1f} output tok/s "
              f"({fast.elapsed:.1f} s, {len(fast.steps)} steps); FLOP rate "
              f"{flop_rate / 1e9:.1f} GFLOP/s = " + (
                  f"{flop_rate / peaks.flops:.0%} of the matmul peak" if flop_rate <= peaks.flops
                  else "above the measured peak (its 1024 x 1024 probe is not this dtype's best "
                       "shape here: no share claimed)"))
        print(f"its linears alone   : {ceiling / 1e9:7.1f} GFLOP/s at the same step shapes (the "
              f"FLOP rate with attention and all else free): {flop_rate / ceiling:.0%} of it"
              + (f"; {ceiling / peaks.flops:.0%} of the matmul peak" if ceiling <= peaks.flops
                 else ""))
        if "reference attention" in row:
            print(f"padded reference    : {row['reference attention']:7.1f} output tok/s "
                  f"(fast path {fast.output_throughput / row['reference attention']:.2f}x)")
        shares = step_breakdown(llm, requests[:12])
        print("step time (profile) : " + ", ".join(f"{k} {v:.0%}" for k, v in shares.items()))
        tps = batch1_decode(llm, requests[0].prompt, min(48, args.max_tokens or 48))
        # Batch-1 decode is bound by bytes: its roofline is bandwidth over the bytes of a step
        # (a bf16 matmul peak measured without bf16 units says nothing about it).
        # MKL's GEMV at one row runs on one core, so the one-core read roofline is shown too.
        moved = cost.step([1], [len(requests[0].prompt) + 24], sampled=1)[1]
        roof = peaks.bandwidth / moved
        one_core = read_bandwidth(1) / moved
        gemvs = 5 / sum(linears_alone(model, 1, 1) for _ in range(5))   # a mean, as decode's
        row |= {"batch-1 decode": tps, "roofline": roof}
        print(f"batch-1 decode      : {tps:7.1f} tok/s, roofline {roof:.1f} tok/s "
              f"({cost.weight_bytes / 1e6:.0f} MB of weights a token): {tps / roof:.0%}; "
              f"one core's read roofline {one_core:.1f} tok/s: {tps / one_core:.0%}")
        print(f"its GEMVs alone     : {gemvs:7.1f} tok/s ({gemvs / roof:.0%} of the roofline): "
              f"decode runs at {tps / gemvs:.0%} of its own matmuls")
        if args.hf_batch_sizes:
            from transformers import AutoModelForCausalLM
            hf = AutoModelForCausalLM.from_pretrained(llm.engine.model_path, dtype=dt).eval()
            pad = llm.tokenizer.pad_token_id or 0
            run_hf_static(hf, requests[:2], 2, pad)                 # warm-up
            best = 0.0
            for bs in map(int, args.hf_batch_sizes.split(",")):
                t0 = time.perf_counter()
                useful = run_hf_static(hf, requests, bs, pad)
                secs = time.perf_counter() - t0
                print(f"transformers (bs={bs:2d}): {useful / secs:7.1f} output tok/s "
                      f"({secs:.1f} s)")
                best = max(best, useful / secs)
            row["transformers"] = best
            print(f"minivllm / best transformers: {fast.output_throughput / best:.2f}x")
            del hf
        rows.append(row)
        del llm
    print("\n| dtype | minivllm tok/s | padded attention | transformers (best) | ratio | "
          "batch-1 decode | roofline |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        hf = r.get("transformers")
        ref = r.get("reference attention")
        ratio = f"{r['minivllm'] / hf:.2f}x" if hf else "-"
        print(f"| {r['dtype']} | {r['minivllm']:.1f} | {f'{ref:.1f}' if ref else '-'} | "
              f"{f'{hf:.1f}' if hf else '-'} | {ratio} | {r['batch-1 decode']:.1f} | "
              f"{r['roofline']:.1f} |")
