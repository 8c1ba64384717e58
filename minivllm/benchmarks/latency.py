"""`minivllm bench decode`: decode tokens/s of one batch, minivllm against transformers.

vLLM twin: vllm/benchmarks/latency.py (`vllm bench latency`: the time one batch takes to
generate its output). The subcommand keeps its name, `decode`, because that is what it reports:
output tokens per second of a batch of equal prompts, at each --batch-sizes, beside transformers'
generate on the same converted weights, in the same dtype, on the same prompts.

    uv run minivllm bench decode                    # batch 1 and 8, 32-token prompts, 64 out
    uv run minivllm bench decode --batch-sizes 1 8 32 --prompt-len 128 --max-tokens 128

Greedy with EOS ignored, so both produce exactly --max-tokens tokens per sequence; each number
is the best of --repeats runs after a warm-up run. Nothing here asserts a speed. Leaves out
vLLM's latency percentiles over many iterations and its profiler hook.
"""

from __future__ import annotations

import argparse
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


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)


def run(args: argparse.Namespace) -> None:
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
