"""`minivllm bench compile`: where a decode step's time goes, and what torch.compile does to it.

No vLLM twin (vLLM reports compile time in its logs and graph speed in `bench latency`).

    uv run minivllm bench compile                          # SmolLM2, batch 1 4 16 64
    uv run minivllm bench compile --batch-sizes 1 8 --steps 4

Per batch size, through the engine's public API (`engine.trace()`): the median decode step
(every sequence brings one token), eager and with compilation_config=3, and one eager step
under torch's profiler: how many ops it ran and how long they took inside themselves (their
"self" time, summed). What is left of that step, its wall time minus op time, is Python: the model's
forward code, the engine around it, the dispatcher between Python and each op. That share is
what CUDA graphs remove on a GPU, where it also hides the GPU behind kernel launches
(minivllm/benchmarks/gpu.py measures that part; on a CPU there are no graphs to replay).

Leaves out prefill steps: decode is where Python's share of a step is largest.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch


def _prompts(llm, batch: int, prompt_len: int = 16) -> list[list[int]]:
    g = torch.Generator().manual_seed(batch)
    return torch.randint(100, 20000, (batch, prompt_len), generator=g).tolist()


def decode_step_seconds(llm, batch: int, steps: int = 6) -> float:
    """Median duration of the decode steps in which all `batch` sequences decode."""
    from minivllm import SamplingParams
    params = SamplingParams(temperature=0, max_tokens=steps + 1, ignore_eos=True)
    with llm.engine.trace() as trace:
        llm.generate(_prompts(llm, batch), params, use_tqdm=False)
    decodes = [s.duration for s in trace
               if len(s.scheduled) == batch and not any(x.is_prefill for x in s.scheduled)]
    return statistics.median(decodes)


def profile_decode_step(llm, batch: int) -> dict:
    """One decode step of `batch` sequences under torch.profiler: op count and op time."""
    from minivllm import SamplingParams
    engine = llm.engine
    for i, ids in enumerate(_prompts(llm, batch)):
        engine.add_request(f"profile-{i}", ids, SamplingParams(temperature=0, max_tokens=4,
                                                               ignore_eos=True))
    engine.step()
    while any(s.is_prefill for s in engine.last_scheduler_output.scheduled):   # prefill first
        engine.step()
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")        # the profiler's own chatter, off
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        engine.step()
        wall = time.perf_counter() - t0
    for i in range(batch):
        engine.abort_request(f"profile-{i}")
    events = [e for e in prof.key_averages() if e.key.startswith("aten::")]
    op_s = sum(e.self_cpu_time_total for e in events) / 1e6
    # An op the step asked for: an aten op not run inside another aten op (its own internals
    # are not separate requests), wherever it was called from: Python, a compiled graph (the
    # matmuls it calls), or the attention op a graph leaves opaque.
    top = [e for e in prof.events() if e.key.startswith("aten::") and not _inside_aten(e)]
    return {"ops": len(top), "op_s": op_s, "profiled_wall_s": wall}


def _inside_aten(event) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.key.startswith("aten::"):
            return True
        parent = parent.cpu_parent
    return False


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--steps", type=int, default=6, help="decode steps timed per batch size")


def run(args: argparse.Namespace) -> None:
    from minivllm import LLM
    llm = LLM(args.model, max_model_len=256, max_num_seqs=max(args.batch_sizes),
              num_kv_blocks=max(args.batch_sizes) * 4)
    print(f"{llm}\nthreads: {torch.get_num_threads()}")
    rows = {}
    for b in args.batch_sizes:
        rows[b] = {"eager": decode_step_seconds(llm, b, args.steps), **profile_decode_step(llm, b)}
    t0 = time.perf_counter()
    llm.reconfigure(compilation_config=3)
    decode_step_seconds(llm, 1, 1)                          # compiles (once: dynamic shapes)
    compile_s = time.perf_counter() - t0
    for b in args.batch_sizes:
        rows[b]["compiled"] = decode_step_seconds(llm, b, args.steps)
        rows[b]["compiled ops"] = profile_decode_step(llm, b)["ops"]
    print(f"torch.compile (the forward around attention, Inductor): compiled in "
          f"{compile_s:.0f} s\n")
    print(f"{'batch':>5}{'eager ms':>10}{'ops':>6}{'op ms':>8}{'Python %':>10}"
          f"{'compiled ms':>13}{'ops':>6}{'ratio':>7}")
    for b, r in rows.items():
        python = max(0.0, 1 - r["op_s"] / r["profiled_wall_s"])   # both under the profiler
        print(f"{b:>5}{1e3 * r['eager']:10.1f}{r['ops']:6}{1e3 * r['op_s']:8.1f}"
              f"{100 * python:9.0f}%{1e3 * r['compiled']:13.1f}{r['compiled ops']:6}"
              f"{r['eager'] / r['compiled']:7.2f}")
    print("\nratio = eager / compiled (above 1: compile helps). Python % = 1 - op time / step "
          "time, both from the profiled step (the profiler slows each op a little).")
