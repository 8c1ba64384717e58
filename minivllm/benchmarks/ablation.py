"""`minivllm bench ablation`: one workload, the engine with each mechanism switched off in turn.

No vLLM twin (see the end of this docstring).

    uv run minivllm bench ablation                       # SmolLM2, 32 requests
    uv run minivllm bench ablation --num-requests 16 --max-model-len 512

The series ranks serving optimizations by their throughput impact; this tests the ranking on
this engine instead of asserting it. One seeded workload (log-normal prompt and output
lengths behind a shared system prompt, all arriving at once, greedy, EOS ignored) is served by
the full engine, then once with each mechanism off, over the same weights and the same bytes
of KV memory:

    prefix caching      enable_prefix_caching=False
    paging              kv_layout="contiguous": one max_model_len slab per request, measured
                        against the row above (a private slab cannot share a prefix, so
                        against the full engine it would switch two mechanisms off)
    continuous batching scheduling="static": a new batch only when the last one is done
    chunked prefill     enable_chunked_prefill=False (the token budget must then hold a whole
                        prompt: max_num_batched_tokens = max_model_len)

Per row: engine steps, prompt tokens computed, output tokens per step (counts, the same on
every machine), output tokens/s (this machine's, noisy when it is shared), and each against
the row it is measured against (`vs`). Every row must produce the same tokens: a mechanism
changes when work is done, never what is computed.

Part II's mechanisms need workloads of their own (a copy task for n-gram speculation, a tight
pool for a quantized KV cache or for swapping), so `part_two_pairs` serves each on its own
small workload, off then on, and counts what it changes (PAIRS). CUDA graphs and tensor
parallelism save no count on a CPU and are left to lessons 14 and 15. vLLM has no such ladder
(its benchmarks compare whole configurations). Lesson 19 runs both at a small size, checks
their counts and ranks them beside the series' ranking; the site's Optimization catalog shows
that run.
"""

from __future__ import annotations

import argparse

RUNGS = {   # name -> (the row it is measured against, the settings it changes from that row)
    "full engine": (None, {}),
    "no prefix caching": ("full engine", {"enable_prefix_caching": False}),
    "no paging": ("no prefix caching", {"kv_layout": "contiguous"}),
    "no continuous batching": ("full engine", {"scheduling": "static"}),
    "no chunked prefill": ("full engine", {"enable_chunked_prefill": False}),
}


def rung_settings(name: str) -> dict:
    """Everything a rung changes from the full engine: its own settings over its baseline's."""
    vs, off = RUNGS[name]
    return (rung_settings(vs) if vs else {}) | off


