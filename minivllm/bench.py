"""Benchmarks that print numbers, minivllm and transformers side by side in one invocation.

    uv run python -m minivllm.bench load               # default model: first and cached load
    uv run python -m minivllm.bench decode             # decode tok/s at batch 1 and 8 vs HF

Same weights (the converted checkpoint), same dtype, same prompts, greedy, EOS ignored so both
produce exactly max_tokens per sequence. Each measurement is the best of --repeats runs after a
warm-up run. Nothing here asserts a speed: the numbers are for reading.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
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


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m minivllm.bench", description=__doc__,
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
    args = parser.parse_args(argv)
    {"load": bench_load, "decode": bench_decode}[args.command](args)


if __name__ == "__main__":
    main()
