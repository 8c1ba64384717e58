"""`minivllm bench parallel`: one process against pipeline parallelism, with one batch in flight
and with pp of them: what each costs, measured side by side.

No vLLM twin (vLLM runs `bench throughput` once per -pp or -dp). Several hosts are not here yet.

    uv run minivllm bench parallel                 # SmolLM2: pp=2, then dp=2
    uv run minivllm bench parallel --pp 3 --num-prompts 12 --dp 1    # pp only

The workload is prefill-heavy on purpose: a token budget of one prompt a step makes each
prompt its own micro-batch, so with pp batches in flight stage 0 prefills prompt i + 1 while
stage 1 finishes prompt i. A decode step carries every running request in one batch (as in
vLLM V1: nothing splits it into micro-batches), so decode steps wait for each other whatever
the queue's depth. Printed per run: seconds, steps, the bytes the last stage received (one
(tokens, hidden) tensor a step; tensor parallelism's would be two all-reduces a layer), and
the last stage's idle share (time waiting for the stage before it / wall time), beside the
bubble formula (pp - 1) / (m + pp - 1) for m micro-batches.

Data parallelism: --dp replicas behind one front end, fed a skewed stream (a long request,
then a short one, again and again, a new one every few steps), balanced round-robin and then by
vLLM V1's score (4 x waiting + running). Round-robin sends every long request to the same
replica; the score sees that replica's queue and sends new work to the other. Printed: the
long requests and the most running at once on each replica, and the seconds to the end.

On one CPU, pp cannot beat one process by much: the stages share the same cores, and one
process already spreads each matmul over them. What pp buys on GPUs is room (each stage holds
1/pp of the weights and a KV pool for its layers only) over a slow link (one send a step,
not two all-reduces a layer).
"""

from __future__ import annotations

import argparse
import time
from contextlib import contextmanager


@contextmanager
def one_batch_in_flight(llm):
    """The core steps synchronously, as without a batch queue: each batch goes through every
    stage before the next is scheduled (what pipelining is measured against)."""
    core = llm.engine.core
    queue, core.batch_queue = core.batch_queue, None
    try:
        yield
    finally:
        core.batch_queue = queue


def run_once(llm, prompts, params) -> dict:
    engine = llm.engine
    pp = engine.model_executor.pp
    before = (pp.recv_bytes, pp.recv_wait_seconds) if pp else (0, 0.0)
    with engine.trace() as steps:
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - t0
    received = pp.recv_bytes - before[0] if pp else 0
    idle = (pp.recv_wait_seconds - before[1]) / seconds if pp else 0.0
    prefill_steps = sum(1 for s in steps if s.num_prefill_tokens)
    return {"seconds": seconds, "steps": len(steps), "prefill_steps": prefill_steps,
            "received_mib": received / 2**20, "idle": idle,
            "tokens": [o.outputs[0].token_ids for o in outs]}


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pp", type=int, default=2, help="pipeline stages (1: skip pp)")
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--prompt-words", type=int, default=150,
                        help="words per prompt (~1.3 tokens each)")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--dp", type=int, default=2, help="replicas (1: skip dp)")
    parser.add_argument("--dp-requests", type=int, default=16)


def skewed_stream(llm, num_requests: int, every: int = 3) -> dict:
    """Long and short requests in turn, a new one every `every` front-end steps (each a batch of
    outputs from some replica), to the end: per replica, the long requests it got and the most
    it ran at once."""
    from minivllm import SamplingParams
    engine, client = llm.engine, llm.engine.engine_core
    long = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    short = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    n = len(client.replicas)
    longs, peak = [0] * n, [0] * n
    t0 = time.perf_counter()
    for i in range(num_requests):
        engine.add_request(f"skew-{i}", f"Request {i}: say something.", (long, short)[i % 2])
        longs[client.owner[f"skew-{i}"]] += i % 2 == 0
        for _ in range(every):
            engine.step()
            peak = [max(p, s.num_running) for p, s in zip(peak, client.replica_stats())]
    while engine.has_unfinished_requests():
        engine.step()
        peak = [max(p, s.num_running) for p, s in zip(peak, client.replica_stats())]
    return {"longs": longs, "peak": peak, "seconds": time.perf_counter() - t0}


def run(args: argparse.Namespace) -> None:
    if args.pp > 1:
        run_pp(args)
    if args.dp > 1:
        run_dp(args)


def run_pp(args: argparse.Namespace) -> None:
    from minivllm import LLM, SamplingParams
    prompts = [" ".join(f"item{(i * 7 + j) % 97}" for j in range(args.prompt_words))
               for i in range(args.num_prompts)]
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    common = dict(max_model_len=1024, num_kv_blocks=512, enable_prefix_caching=False)
    one = LLM(args.model, **common)
    budget = max(len(one.tokenizer.encode(p)) for p in prompts)     # a prompt a step
    one.reconfigure(max_num_batched_tokens=budget)
    one.generate(prompts[:1], params, use_tqdm=False)                   # warm up
    rows = [("1 process", run_once(one, prompts, params))]
    del one
    pp = LLM(args.model, pipeline_parallel_size=args.pp, max_num_batched_tokens=budget,
             **common)
    try:
        pp.generate(prompts[:1], params, use_tqdm=False)
        with one_batch_in_flight(pp):
            rows.append((f"pp={args.pp}, 1 batch in flight", run_once(pp, prompts, params)))
        rows.append((f"pp={args.pp}, {args.pp} in flight", run_once(pp, prompts, params)))
    finally:
        pp.engine.shutdown()
    m = rows[0][1]["prefill_steps"]
    print(f"{args.num_prompts} prompts of {budget} tokens or fewer, {args.max_tokens} greedy "
          f"tokens each; budget {budget} tokens a step (a prompt a micro-batch)")
    print(f"{'':30}{'seconds':>9}{'steps':>7}{'MiB to last stage':>19}{'last stage idle':>17}")
    for label, r in rows:
        print(f"{label:30}{r['seconds']:9.2f}{r['steps']:7d}{r['received_mib']:19.1f}"
              f"{r['idle']:17.0%}")
    p = args.pp
    print(f"bubble formula (pp-1)/(m+pp-1) for the {m} prefill micro-batches: "
          f"{(p - 1) / (m + p - 1):.0%} with {p} in flight; {(p - 1) / p:.0%} with one "
          f"(each batch crosses every stage alone)")
    same = all(r["tokens"] == rows[0][1]["tokens"] for _, r in rows)
    print(f"same tokens as one process: {same}")


def run_dp(args: argparse.Namespace) -> None:
    from minivllm import LLM
    llm = LLM(args.model, data_parallel_size=args.dp, max_model_len=512, num_kv_blocks=256)
    client = llm.engine.engine_core
    results = {}
    try:
        for balance in ("round_robin", "score"):
            client.balance = balance
            results[balance] = skewed_stream(llm, args.dp_requests)
    finally:
        client.balance = "score"
        llm.engine.shutdown()
    print(f"\ndp={args.dp}: {args.dp_requests} requests, long (48 tokens) and short (4) in turn, "
          "a new one every 3 steps")
    print(f"{'':14}{'long requests per replica':>27}{'most running at once':>22}{'seconds':>9}")
    for balance, r in results.items():
        print(f"{balance:14}{str(r['longs']):>27}{str(r['peak']):>22}{r['seconds']:9.2f}")
    print("(on one CPU the replicas share its cores, each with its share of the threads; on "
          "GPUs each replica's batch and KV pool are its own)")
