"""`minivllm bench guided`: what a grammar costs, per compile and per step.

Nearest vLLM twin: benchmarks/benchmark_serving_structured_output.py (structured output under
load, over HTTP); this one measures the two costs inside one process instead.

    uv run minivllm bench guided                      # batch 1 and 32
    uv run minivllm bench guided --batch-sizes 1 8 32 --max-tokens 24

1. Compile time of a few constraints (xgrammar, first compile = cache miss), the cached
   lookup, and the one-time tokenizer preparation (a pass over the 49,152-token vocabulary).
2. The same requests served twice, sampled at temperature 1: unconstrained (EOS ignored, so
   every sequence runs max_tokens steps) and under a JSON schema. Per run: decode steps,
   mean step time, and for the guided run the time the engine core's matchers spent filling
   the bitmask per step (the worker's part, turning its bits into -inf, is one vectorized
   call inside the step), in ms and as a share of the step. Seconds move on a loaded machine;
   the share of the step is the number to read.

Leaves out EBNF grammars; part 2 serves under the JSON schema only (a mask per step is the same
kind of work whatever the grammar).
"""

from __future__ import annotations

import argparse
import time

import torch

from minivllm.structured_output.manager import StructuredOutputManager
from minivllm.sampling_params import GuidedDecodingParams

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "city"],
          "properties": {"name": {"type": "string", "maxLength": 24},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "city": {"type": "string", "maxLength": 24}}}
CONSTRAINTS = {
    "json schema (person)": GuidedDecodingParams(json=PERSON),
    "json_object (any JSON)": GuidedDecodingParams(json_object=True),
    "regex (phone number)": GuidedDecodingParams(regex=r"\+?\d{1,3} \d{3}-\d{3}-\d{4}"),
    "choice (4 strings)": GuidedDecodingParams(choice=["yes", "no", "maybe", "ask later"]),
}


def bench_compile(tokenizer, vocab_size: int, eos: set[int]) -> None:
    so = StructuredOutputManager(tokenizer, vocab_size, eos)
    t0 = time.perf_counter()
    so.load()                                # import xgrammar + tokenizer info, once per engine
    print(f"tokenizer preparation (once per engine): {1e3 * (time.perf_counter() - t0):8.1f} ms")
    print(f"{'constraint':<24} {'compile ms':>10} {'cached ms':>10}")
    for name, g in CONSTRAINTS.items():
        t0 = time.perf_counter()
        so.compile(g)
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        so.compile(g)
        print(f"{name:<24} {1e3 * first:>10.1f} {1e3 * (time.perf_counter() - t0):>10.3f}")


def serve_once(llm, prompt: str, batch: int, max_tokens: int, guided) -> dict:
    from minivllm import SamplingParams
    so = llm.engine.core.structured_output          # the core's: the matchers and the bitmasks
    mask0 = so.mask_seconds
    rows0 = so.num_masked_rows
    params = SamplingParams(n=batch, temperature=1.0, max_tokens=max_tokens, seed=0,
                            ignore_eos=guided is None, guided_decoding=guided)
    with llm.engine.trace() as steps:
        llm.generate(prompt, params, use_tqdm=False)
    # One prefill step, then decodes; every step samples, so the mask ran in each.
    return {"steps": len(steps), "step_ms": 1e3 * sum(s.duration for s in steps) / len(steps),
            "mask_ms": 1e3 * (so.mask_seconds - mask0) / len(steps),
            "rows": so.num_masked_rows - rows0}


def run(args: argparse.Namespace) -> None:
    from minivllm import LLM
    llm = LLM(args.model, dtype=args.dtype, max_model_len=512,
              max_num_seqs=max(args.batch_sizes))
    print(f"{llm!r}\nthreads={torch.get_num_threads()}")
    bench_compile(llm.tokenizer, llm.engine.model_config.hf_config.vocab_size,
                  llm.engine.eos_token_ids)
    prompt = llm.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Describe a person as JSON with name, age and city."}],
        tokenize=False, add_generation_prompt=True)
    guided = GuidedDecodingParams(json=PERSON)
    serve_once(llm, prompt, 1, 4, guided)                                       # warm-up
    print(f"\n{'batch':>5} {'run':<14} {'steps':>6} {'step ms':>8} {'mask ms':>8} "
          f"{'mask %':>7} {'step vs plain':>13}")
    for batch in args.batch_sizes:
        base = serve_once(llm, prompt, batch, args.max_tokens, None)
        served = serve_once(llm, prompt, batch, args.max_tokens, guided)
        print(f"{batch:>5} {'unconstrained':<14} {base['steps']:>6} {base['step_ms']:>8.1f}")
        print(f"{'':>5} {'json schema':<14} {served['steps']:>6} {served['step_ms']:>8.1f} "
              f"{served['mask_ms']:>8.2f} {served['mask_ms'] / served['step_ms']:>7.1%} "
              f"{served['step_ms'] / base['step_ms']:>12.2f}x")


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--max-tokens", type=int, default=32)
