"""`minivllm bench cpu`: the CPU path at the machine's limit, in one invocation: batch-1 decode
of every weight format beside its bandwidth roofline, where its step goes, and batched
throughput against transformers. No vLLM twin (vLLM's CPU backend has no benchmark of its own).

    minivllm bench cpu                          # fp32, bf16, int8, int4-g32; 48 requests
    minivllm bench cpu --dtypes int8,int4 --hf-batch-sizes ''     # the quantized rows alone
    minivllm bench cpu --num-prompts 16 --dtypes float32 --hf-batch-sizes 8

For each format (fp32 and bf16 weights; int8 and int4-g32 weight-only with an int8 LM head,
fp32 activations),
side by side in the same process:
  * the held-out mixed workload (prompts 16-192 tokens, outputs 8-160, EOS ignored, seed 1:
    not the seed the other benchmarks tune on) served by minivllm, by minivllm with the padded
    reference attention (attention.USE_REFERENCE, the path before kernels/cpu_attention.py;
    float formats), and by transformers' generate at each static batch size given (float
    formats; its best is the baseline; the default sizes include 48, the whole workload in one
    batch). minivllm runs with the engine's defaults, as a new user would: up to 64 sequences;
  * the end-to-end FLOP rate against a measured matmul peak (minivllm/benchmarks/roofline.py)
    and against the same linears timed alone at the run's step shapes (`matmul_ceiling`);
  * batch-1 decode tok/s against its roofline: the bytes a token reads (every weight held,
    quantized or not, a tied LM head being the whole embedding table, an untied one's table
    one row (`weight_bytes_read`), plus the KV so far) over
    the measured read bandwidth at the run's threads; and against its GEMVs alone;
  * a torch.profiler breakdown of a batch-1 decode step (`decode_profile`): matmuls,
    attention, other ops, Python and dispatch between ops, sampling, the engine around it.
With `--compile`, each format runs again with compilation_config=3 (worker/compilation.py):
its batch-1 decode, profile and batched throughput become rows "<format> compiled".
The last lines print the whole comparison as two markdown tables, for docs/benchmarks.md.

Whether the CPU has bf16 units (avx512_bf16 / amx) is printed: without them bf16 matmuls are
emulated and slower than fp32, so on such a CPU the engine's "auto" dtype stays fp32.
The llama.cpp side of the comparison is a recipe, not code: docs/benchmarks.md.

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
        if name in MATMUL_OPS or name in ("aten::matmul", "aten::linear"):  # + weight-only
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
    from minivllm.quantization.weight_only import QuantLinear
    dtype = next(model.parameters()).dtype
    head = model.lm_head
    layers = [(m, sampled if m is head else rows) for m in model.modules()
              if isinstance(m, (nn.Linear, QuantLinear))]
    # One random input per shape, drawn before the clock starts: drawn inside it, as it was
    # once, the random numbers took a quarter of the time at 64 rows (issue 40).
    inputs = {(n, m.in_features): torch.randn(n, m.in_features, dtype=dtype) for m, n in layers}
    t = time.perf_counter()
    for m, n in layers:
        linear(m, inputs[n, m.in_features])
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


# Op names by kind, for the batch-1 profile: the matmuls (float and torch's weight-only
# kernels) and attention's own ops (SDPA, and the K/V gathers and writes around it).
MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::_weight_int8pack_mm",
              "aten::_weight_int4pack_mm_for_cpu")
ATTENTION_OPS = ("aten::_scaled_dot_product_flash_attention_for_cpu", "aten::index",
                 "aten::index_copy_", "aten::index_put_", "aten::index_select",
                 "minivllm::unified_attention")
# What counts as an op: torch's, the quantized kernels' and ours; and, compiled, the call of
# Inductor's graph, whose own time is its fused loops ("other ops").
OP_PREFIXES = ("aten::", "quantized::", "minivllm::")


def decode_profile(llm, prompt: list[int], steps: int = 16) -> dict[str, float]:
    """Where a batch-1 decode step's time goes, ms per step, from torch.profiler over `steps`
    decode steps (the prefill before them is not profiled): `matmul` and `attention` are those
    ops' own time; `other ops` the rest of the forward's ops (norms, rotary, SiLU, adds, dtype
    conversions); `python+dispatch` the forward's time between ops (the Python of 30 layers and
    torch's dispatch of each op); `sample` the sampler (logits to a token: the LM head is a
    matmul of the forward); `engine` the rest of the step (schedule, prepare the inputs,
    update, detokenize). Compiled (compilation_config=3), Inductor's fused loops are `other
    ops` and Dynamo's guard check before each forward is Python. The profiler adds a few us per
    op, so the shares are read as shares, and the step's time is taken without it."""
    from torch.autograd.profiler import record_function
    from torch.profiler import ProfilerActivity, profile
    engine = llm.engine
    runner = engine.runner
    engine.add_request("profile", prompt, SamplingParams(temperature=0, max_tokens=steps + 2,
                                                         ignore_eos=True))
    engine.step()                                               # the prefill, not profiled
    for name in ("forward", "sample"):                         # labelled ranges, this run only
        setattr(runner, name, _labelled(getattr(runner, name), name, record_function))
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                with record_function("step"):
                    engine.step()
    finally:
        del runner.forward, runner.sample                      # the class's methods again
    while engine.has_unfinished_requests():
        engine.step()
    ranges = {"step": 0.0, "forward": 0.0, "sample": 0.0}
    kinds = {"matmul": 0.0, "attention": 0.0, "other ops": 0.0}
    for e in prof.events():
        if e.name in ranges:
            ranges[e.name] += e.cpu_time_total
            continue
        parent = e.cpu_parent
        while parent is not None and parent.name not in ranges:
            parent = parent.cpu_parent
        if parent is None or parent.name != "forward":
            continue                                            # sampling and engine ops
        if not (e.name.startswith(OP_PREFIXES) or "CompiledFxGraph" in e.name):
            continue        # a label (Dynamo's guard check, its bytecode): Python's share
        kind = ("matmul" if e.name in MATMUL_OPS else "attention" if e.name in ATTENTION_OPS
                else "other ops")
        kinds[kind] += e.self_cpu_time_total
    shares = kinds | {"python+dispatch": ranges["forward"] - sum(kinds.values()),
                      "sample": ranges["sample"],
                      "engine": ranges["step"] - ranges["forward"] - ranges["sample"]}
    return {k: v / ranges["step"] for k, v in shares.items()}


def _labelled(method, label: str, record_function):
    def call(*args, **kwargs):
        with record_function(label):
            return method(*args, **kwargs)
    return call


# label -> (activation dtype, quantization): the formats `bench cpu` compares. The quantized
# ones keep fp32 activations, as `bench quant` does (torch's kernels take them in bf16).
FORMATS = {"float32": ("float32", None), "bfloat16": ("bfloat16", None),
           "int8": ("float32", "int8"), "int4": ("float32", "int4-g32")}


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--num-prompts", type=int, default=48)
    parser.add_argument("--dtypes", default="float32,bfloat16,int8,int4",
                        help=f"comma-separated, of {list(FORMATS)} (int8/int4: fp32 "
                             "activations, weight-only quantized projections)")
    parser.add_argument("--hf-batch-sizes", default="16,48", help="comma-separated; '' skips")
    parser.add_argument("--max-num-seqs", type=int, default=None,
                        help="default: the engine's (64)")
    parser.add_argument("--no-reference", action="store_true",
                        help="skip the padded-attention run")
    parser.add_argument("--compile", action="store_true",
                        help="also run every format with compilation_config=3 (the whole "
                             "forward compiled by Inductor, attention opaque): batch-1 decode, "
                             "its profile and the batched throughput; ~30 s of compile each")
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="cap every request's output (a quick run; default: the "
                             "workload's 8-160)")


def run(args: argparse.Namespace) -> None:
    from minivllm import LLM
    from minivllm.quantization.weight_only import model_weight_bytes
    threads = torch.get_num_threads()
    read_bw = read_bandwidth(threads)
    print(f"threads={threads}  cpu capability={torch.backends.cpu.get_cpu_capability()}  "
          f"bf16 units: {cpu_has_bf16_units()}  read bandwidth {read_bw / 1e9:.1f} GB/s "
          f"({threads} threads), {read_bandwidth(1) / 1e9:.1f} GB/s (1 thread)")
    rows = []
    for label in args.dtypes.split(","):
        if label not in FORMATS:
            raise ValueError(f"--dtypes: {label!r} is not one of {list(FORMATS)}")
        dtype, quantization = FORMATS[label]
        llm = LLM(args.model, dtype=dtype, device="cpu", max_model_len=512,
                  quantization=quantization,
                  **({"max_num_seqs": args.max_num_seqs} if args.max_num_seqs else {}))
        rows += run_format(llm, label, args, read_bw, model_weight_bytes)
        del llm
    print("\n| format | weights read / token | batch-1 decode | its roofline | of roofline | "
          "batched (output tok/s) | transformers (best) | batched / transformers |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        hf = r.get("transformers")
        versus = f"{hf:.1f} | {r['minivllm'] / hf:.2f}x" if hf else "- | -"
        print(f"| {r['format']} | {r['bytes'] / 1e6:.0f} MB | {r['batch-1 decode']:.1f} | "
              f"{r['roofline']:.1f} | {r['batch-1 decode'] / r['roofline']:.0%} | "
              f"{r['minivllm']:.1f} | {versus} |")
    print("\nbatch-1 decode step, shares of its time (torch.profiler):")
    kinds = list(rows[0]["profile"])
    print("| format | step ms | " + " | ".join(kinds) + " |")
    print("|---|---|" + "---|" * len(kinds))
    for r in rows:
        print(f"| {r['format']} | {1e3 / r['batch-1 decode']:.1f} | "
              + " | ".join(f"{r['profile'][k]:.0%}" for k in kinds) + " |")


def run_format(llm, label: str, args, read_bw: float, model_weight_bytes) -> list[dict]:
    """One format's rows: batched throughput (and transformers' for a float format), then
    batch-1 decode beside its roofline and its profile; with --compile, a compiled row too."""
    dt = llm.engine.dtype
    quantized = llm.engine.model_config.quantization is not None
    requests = held_out_requests(llm.tokenizer, args.num_prompts)
    for r in requests if args.max_tokens else []:
        r.params.max_tokens = min(r.params.max_tokens, args.max_tokens)
    n_out = sum(r.params.max_tokens for r in requests)
    n_all = n_out + sum(len(r.prompt) for r in requests)
    peaks = measure_peaks("cpu", dt)
    cost = StepCost.of(llm.engine.model_config.hf_config, dt)
    # Warm up on the whole workload: the CPU matmul libraries set up per new shape (every
    # batch size), and a run measured right after a short warm-up paid for that: in a
    # first version the run measured first was 10-30% slower than the same code after it.
    serve(llm, requests)
    row = {"format": label}
    if not args.no_reference and not quantized:
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
    print(f"\n[{label}] {len(requests)} requests, {n_out} output tokens, {n_all} "
          f"tokens processed; peaks: {peaks.flops / 1e9:.0f} GFLOP/s matmul ({dt}), "
          f"{peaks.bandwidth / 1e9:.1f} GB/s copy")
    print(f"minivllm            : {fast.output_throughput:7.1f} output tok/s "
          f"({fast.elapsed:.1f} s, {len(fast.steps)} steps); FLOP rate "
          f"{flop_rate / 1e9:.1f} GFLOP/s = " + (
              f"{flop_rate / peaks.flops:.0%} of the matmul peak" if flop_rate <= peaks.flops
              else "above the measured peak (its 1024 x 1024 probe is not this dtype's best "
                   "shape here: no share claimed)"))
    print(f"its linears alone   : {ceiling / 1e9:7.1f} GFLOP/s at the same step shapes (the "
          f"FLOP rate with attention and all else free): {flop_rate / ceiling:.0%} of it")
    if "reference attention" in row:
        print(f"padded reference    : {row['reference attention']:7.1f} output tok/s "
              f"(fast path {fast.output_throughput / row['reference attention']:.2f}x)")
    shares = step_breakdown(llm, requests[:12])
    print("step time (profile) : " + ", ".join(f"{k} {v:.0%}" for k, v in shares.items()))
    prompt = requests[0].prompt
    tps = batch1_decode(llm, prompt, min(48, args.max_tokens or 48))
    # Batch-1 decode is bound by bytes: every weight read once a token (a tied LM head is the
    # whole embedding table; an untied one, the quantized formats' int8 head, is read instead),
    # and the KV so far; its roofline is the read bandwidth over them.
    # MKL's GEMV at one row runs on one core, so the one-core read roofline is shown too.
    kv = cost.kv_token_bytes * (len(prompt) + 24)
    moved = weight_bytes_read(model, model_weight_bytes) + kv
    roof = read_bw / moved
    one_core = read_bandwidth(1) / moved
    gemvs = 5 / sum(linears_alone(model, 1, 1) for _ in range(5))   # a mean, as decode's
    row |= {"batch-1 decode": tps, "roofline": roof, "bytes": moved,
            "profile": decode_profile(llm, prompt)}
    print(f"batch-1 decode      : {tps:7.1f} tok/s, roofline {roof:.1f} tok/s "
          f"({moved / 1e6:.0f} MB read a token): {tps / roof:.0%}; "
          f"one core's read roofline {one_core:.1f} tok/s: {tps / one_core:.0%}")
    print(f"its GEMVs alone     : {gemvs:7.1f} tok/s ({gemvs / roof:.0%} of the roofline): "
          f"decode runs at {tps / gemvs:.0%} of its own matmuls")
    print("batch-1 step (profile): " + ", ".join(f"{k} {v:.0%}"
                                                 for k, v in row["profile"].items()))
    if args.hf_batch_sizes and not quantized:
        row["transformers"] = transformers_best(llm, requests, args.hf_batch_sizes)
        print(f"minivllm / best transformers: {fast.output_throughput / row['transformers']:.2f}x")
    return [row, compiled_row(llm, row, requests, prompt, args)] if args.compile else [row]


def compiled_row(llm, row: dict, requests, prompt, args) -> dict:
    """`row`'s format with compilation_config=3: batch-1 decode, its profile, and the batched
    throughput, each after a warm-up run that compiles what it needs (one token; any other
    count, which may take more than one graph: a graph guards on the shapes it saw)."""
    label, roof = row["format"], row["roofline"]
    print(f"[{label}] compiling the forward (compilation_config=3) ...", flush=True)
    t = time.perf_counter()
    llm.reconfigure(compilation_config=3)
    batch1_decode(llm, prompt, 4)
    print(f"compiled in {time.perf_counter() - t:.0f} s")
    tps = batch1_decode(llm, prompt, min(48, args.max_tokens or 48))
    profile = decode_profile(llm, prompt)
    serve(llm, requests)                                  # compiles the batched shapes
    batched = serve(llm, requests).output_throughput
    llm.reconfigure(compilation_config=0)
    print(f"compiled batch-1    : {tps:7.1f} tok/s ({tps / roof:.0%} of the roofline); "
          f"batched {batched:.1f} output tok/s")
    print("compiled batch-1 step (profile): " + ", ".join(f"{k} {v:.0%}"
                                                          for k, v in profile.items()))
    return row | {"format": f"{label} compiled", "batch-1 decode": tps, "minivllm": batched,
                  "profile": profile}


def weight_bytes_read(model, model_weight_bytes) -> int:
    """Weight bytes a batch-1 token reads: every weight held, but of an embedding table untied
    from the LM head (the quantized formats' int8 head) a lookup reads one row, not the table."""
    table = model.model.embed_tokens.weight
    held = model_weight_bytes(model)
    if getattr(model.lm_head, "weight", None) is table:           # tied: the head reads it all
        return held
    return held - (table.shape[0] - 1) * table.shape[1] * table.element_size()


def transformers_best(llm, requests, batch_sizes: str) -> float:
    """transformers' generate on the same requests at each static batch size: the best tok/s."""
    from transformers import AutoModelForCausalLM
    hf = AutoModelForCausalLM.from_pretrained(llm.engine.model_path,
                                              dtype=llm.engine.dtype).eval()
    pad = llm.tokenizer.pad_token_id or 0
    run_hf_static(hf, requests[:2], 2, pad)                     # warm-up
    best = 0.0
    for bs in map(int, batch_sizes.split(",")):
        t0 = time.perf_counter()
        useful = run_hf_static(hf, requests, bs, pad)
        secs = time.perf_counter() - t0
        print(f"transformers (bs={bs:2d}): {useful / secs:7.1f} output tok/s ({secs:.1f} s)")
        best = max(best, useful / secs)
    return best