def _counts(res) -> dict:
    """What one served workload cost, in counts (and its seconds and tokens)."""
    return {"steps": len(res.steps),
            "prefill_tokens": sum(s.num_prefill_tokens for s in res.steps),
            "computed_tokens": sum(s.num_batched_tokens for s in res.steps),
            "output_tokens": res.num_output_tokens,
            "tokens_per_step": res.num_output_tokens / len(res.steps),
            "tokens_per_s": res.output_throughput, "seconds": res.elapsed,
            "max_running": max(s.stats.num_running for s in res.steps),
            "largest_step": max(s.num_batched_tokens for s in res.steps),
            "preemptions": res.steps[-1].stats.num_preemptions,
            "tokens": [o.outputs[0].token_ids for o in res.outputs]}


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
    Everything else a rung could inherit from the engine (block size, the KV cache's dtype,
    quantization, speculation) is set to the full engine's defaults; the engine's settings
    are put back afterwards."""
    from minivllm.core.kv_cache import kv_bytes_per_token
    from minivllm.benchmarks.workloads import serve
    engine = llm.engine
    kv_bytes = (slabs * max_model_len
                * kv_bytes_per_token(engine.model_config.hf_config, engine.dtype))
    base = dict(max_model_len=max_model_len, max_num_seqs=max_num_seqs, kv_layout="paged",
                kv_cache_memory=kv_bytes, num_kv_blocks=None, scheduling="continuous",
                enable_chunked_prefill=True, max_num_batched_tokens=budget,
                enable_prefix_caching=True, block_size=16, kv_cache_dtype="auto",
                quantization=None, speculative_config=None, preemption_mode="recompute")
    rows = {}
    before = {k: getattr(engine.engine_args, k) for k in base}
    for name in RUNGS:
        settings = base | rung_settings(name)
        if not settings["enable_chunked_prefill"]:
            settings["max_num_batched_tokens"] = max_model_len
        rows[name] = {"vs": RUNGS[name][0], **_counts(serve(llm.reconfigure(**settings), requests))}
    llm.reconfigure(**before)
    return rows


# Part II, one mechanism per row on the workload it is for: (the series' technique, the count
# it should lower, the settings with the mechanism off, with it on).
PAIRS = {
    "n-gram speculation": ("Speculative decoding", "steps", {"speculative_config": None},
                           {"speculative_config": {"method": "ngram",
                                                   "num_speculative_tokens": 4}}),
    "int8 KV cache": ("Quantization (weights and KV)", "steps", {"kv_cache_dtype": "auto"},
                      {"kv_cache_dtype": "int8"}),
    "swap, not recompute": ("Preemption", "computed_tokens", {"preemption_mode": "recompute"},
                            {"preemption_mode": "swap"}),
}


def part_two_workloads(tokenizer) -> dict:
    """{pair: (requests, engine settings)}: each of PAIRS' mechanisms where it should matter."""
    from minivllm import SamplingParams
    from minivllm.benchmarks.spec import workloads as spec_workloads
    from minivllm.benchmarks.workloads import Request
    text = tokenizer.encode("When memory runs out, somebody has to give some back. The "
                            "scheduler picks the youngest running request. " * 12)
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    tight = [Request(text[7 * i:7 * i + 40], greedy) for i in range(8)]
    return {
        # Two "repeat this text" requests: the output is in the prompt, drafts get accepted.
        "n-gram speculation": (spec_workloads(tokenizer, 2, 24)["repetitive"], {}),
        # Eight requests of 52 tokens in a pool of 160 fp32 tokens: int8 holds ~3.8x more.
        "int8 KV cache": (tight, {"kv_cache_tokens": 160}),
        # The same eight in the same fp32 pool (10 blocks of 16): preempted and resumed.
        "swap, not recompute": (tight, {"kv_cache_tokens": 160}),
    }


def part_two_pairs(llm, max_model_len: int = 256, max_num_seqs: int = 8) -> dict[str, dict]:
    """Serve each of PAIRS' workloads with its mechanism off, then on; {pair: {"off", "on",
    "technique", "count", "saved": off's count / on's}}. Settings put back afterwards."""
    from minivllm.core.kv_cache import kv_bytes_per_token
    from minivllm.benchmarks.workloads import serve
    engine = llm.engine
    base = dict(max_model_len=max_model_len, max_num_seqs=max_num_seqs, kv_layout="paged",
                scheduling="continuous", enable_chunked_prefill=True,
                max_num_batched_tokens=128, enable_prefix_caching=True, kv_cache_dtype="auto",
                preemption_mode="recompute", speculative_config=None,
                kv_cache_memory=None, num_kv_blocks=64, block_size=16, quantization=None)
    before = {k: getattr(engine.engine_args, k) for k in base}
    rows, served = {}, {}
    for name, (requests, extra) in part_two_workloads(llm.tokenizer).items():
        technique, count, off, on = PAIRS[name]
        pool = dict(extra)
        if "kv_cache_tokens" in pool:        # a pool in bytes: what fp32 needs for N tokens
            pool = {"num_kv_blocks": None, "kv_cache_memory": pool.pop("kv_cache_tokens")
                    * kv_bytes_per_token(engine.model_config.hf_config, engine.dtype)}
        row = {"technique": technique, "count": count}
        for side, settings in (("off", off), ("on", on)):
            config = base | pool | settings
            key = (id(requests), repr(sorted(config.items())))   # the same run: served once
            if key not in served:
                served[key] = _counts(serve(llm.reconfigure(**config), requests))
            row[side] = served[key]
        row["saved"] = row["off"][count] / row["on"][count]
        row["same_tokens"] = row["off"]["tokens"] == row["on"]["tokens"]
        rows[name] = row
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
              f"{r['steps'] / rows[r['vs'] or name]['steps']:8.2f}"
              f"{rows[r['vs'] or name]['tokens_per_s'] / r['tokens_per_s']:8.2f}"
              f"  {r['tokens'] == full['tokens']}")
    print("\nsteps x = steps / those of the row it is measured against (the full engine, or for "
          "no paging the row without prefix caching; counted); tok/s x = that row's tokens/s / "
          "this rung's (timed: above 1, switching the mechanism off cost throughput).")
