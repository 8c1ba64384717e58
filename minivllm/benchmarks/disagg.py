"""`minivllm bench disagg`: running decodes while long prompts arrive, colocated vs split.

Nearest vLLM twin: benchmarks/disagg_benchmarks/ (shell scripts around two `vllm serve`s and a
proxy); here both setups run in one command, through the offline driver, no HTTP.

    minivllm bench disagg                 # 4 decodes, 3 prompts of 768 tokens, 8 steps apart
    minivllm bench disagg --long-prompt 1024 --num-long 4

One workload, served twice in the same run through the shared driver (workloads.serve): first
by one engine (colocated: a long prompt's prefill shares a step with every running decode),
then by a producer/consumer pair started with disagg_llm.launch (the prefill runs in the
producer's process, the decodes in the consumer's). Reported side by side: inter-token latency
of the running decodes (mean, p90, max), TTFT of the short and the long requests, the steps in
which decode tokens waited on prefill tokens, and, for the split, KV bytes and seconds per
prompt token sent. Greedy outputs of the two runs are compared too.

On a CPU the two processes also get two cores where the colocated engine has one (with
OMP_NUM_THREADS=1): part of the gap is hardware, as it is on GPUs, where disaggregation gives
prefill and decode their own GPUs. The step counts do not depend on the machine.

Leaves out more than one consumer, and HTTP (`minivllm serve --kv-transfer-config` serves a pair).
"""

from __future__ import annotations

import argparse
import statistics

from minivllm.sampling_params import SamplingParams
from minivllm.benchmarks.workloads import FILLER, Request, serve


def workload(tokenizer, num_decodes: int, decode_prompt: int, decode_tokens: int,
             num_long: int, long_prompt: int, long_every: int) -> list[Request]:
    """num_decodes short requests at the start that decode for long, then num_long long
    prompts, one every long_every driver steps (from step 2 on: the decodes are running by
    then); greedy, EOS ignored. Arrivals count steps, so the schedule is the same on every
    machine."""
    ids = tokenizer.encode(FILLER * (long_prompt // 30 + 2), add_special_tokens=False)
    decodes = [Request(ids[7 * i:7 * i + decode_prompt],
                       SamplingParams(temperature=0, max_tokens=decode_tokens, ignore_eos=True))
               for i in range(num_decodes)]
    longs = [Request(ids[3 * i + 1:3 * i + 1 + long_prompt],
                     SamplingParams(temperature=0, max_tokens=4, ignore_eos=True),
                     arrival_step=2 + long_every * i) for i in range(num_long)]
    return decodes + longs


def summarize(run, num_decodes: int) -> dict:
    """Latencies of the decodes, TTFTs, and the decode tokens that shared a step with
    prefill tokens (from the run's trace: the producer's steps when split)."""
    itls = sorted(x for o in run.outputs[:num_decodes] for x in o.inter_token_latencies)
    mixed = sum(s.num_decode_tokens for s in run.steps
                if s.num_prefill_tokens and s.num_decode_tokens)
    return {"itl_mean_ms": 1e3 * statistics.fmean(itls),
            "itl_p90_ms": 1e3 * itls[int(0.9 * (len(itls) - 1))],
            "itl_max_ms": 1e3 * itls[-1],
            "ttft_short_ms": 1e3 * statistics.median(o.metrics.ttft
                                                     for o in run.outputs[:num_decodes]),
            "ttft_long_ms": 1e3 * statistics.median(o.metrics.ttft
                                                    for o in run.outputs[num_decodes:]),
            "decode_tokens_behind_prefill": mixed, "elapsed_s": run.elapsed,
            "itls_ms": [1e3 * x for x in itls],
            "tokens": [o.outputs[0].token_ids for o in run.outputs]}


def compare(model=None, num_decodes=4, decode_prompt=32, decode_tokens=48, num_long=3,
            long_prompt=768, long_every=8, llm=None, **engine_kwargs) -> dict:
    """Serve one workload colocated, then split; return both summaries and the transfer
    numbers. `llm`: an already-loaded colocated LLM to use (its settings are kept)."""
    from minivllm import LLM
    from minivllm.engine.disagg.disagg_llm import launch
    settings = {"max_model_len": long_prompt + 64, "num_kv_blocks": 256, **engine_kwargs}
    llm = llm or LLM(model, **settings)
    requests = workload(llm.tokenizer, num_decodes, decode_prompt, decode_tokens, num_long,
                        long_prompt, long_every)
    serve(llm, requests[:1])                                     # warm-up
    colocated = summarize(serve(llm, requests), num_decodes)
    with launch(model if model is not None else str(llm.engine.model_path),
                **settings) as pair:
        serve(pair, requests[:1])
        before = pair.stats()
        split = summarize(serve(pair, requests), num_decodes)
        after = pair.stats()
    cached = after["cached_tokens_not_sent"] - before["cached_tokens_not_sent"]
    prompt_tokens = sum(len(r.prompt) for r in requests) - cached     # those sent
    sent = after["bytes_sent"] - before["bytes_sent"]
    transfer = {"bytes_per_prompt_token": sent / prompt_tokens, "cached_tokens_not_sent": cached,
                "transfer_ms_per_prompt_token":
                    1e3 * (after["transfer_seconds"] - before["transfer_seconds"]) / prompt_tokens,
                "bytes_sent": sent, "num_transfers": after["num_transfers"]
                - before["num_transfers"], "consumer_prefill_steps":
                    pair.report["num_prefill_steps"], "num_reprefilled": after["num_reprefilled"]}
    return {"colocated": colocated, "disaggregated": split, "transfer": transfer,
            "identical": colocated["tokens"] == split["tokens"]}


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--num-decodes", type=int, default=4)
    parser.add_argument("--decode-tokens", type=int, default=48)
    parser.add_argument("--num-long", type=int, default=3)
    parser.add_argument("--long-prompt", type=int, default=768)
    parser.add_argument("--long-every", type=int, default=8,
                        help="driver steps between long prompts")


def run(args: argparse.Namespace) -> None:
    r = compare(args.model, num_decodes=args.num_decodes, decode_tokens=args.decode_tokens,
                num_long=args.num_long, long_prompt=args.long_prompt, long_every=args.long_every)
    co = r["colocated"]
    split = r["disaggregated"]
    print(f"{args.num_decodes} decodes x {args.decode_tokens} tokens, {args.num_long} prompts "
          f"of {args.long_prompt} tokens every {args.long_every} steps; greedy outputs identical: "
          f"{r['identical']}")
    print(f"{'':34}{'colocated':>12}{'disaggregated':>15}{'split/colo':>12}")
    for key in ("itl_mean_ms", "itl_p90_ms", "itl_max_ms", "ttft_short_ms", "ttft_long_ms",
                "decode_tokens_behind_prefill", "elapsed_s"):
        ratio = split[key] / co[key] if co[key] else float("nan")
        print(f"{key:34}{co[key]:12.1f}{split[key]:15.1f}{ratio:12.2f}")
    t = r["transfer"]
    print(f"KV sent: {t['bytes_sent'] / 2**20:.1f} MiB in {t['num_transfers']} transfers, "
          f"{t['bytes_per_prompt_token']:,.0f} B and {t['transfer_ms_per_prompt_token']:.4f} ms "
          f"per prompt token sent ({t['cached_tokens_not_sent']} tokens not sent: the consumer "
          f"had them cached); consumer prefill steps: {t['consumer_prefill_steps']}")
