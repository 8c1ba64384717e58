"""`minivllm bench spec`: the same requests with and without n-gram speculation.

No vLLM twin: vLLM measures speculation through `vllm bench serve` / `throughput` with a
--speculative-config, one setting per run; here off and on side by side, in one process.

    uv run minivllm bench spec                          # k = 4, batch 1 and 8
    uv run minivllm bench spec --k 2 4 8 --batch-sizes 1

Two workloads, greedy (so the outputs must be identical, and are checked):
    repetitive  "repeat / lightly edit this text": the answer copies its prompt, so prompt
                lookup finds most drafts (editing, summarizing with quotes, RAG, refactoring)
    free-form   short stories on different topics: little to look up

Per run: steps (target forwards), acceptance rate (accepted / proposed drafts), mean
acceptance length (tokens a sequence gains per verifying forward, 1 + accepted / verified),
output tokens/s, and the speedup over the same requests without speculation. Each run is
served once after one warm-up; on a loaded machine the seconds move, the counts do not.

Leaves out the draft-model proposer: n-gram lookup only.
"""

from __future__ import annotations

import argparse

import torch

from minivllm.benchmarks.workloads import COPY_EDITS as EDITS, COPY_TEXT as SOURCE, chat_prompt

TOPICS = ["a lighthouse keeper", "a lost robot", "a dragon who bakes bread",
          "two rival chess players", "a city under the sea", "a time-travelling cat",
          "the last tree on Mars", "a detective who cannot sleep"]


def workloads(tokenizer, batch: int, max_tokens: int):
    """{name: [Request]} with `batch` different prompts each, greedy."""
    from minivllm import SamplingParams
    from minivllm.benchmarks.workloads import Request
    words = SOURCE.split()
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    repetitive = [chat_prompt(tokenizer, f"{EDITS[i % 4]}:\n\n" + " ".join(words[6 * i:6 * i + 60]))
                  for i in range(batch)]
    free = [chat_prompt(tokenizer, f"Write a short story about {TOPICS[i % 8]}.")
            for i in range(batch)]
    return {"repetitive": [Request(p, params) for p in repetitive],
            "free-form": [Request(p, params) for p in free]}


def run(args: argparse.Namespace) -> None:
    from minivllm import LLM
    from minivllm.benchmarks.workloads import serve
    llm = LLM(args.model, dtype=args.dtype, max_model_len=512)
    print(f"{llm!r}\nthreads={torch.get_num_threads()}  greedy, {args.max_tokens} output "
          f"tokens per request (EOS ignored); n-gram lookup {args.lookup_min}..{args.lookup_max}")
    serve(llm, workloads(llm.tokenizer, 1, 8)["repetitive"])          # warm-up
    print(f"{'workload':<11} {'batch':>5} {'k':>3} {'steps':>6} {'accept':>7} {'len/fwd':>7} "
          f"{'tok/s':>7} {'speedup':>7}  identical")
    for batch in args.batch_sizes:
        for name, requests in workloads(llm.tokenizer, batch, args.max_tokens).items():
            llm.reconfigure(speculative_config=None)
            base = serve(llm, requests)
            print(f"{name:<11} {batch:>5} {'-':>3} {len(base.steps):>6} {'':>7} {'1.00':>7} "
                  f"{base.output_throughput:>7.1f} {'1.00x':>7}")
            for k in args.k:
                llm.reconfigure(speculative_config={
                    "method": "ngram", "num_speculative_tokens": k,
                    "prompt_lookup_min": args.lookup_min, "prompt_lookup_max": args.lookup_max})
                served = serve(llm, requests)
                stats = served.steps[-1].stats
                same = ([o.outputs[0].token_ids for o in served.outputs]
                        == [o.outputs[0].token_ids for o in base.outputs])
                print(f"{'':<11} {'':>5} {k:>3} {len(served.steps):>6} "
                      f"{stats.spec_decode_acceptance_rate:>7.1%} "
                      f"{stats.spec_decode_mean_acceptance_length:>7.2f} "
                      f"{served.output_throughput:>7.1f} "
                      f"{served.output_throughput / base.output_throughput:>6.2f}x  {same}")
    llm.reconfigure(speculative_config=None)


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--k", type=int, nargs="+", default=[4],
                        help="num_speculative_tokens values to try")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--lookup-min", type=int, default=1)
    parser.add_argument("--lookup-max", type=int, default=4)
