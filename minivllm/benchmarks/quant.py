"""`minivllm bench quant`: quality, memory and speed of every quantization format, in one run.

No vLLM twin (vLLM evaluates quality with lm-eval and speed with `bench throughput`, apart).
Leaves out activation quantization (W8A8, FP8 matmuls): weights and the KV cache only.

    uv run minivllm bench quant                      # all formats, the whole text set
    OMP_NUM_THREADS=1 uv run minivllm bench quant --ppl-tokens 512

Rows: fp32 and bf16 weights; int8, int4-g32/g64/g128 weights
(minivllm/quantization/weight_only.py); an int8 and an fp8 KV cache (kernels/write_kv.py).
Columns:
    ppl        perplexity on minivllm/benchmarks/data/perplexity.txt (public-domain prose, and code
               written for this repo), scored in windows of 512 tokens
    agree      greedy agreement with fp32: tokens until the first different one, per prompt
    weights    bytes of the weights held (quantized layers, float embeddings, norms)
    KV tokens  tokens a 256 MiB KV pool holds in that format
    b1, b8     decode tokens/s at batch 1 and 8 (decode steps only, prefill excluded)
A format a model cannot take (int4-g128 on SmolLM2, whose hidden size 576 is 4.5 x 128) is
printed with the reason. Set OMP_NUM_THREADS for both sides of a comparison; the seconds move
with the machine's load, the perplexities do not.
"""

from __future__ import annotations

import argparse
import math
from importlib.resources import files

import torch

# (label, dtype, engine settings): the formats compared, fp32 first (the baseline).
FORMATS = [
    ("fp32", "float32", {}),
    ("bf16", "bfloat16", {}),
    ("int8", "float32", {"quantization": "int8"}),
    ("int4-g32", "float32", {"quantization": "int4-g32"}),
    ("int4-g64", "float32", {"quantization": "int4-g64"}),
    ("int4-g128", "float32", {"quantization": "int4-g128"}),
    ("kv-int8", "float32", {"kv_cache_dtype": "int8"}),
    ("kv-fp8", "float32", {"kv_cache_dtype": "fp8"}),
]
AGREEMENT_PROMPTS = [
    "The capital of France is", "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea,", "1, 1, 2, 3, 5, 8,",
    "The three primary colors are", "Le chat est assis sur",
    "<|im_start|>user\nWhat is a KV cache?<|im_end|>\n<|im_start|>assistant\n",
    "import torch\nx = torch.randn(3, 4)\nprint(x.",
]


def eval_text() -> str:
    return files("minivllm.benchmarks").joinpath("data/perplexity.txt").read_text()


def perplexity(engine, token_ids: list[int], window: int = 512) -> float:
    """exp(mean negative log-likelihood of each next token), scored window tokens at a time."""
    nll = 0.0
    n = 0
    for start in range(0, len(token_ids) - 1, window):
        chunk = token_ids[start:start + window + 1]
        logp = engine.prompt_logits(chunk[:-1]).log_softmax(-1)              # (n, vocab)
        target = torch.tensor(chunk[1:], device=logp.device)
        nll -= logp[torch.arange(len(target)), target].sum().item()
        n += len(target)
    return math.exp(nll / n)


def greedy_tokens(llm, prompts: list[str], max_tokens: int) -> list[list[int]]:
    from minivllm import SamplingParams
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def first_divergence(ours: list[int], reference: list[int]) -> int:
    """Tokens generated before the first one that differs from the reference."""
    return next((i for i, (a, b) in enumerate(zip(ours, reference)) if a != b), len(reference))


def decode_tokens_per_s(llm, batch: int, max_tokens: int = 32) -> float:
    """Decode tok/s at `batch` sequences: generated tokens over the time of decode-only steps."""
    from minivllm import SamplingParams
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    prompts = [f"Write a short story about a {w}." for w in
               ("lighthouse", "robot", "dragon", "chess player", "city", "cat", "tree", "ship")]
    llm.generate(prompts[:1], SamplingParams(max_tokens=2), use_tqdm=False)       # warm-up
    with llm.engine.trace() as steps:
        llm.generate((prompts * batch)[:batch], params, use_tqdm=False)
    decode = [s for s in steps if s.scheduled and not any(q.is_prefill for q in s.scheduled)]
    tokens = sum(sum(q.num_tokens for q in s.scheduled) for s in decode)
    return tokens / sum(s.duration for s in decode)


def measure(llm, settings: dict, ids: list[int], reference: list[list[int]] | None,
            max_tokens: int, batch_sizes: list[int]) -> dict:
    """One row: llm reconfigured to `settings` (quantization, kv_cache_dtype), then measured."""
    from minivllm.quantization.weight_only import model_weight_bytes
    llm.reconfigure(**{"quantization": None, "kv_cache_dtype": "auto",
                       "kv_cache_memory": 256 << 20, **settings})
    row = {"ppl": perplexity(llm.engine, ids),
           "weights": model_weight_bytes(llm.engine.runner.model),
           "kv_tokens": (llm.engine.stats().num_blocks_total
                         * llm.engine.vllm_config.cache_config.block_size)}
    tokens = greedy_tokens(llm, AGREEMENT_PROMPTS, max_tokens)
    row["agree"] = [first_divergence(t, r) for t, r in zip(tokens, reference or tokens)]
    row["tokens"] = tokens
    for b in batch_sizes:
        row[f"b{b}"] = decode_tokens_per_s(llm, b)
    return row


def run(args: argparse.Namespace) -> None:
    from minivllm import LLM
    llm = LLM(args.model, dtype="float32", max_model_len=1024, max_num_seqs=8)
    ids = llm.tokenizer.encode(eval_text())[:args.ppl_tokens]
    print(f"{llm!r}\nthreads={torch.get_num_threads()}  perplexity over {len(ids)} tokens; "
          f"greedy agreement over {len(AGREEMENT_PROMPTS)} prompts x {args.max_tokens} tokens")
    print(f"{'format':<10} {'ppl':>7} {'d ppl':>7} {'agree (tokens)':<34} {'weights MB':>10} "
          f"{'KV tokens':>9} "
          + " ".join(f"{'b' + str(b) + ' tok/s':>10}" for b in args.batch_sizes) + "  speedup")
    base = None
    for label, dtype, settings in FORMATS:
        if args.formats and label not in args.formats:
            continue
        engine_llm = llm if dtype == "float32" else LLM(args.model, dtype=dtype,
                                                        max_model_len=1024, max_num_seqs=8)
        try:
            row = measure(engine_llm, settings, ids, base and base["tokens"], args.max_tokens,
                          args.batch_sizes)
        except ValueError as e:
            print(f"{label:<10} refused: {e}")
            continue
        base = base or row
        speed = " ".join(f"{row[f'b{b}']:>10.1f}" for b in args.batch_sizes)
        ratios = " ".join(f"{row[f'b{b}'] / base[f'b{b}']:.2f}x" for b in args.batch_sizes)
        print(f"{label:<10} {row['ppl']:>7.3f} {row['ppl'] / base['ppl'] - 1:>+7.2%} "
              f"{str(row['agree']):<34} {row['weights'] / 1e6:>10.1f} {row['kv_tokens']:>9} "
              f"{speed}  {ratios}", flush=True)
    llm.reconfigure(quantization=None, kv_cache_dtype="auto", kv_cache_memory=None)


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--formats", nargs="*", default=None,
                        help=f"labels to run (default: all of {[f[0] for f in FORMATS]})")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--max-tokens", type=int, default=32, help="greedy tokens per prompt")
    parser.add_argument("--ppl-tokens", type=int, default=100_000,
                        help="score at most this many tokens of the text set")
