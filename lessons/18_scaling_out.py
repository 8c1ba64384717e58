import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell
def _():
    import minivllm.platforms  # noqa: F401  first: without CUDA, Triton's interpreter on

    import dataclasses
    import time

    import marimo as mo
    import matplotlib.pyplot as plt
    import numpy as np
    import torch

    from minivllm import LLM, SamplingParams
    from minivllm.benchmarks.roofline import StepCost
    from minivllm.benchmarks.routing import rotating_chats
    from minivllm.distributed.parallel_state import check_tensor_parallel, kv_head_range
    from minivllm.distributed.pipeline import check_pipeline_parallel, get_pp_indices
    from minivllm.simulator import (MODEL_SHAPES, PROFILES, SLO, StepTimer, model_config,
                                    simulate, synthetic_requests)
    from minivllm.workloads import Request, poisson_arrivals
    return (LLM, MODEL_SHAPES, PROFILES, Request, SLO, SamplingParams, StepCost, StepTimer,
            check_pipeline_parallel, check_tensor_parallel, dataclasses, get_pp_indices,
            kv_head_range, mo, model_config, np, plt, poisson_arrivals, rotating_chats,
            simulate, synthetic_requests, time, torch)


@app.cell
def _(mo):
    mo.md(r"""
    # 18 · Scaling out: pipeline stages and data-parallel replicas

    Lesson 15 cut every layer across processes, over NVLink inside one node (lesson 17). This
    lesson goes past the node and past one copy of the engine: **pipeline parallelism** gives
    each process a run of whole layers and hands the hidden states on; **data parallelism**
    runs whole copies of the engine behind one front end. After it you can say what each rank
    holds and sends under `tp x pp x dp`, why a pipeline sends far fewer bytes than tensor
    parallelism (61x here) but leaves stages idle (the *bubble*), how batches in flight fill
    it, and why a data-parallel front end should route neither round-robin nor blind to the
    replicas' caches. You run the default model as two stages, three tensor ranks and two
    replicas here, each checked against one process; then, on simulated H100s, lay a 405B
    model over two nodes and weigh four replicas against one wide engine.
    """)
    return


@app.cell
def _(LLM, SamplingParams, mo, torch):
    PROMPTS = ["The capital of France is", "def fibonacci(n):", "Le chat est assis sur",
               "The three primary colors are"]
    GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    COMMON = dict(max_model_len=256, num_kv_blocks=64, enable_prefix_caching=False)
    one = LLM(**COMMON)
    reference = [o.outputs[0].token_ids for o in one.generate(PROMPTS, GREEDY, use_tqdm=False)]
    cfg = one.engine.model_config.hf_config
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    mo.md(f"**running on:** {device} · **model:** SmolLM2-135M-Instruct "
          f"({cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
          f"{cfg.num_attention_heads} query heads, {cfg.num_key_value_heads} KV heads) · "
          f"processes talk over {'NCCL' if device != 'CPU' else 'gloo (TCP on this machine)'}"
          f"  \n`{one.engine!r}`: one process, the reference every run below must match")
    return COMMON, GREEDY, PROMPTS, cfg, device, one, reference


@app.cell
def _(mo):
    mo.md(r"""
    ## The problem: one GPU is too small, one replica too slow

    Llama-3-70B's weights are 141 GB in bf16; an H100 has 80 GB. Tensor parallelism
    (lesson 15) splits each layer over 8 GPUs, but pays two all-reduces per layer, every
    step: fine over NVLink inside one node, slow across nodes. And a model that fits can
    still have more users than one copy serves. Three knobs, as in vLLM: `tensor_parallel_size`
    (tp), every layer split across tp ranks; `pipeline_parallel_size` (pp), the layers split
    into pp **stages** of consecutive layers, each sending its hidden states to the next;
    `data_parallel_size` (dp), dp **replicas**, each a whole engine with its own KV pool,
    behind one front end that picks a replica. A deployment uses `tp x pp x dp` GPUs. (Sizes
    above: published, not measured here.)
    """)
    return


@app.cell
def _(COMMON, GREEDY, LLM, PROMPTS, cfg, get_pp_indices, mo, reference):
    print("pipeline: starting a second process for stage 1, which loads its half of the layers "
          "(seconds) ...", flush=True)
    pp_llm = LLM(pipeline_parallel_size=2, **COMMON)
    stage_layers = [get_pp_indices(cfg.num_hidden_layers, _s, 2) for _s in range(2)]
    pp_group = pp_llm.engine.model_executor.pp       # the driver's end of the pipeline
    _bytes_before = pp_group.recv_bytes
    with pp_llm.engine.trace() as _steps:
        pp_tokens = [o.outputs[0].token_ids
                     for o in pp_llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    pp_bytes = pp_group.recv_bytes - _bytes_before
    pp_tokens_computed = sum(s.num_batched_tokens for s in _steps)
    mo.md(f"""
    ## Two stages, live

    `LLM(pipeline_parallel_size=2)` starts a second process. `get_pp_indices`
    (`minivllm/distributed/pipeline.py`) gives stage 0 the embedding and layers
    {stage_layers[0][0]}-{stage_layers[0][1] - 1}, stage 1 layers
    {stage_layers[1][0]}-{stage_layers[1][1] - 1}, the final norm and the LM head; a layer a
    stage lacks is a `PPMissingLayer` (no weights, no KV). Stage 1 samples: it is the
    **driver**, in the engine core's process.

    Each step, stage 0 sends one tensor: (tokens, hidden) = {cfg.hidden_size} floats per
    token. The {pp_tokens_computed} tokens these {len(PROMPTS)} prompts computed sent
    **{pp_bytes:,} bytes** to stage 1: {pp_bytes // pp_tokens_computed:,} bytes a token.
    Same tokens as one process: **{pp_tokens == reference}**.
    """)
    return pp_bytes, pp_group, pp_llm, pp_tokens, pp_tokens_computed, stage_layers


@app.cell
def _(COMMON, GREEDY, LLM, PROMPTS, mo, pp_bytes, pp_tokens_computed):
    print("tensor parallel: starting two more processes for ranks 1 and 2, each keeping its "
          "third of every layer (seconds) ...", flush=True)
    tp_llm = LLM(tensor_parallel_size=3, **COMMON)      # 9 heads: tp must divide them
    _tp_group = tp_llm.engine.model_executor.tp
    _before = (_tp_group.all_reduce_bytes, _tp_group.num_all_reduce)
    with tp_llm.engine.trace() as _steps:
        tp_tokens = [o.outputs[0].token_ids
                     for o in tp_llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    tp_bytes = _tp_group.all_reduce_bytes - _before[0]
    tp_all_reduces_per_step = (_tp_group.num_all_reduce - _before[1]) // len(_steps)
    tp_tokens_computed = sum(s.num_batched_tokens for s in _steps)
    tp_llm.engine.shutdown()                         # its worker processes end here
    mo.md(f"""
    ## The same prompts under tensor parallelism

    `LLM(tensor_parallel_size=3)`: each of the 30 layers split three ways. Every step did
    **{tp_all_reduces_per_step} all-reduces** (two a layer, one for the embedding), each of
    the whole (tokens, hidden) tensor: **{tp_bytes:,} bytes** for {tp_tokens_computed}
    tokens, {tp_bytes // tp_tokens_computed:,} a token, against the pipeline's
    {pp_bytes // pp_tokens_computed:,}: **{tp_bytes / pp_bytes:.0f}x** more (per rank's
    copy; a ring all-reduce moves about twice that over the wire). That is why vLLM's advice
    is tensor parallelism inside a node (NVLink) and pipeline stages across nodes.
    """)
    return tp_all_reduces_per_step, tp_bytes, tp_tokens, tp_tokens_computed


@app.cell
def _(mo):
    mo.md(r"""
    ## The bubble, and the batch queue that fills it

    While stage 1 works on a batch, stage 0 idles unless another batch is ready: with one
    batch at a time each stage idles (pp-1)/pp of the time. GPipe's answer is micro-batches:
    with m in flight, stages idle only while the pipeline fills and drains,
    **(pp-1)/(m+pp-1)**. vLLM V1's engine core keeps up to pp batches in flight
    (`step_with_batch_queue`), scheduling the next while the last stage finishes one; a
    request in flight is not scheduled again until its batch is back.

    Below, six prompts of one token each to generate, the token budget one prompt a step, so
    each prompt is its own micro-batch. First `max_num_seqs=1`: one request at a time, so
    nothing is ever ready to fill the second slot. Then `max_num_seqs=8`. Each bar is one
    batch, from the step that scheduled it to the step that took its outputs.
    """)
    return


@app.cell
def _(SamplingParams, pp_llm, time):
    # Six prompts of exactly 48 token ids, a budget of 48 tokens a step: one prompt a batch.
    BUBBLE_PROMPTS = [list(range(1000 + 50 * _i, 1048 + 50 * _i)) for _i in range(6)]
    _budget = 48

    def pipeline_run(max_num_seqs: int) -> dict:
        """The six prompts through the two stages; every batch's start and end, and counts."""
        pp_llm.reconfigure(max_num_seqs=max_num_seqs, max_num_batched_tokens=_budget)
        _one = SamplingParams(temperature=0, max_tokens=1)
        with pp_llm.engine.trace() as steps:
            _t0 = time.perf_counter()
            pp_llm.generate(BUBBLE_PROMPTS, _one, use_tqdm=False)
            wall = time.perf_counter() - _t0
        spans = [(s.start_time, s.start_time + s.duration) for s in steps]
        started_before_previous_ended = sum(1 for a, b in zip(spans, spans[1:]) if b[0] < a[1])
        busy = sum(e - s for s, e in spans)
        return {"steps": len(steps), "spans": spans, "wall": wall,
                "overlaps": started_before_previous_ended,
                "bubble": 1 - busy / (2 * (spans[-1][1] - spans[0][0]))}

    bubble_runs = {"one batch in flight": pipeline_run(1), "two in flight": pipeline_run(8)}
    pp_llm.reconfigure(max_num_seqs=64, max_num_batched_tokens=2048)   # back to the defaults
    return BUBBLE_PROMPTS, bubble_runs


@app.cell
def _(BUBBLE_PROMPTS, bubble_runs, mo, plt):
    _m, _pp = len(BUBBLE_PROMPTS), 2
    _fig, _axes = plt.subplots(1, 2, figsize=(11, 2.8), sharey=True)
    for _ax, (_label, _run) in zip(_axes, bubble_runs.items()):
        _t0 = _run["spans"][0][0]
        for _i, (_s, _e) in enumerate(_run["spans"]):
            _ax.barh(_i, _e - _s, left=_s - _t0, color=f"C{_i % 2}", alpha=0.8)
        _ax.set_title(f"{_label}: {_run['overlaps']} of {_run['steps'] - 1} batches start "
                      f"early", fontsize=9)
        _ax.set_xlabel("seconds")
    _axes[0].set_ylabel("batch (one prompt each)")
    _axes[0].invert_yaxis()
    _fig.tight_layout()
    _rows = "\n".join(f"| {_l} | {_r['steps']} | {_r['overlaps']} | {_r['bubble']:.0%} | "
                      f"{_r['wall']:.2f} |" for _l, _r in bubble_runs.items())
    mo.vstack([_fig, mo.md(f"""
    | run | batches | started before the previous ended | stage idle (measured) | seconds |
    |---|---|---|---|---|
    {_rows}

    The formula says {(_pp - 1) / _pp:.0%} idle with one batch at a time and
    {(_pp - 1) / (_m + _pp - 1):.0%} with {_m} micro-batches. The counts are the finding:
    with one request at a time no batch overlaps another; with room for eight, every batch
    after the first starts while the one before it is still in stage 1. The idle share is
    computed from the bars (1 - their summed length / (2 stages x the span)); on a 2-core
    CPU the two stages also share the cores, so the seconds say less than on two GPUs.

    One thing the picture does not show: in decode, vLLM V1 puts every running request in
    one batch, so a decode-heavy workload has one batch to pipeline, and the stages take
    turns. Pipelining pays where there are many independent micro-batches: prefills.
    """)])
    return


@app.cell
def _(mo):
    mo.md(r"""
    ## Exercise: predict the bytes, then the engine counts

    Three new prompts of 7, 12 and 20 tokens go through the two stages, 3 tokens generated
    each (greedy). How many bytes does stage 1 receive from stage 0? This machine runs the
    model in float32 (4 bytes), hidden size 576. Enter your answer; the engine's own counter
    (`recv_bytes` of the pipeline group) decides.
    """)
    return


@app.cell
def _(mo):
    bytes_guess = mo.ui.number(start=0, stop=10_000_000, step=1, value=0,
                               label="bytes stage 1 receives")
    bytes_guess
    return (bytes_guess,)


@app.cell
def _(SamplingParams, cfg, pp_group, pp_llm):
    _prompts = [list(range(100, 107)), list(range(200, 212)), list(range(300, 320))]
    _before = pp_group.recv_bytes
    pp_llm.generate(_prompts, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True),
                    use_tqdm=False)
    exercise_bytes = pp_group.recv_bytes - _before
    _float = 4
    _prompt_only = (7 + 12 + 20) * cfg.hidden_size * _float

    def check_bytes(value: float) -> str:
        if value == exercise_bytes:
            return (f"Correct: {exercise_bytes:,} bytes, one {cfg.hidden_size}-float row for "
                    "every token stage 0 computed.")
        if value == _prompt_only:
            return ("That counts the prompts only: each decode step sends one row too, for "
                    "the token it feeds in (the first token comes from the prefill).")
        if value == exercise_bytes // 2 or value == _prompt_only // 2:
            return "That is bfloat16's 2 bytes: this CPU runs the model in float32."
        return (f"Not quite: the engine counted {exercise_bytes:,}. Count the tokens each "
                "step feeds in (prompt tokens, then one per decode step) x hidden x 4.")
    return check_bytes, exercise_bytes


@app.cell
def _(bytes_guess, check_bytes, mo):
    mo.callout(mo.md(f"Your prediction: **{bytes_guess.value:,.0f}** bytes. "
                     f"{check_bytes(bytes_guess.value)}"),
               kind="success" if check_bytes(bytes_guess.value).startswith("Correct")
               else "warn")
    return


@app.cell
def _(bubble_runs, exercise_bytes, pp_llm):
    # The pipeline's last use above: its worker process ends here.
    _done = (bubble_runs, exercise_bytes)
    pp_llm.engine.shutdown()
    return


@app.cell
def _(mo):
    mo.md(r"""
    ## Data parallelism: which replica gets the next request?

    `LLM(data_parallel_size=2)` starts two engine cores, each in its own process with its
    own KV pool, behind one front end (`DPLBClient`, vLLM's `DPLBAsyncMPClient`). A request
    stays on its replica, so its stop strings and aborts reach it. Which one? Round-robin is
    blind: below, long (20 tokens) and short (3) requests alternate, each a few front-end
    steps after the last one's first token, and round-robin sends every long one to replica
    0. minivllm picks the lowest **4 x waiting + running** (vLLM V1's score in earlier
    releases), from the stats each replica sends with its outputs, the requests sent since
    and not answered counted as waiting (hence the wait for a first token: on a loaded CPU a
    slow replica looks four times as busy). vLLM 0.33 scores waiting + running, and weighs
    waiting requests more only on a replica whose KV cache is over half full.
    """)
    return


@app.cell
def _(LLM, SamplingParams, time):
    def skewed_stream(llm, balance: str, n: int = 10, every: int = 3) -> dict:
        """Long and short requests in turn, each `every` front-end steps after the last one's
        first output; after each step, the time and each replica's queue."""
        client = llm.engine.engine_core
        client.balance = balance
        long = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
        short = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
        longs, queue, times, t0 = [0, 0], [], [], time.perf_counter()

        def record():
            queue.append([s.num_running + s.num_waiting for s in client.replica_stats()])
            times.append(time.perf_counter() - t0)

        for _i in range(n):
            llm.engine.add_request(f"{balance}-{_i}", f"Request {_i}: say something.",
                                   (long, short)[_i % 2])
            _rank = client.owner[f"{balance}-{_i}"]
            longs[_rank] += _i % 2 == 0
            while client.unseen[_rank]:      # until its first output: the replica's own stats
                llm.engine.step()            # count it from then on (before, a guess: waiting)
                record()
            for _ in range(every):
                llm.engine.step()
                record()
        while llm.engine.has_unfinished_requests():
            llm.engine.step()
            record()
        return {"longs": longs, "queue": queue, "times": times, "seconds": times[-1]}

    print("data parallel: two engine cores, a process each (seconds) ...", flush=True)
    dp_llm = LLM(data_parallel_size=2, max_model_len=256, num_kv_blocks=64,
                 kv_events_config={"enable_kv_cache_events": True})   # for the next section
    dp_runs = {b: skewed_stream(dp_llm, b) for b in ("round_robin", "score")}
    return dp_llm, dp_runs


@app.cell
def _(dp_runs, mo, plt):
    _fig, _axes = plt.subplots(1, 2, figsize=(11, 2.8), sharey=True)
    for _ax, (_balance, _run) in zip(_axes, dp_runs.items()):
        for _r in range(2):
            _ax.step(_run["times"], [_q[_r] for _q in _run["queue"]], where="post",
                     label=f"replica {_r}")
        _ax.set_title(f"{_balance}: long requests per replica {_run['longs']}, "
                      f"{_run['seconds']:.1f} s", fontsize=9)
        _ax.set_xlabel("seconds")
    _axes[0].set_ylabel("running + waiting")
    _axes[0].legend()
    _fig.tight_layout()
    mo.vstack([_fig, mo.md(f"""
    Round-robin gave the replicas **{dp_runs['round_robin']['longs']}** long requests: one
    carries all the long work, its queue growing, the other's near empty. The score gave
    **{dp_runs['score']['longs']}**. The counts are the finding; the seconds say little where
    both replicas share one CPU. Each replica's stats arrive with its outputs: the front end
    always sees a step-old picture, as in vLLM.
    """)])
    return


@app.cell
def _(mo):
    _headless = mo.app_meta().mode == "script" or "headless" in mo.cli_args()
    route_guess = mo.ui.radio({"replica 0": 0, "replica 1": 1}, label="your answer",
                              value="replica 0" if _headless else None)
    mo.vstack([mo.md(r"""
    ### Which replica holds the chat? Routing by prefix

    A chat's next turn resends its history, cached (lesson 05) only where the last turn ran;
    the score counts queues, not caches. With `kv_events_config={"enable_kv_cache_events":
    True}` each core sends vLLM's **KV events** (`BlockStored`, `BlockRemoved`) with its
    outputs, the front end keeps each replica's block hashes (`minivllm/routing.py`), and
    `data_parallel_balance="prefix"` picks the lowest `load - 8 x (share of the prompt's
    blocks held)`. Three chats, three turns, each round sent together in a rotating order.
    *Predict:* under the score, round 2 starts with chat 1 (on replica 1 in round 1), both
    replicas idle: where does it go?
    """), route_guess])
    return (route_guess,)


@app.cell
def _(dp_llm, rotating_chats):
    routed = {}                 # rotating_chats: minivllm/benchmarks/routing.py; fresh pools
    for _balance in ("score", "prefix"):
        routed[_balance] = rotating_chats(dp_llm.reconfigure(data_parallel_balance=_balance))
    dp_llm.engine.shutdown()
    return (routed,)


@app.cell
def _(mo, route_guess, routed):
    _truth = routed["score"]["where"][1][1]
    _rows = "\n    ".join(f"| {b} | {r['where']} | {r['hits']} |" for b, r in routed.items())
    mo.md(f"""
    Replica **{_truth}** (you said {route_guess.value}): both idle, a tie goes to the first,
    so the chats swap replicas as the order rotates and compute their histories again. Prefix
    routing kept each chat home; its weight keeps the load even (a replica over two requests
    busier is not chosen for its cache: `minivllm bench routing`, eight chats).

    | policy | each chat's replica, turn by turn | prompt tokens found cached |
    |---|---|---|
    {_rows}
    """)
    return


@app.cell
def _(MODEL_SHAPES, mo):
    plan_model = mo.ui.dropdown(MODEL_SHAPES, value="Llama-3-70B", label="model")
    plan_tp = mo.ui.slider(1, 16, value=8, label="tp", show_value=True)
    plan_pp = mo.ui.slider(1, 8, value=2, label="pp", show_value=True)
    plan_dp = mo.ui.slider(1, 8, value=1, label="dp", show_value=True)
    mo.vstack([mo.md(r"""
    ## Plan a deployment: what each rank holds and sends

    Pick a model and `tp x pp x dp`. The table uses the engine's own split (`get_pp_indices`)
    and checks (`check_tensor_parallel`, `check_pipeline_parallel`): an impossible split
    shows the engine's error. Weights and traffic are bf16, per GPU of 80 GB. Find a setting
    that does not fit, one the engine refuses, and the cheapest fitting Llama-3-70B with KV room.
    """), mo.hstack([plan_model, plan_tp, plan_pp, plan_dp])])
    return plan_dp, plan_model, plan_pp, plan_tp


@app.cell
def _(StepCost, check_pipeline_parallel, check_tensor_parallel, get_pp_indices,
      kv_head_range, model_config, torch):
    def plan(name: str, tp: int, pp: int, dp: int, gpu_gb: float = 80) -> dict:
        """Per stage: layers, weights per rank (GB), KV bytes per token per rank; traffic per
        token; or the engine's error for a split it refuses. Sizes from the roofline's
        StepCost (lesson 01), in bf16."""
        c = model_config(name)
        try:
            check_tensor_parallel(c, tp)
            check_pipeline_parallel(c, pp)
        except ValueError as e:
            return {"error": str(e)}
        cost = StepCost.of(c, torch.bfloat16)
        layers = c.num_hidden_layers
        kv_share = len(kv_head_range(c, 0, tp)) / c.num_key_value_heads
        stages = []
        for s in range(pp):
            start, end = get_pp_indices(layers, s, pp)
            params = (end - start) * cost.linear_params / layers / tp
            params += cost.head_params / tp * ((s == 0) + (s == pp - 1))   # embed, head
            stages.append({"layers": f"{start}-{end - 1}", "n": end - start,
                           "weights_gb": params * cost.elem / 1e9,
                           "kv_per_token": round(cost.kv_token_bytes * (end - start) / layers
                                                 * kv_share)})
        return {"stages": stages, "gpus": tp * pp * dp,
                # the first stage's: two all-reduces a layer, one for the embedding
                "tp_bytes_per_token": (2 * stages[0]["n"] + 1) * cost.hidden_bytes,
                "pp_bytes_per_token": cost.hidden_bytes,
                "fits": all(st["weights_gb"] < gpu_gb for st in stages)}
    return (plan,)


@app.cell
def _(mo, plan, plan_dp, plan_model, plan_pp, plan_tp):
    _p = plan(plan_model.value, plan_tp.value, plan_pp.value, plan_dp.value)
    if "error" in _p:
        _out = mo.callout(mo.md(f"**The engine refuses this split:** {_p['error']}"),
                          kind="danger")
    else:
        _rows = "\n".join(f"| {_i} | {_s['layers']} | {_s['weights_gb']:.1f} | "
                          f"{80 - _s['weights_gb']:.1f} | {_s['kv_per_token']:,} |"
                          for _i, _s in enumerate(_p["stages"]))
        _verdict = ("fits" if _p["fits"] else "**does not fit**: a stage's weights exceed "
                    "80 GB")
        _out = mo.md(f"""
    **{_p['gpus']} GPUs**; {_verdict}.

    | stage | layers | weights per rank (GB) | left for KV (GB) | KV bytes per token per rank |
    |---|---|---|---|---|
    {_rows}

    Per token and step, each tensor rank of the first stage all-reduces
    {_p['tp_bytes_per_token']:,} bytes (two a layer, plus the embedding's); each stage
    boundary carries {_p['pp_bytes_per_token']:,} bytes to the next stage. dp multiplies the
    GPUs and the requests served, and changes neither.
    """)
    _out
    return


@app.cell
def _(mo):
    mo.md(r"""
    ## A 405B-class model on two nodes of 8 H100 (simulated)

    Llama-3.1-405B's 810 GB of bf16 weights outgrow one node of eight 80 GB GPUs. Two nodes
    give two obvious layouts of 16 GPUs: **TP8 x PP2**, tensor parallel inside each node over
    NVLink (450 GB/s a direction), the two stages across the node link (a 400 Gb/s NIC per
    GPU, 50 GB/s); and **TP16**, one group of 16 whose every all-reduce crosses that link.
    The simulator of lesson 17 serves the same 200 requests (prompts of ~900 tokens, answers
    of ~180, 4 a second) on both: the engine's own scheduler on a virtual clock, each step
    timed by the cost model. **Every number in this section and the next is simulated** on
    data-sheet peaks with assumed efficiencies (`minivllm/simulator/cost_model.py`); the
    counts of bytes, blocks and requests are not, and bytes marked *formula* are computed.
    """)
    return


@app.cell
def _(PROFILES, dataclasses, mo, np, plan, poisson_arrivals, simulate, synthetic_requests):
    def sim_workload(n: int, rate: float) -> list:
        """n requests: prompts of ~900 tokens, answers of ~180 (log-normal, 4 to 1000 tokens),
        Poisson arrivals at `rate` a second; the same list for the same n and rate."""
        reqs = synthetic_requests(n, prompt=(6.5, 0.6, 16, 4000), output=(5.0, 0.6, 4, 1000),
                                  seed=3)
        return poisson_arrivals(reqs, rate, seed=3)

    NODE_LINK = 50e9           # bytes/s a direction: one 400 Gb/s NIC per GPU (data sheet)
    # TP16's all-reduces cross that link: the H100 profile with it in place of NVLink.
    IB = dataclasses.replace(PROFILES["H100"], link_bandwidth=NODE_LINK, link_latency=2e-5,
                             name="H100, 400 Gb/s InfiniBand between nodes")
    _big = dict(model="Llama-3.1-405B", max_num_seqs=128, max_model_len=8192)
    print("simulating Llama-3.1-405B on 16 H100s, two layouts of 200 requests (about a "
          "second) ...", flush=True)
    big_workload = sim_workload(200, 4)
    big_runs = {
        "TP8 x PP2": simulate(sim_workload(200, 4), profile="H100", tensor_parallel_size=8,
                              pipeline_parallel_size=2, pipeline_link_bandwidth=NODE_LINK,
                              **_big),
        "TP16": simulate(sim_workload(200, 4), profile=IB, tensor_parallel_size=16, **_big),
    }
    big_plans = {"TP8 x PP2": plan("Llama-3.1-405B", 8, 2, 1),
                 "TP16": plan("Llama-3.1-405B", 16, 1, 1)}

    def latency_table(first: str, runs: dict, more: list[str], cells) -> str:
        """A markdown table, a row a SimResult: TTFT p50 / p90, ITL p50, E2E p50, output
        tokens/s, then the columns `more` that cells(name, result) fills."""
        head = [first, "TTFT p50 / p90, s", "ITL p50, ms", "E2E p50, s", "output tokens/s"]
        lines = ["| " + " | ".join(head + more) + " |", "|---" * (len(head) + len(more)) + "|"]
        for name, res in runs.items():
            t50, t90 = np.percentile(res.ttft, [50, 90])
            row = [f"**{name}** · {res.label}", f"{t50:.2f} / {t90:.2f}",
                   f"{1000 * np.median(res.itl):.0f}", f"{np.median(res.e2e):.1f}",
                   f"{res.num_output_tokens / res.elapsed:,.0f}", *cells(name, res)]
            lines.append("| " + " | ".join(row) + " |")
        return "\n".join(lines)

    _table = latency_table(
        "16 GPUs, simulated", big_runs, ["KV blocks a GPU holds", "KV bytes a token, a GPU"],
        lambda k, r: [f"{r.num_kv_blocks:,}", f"{big_plans[k]['stages'][0]['kv_per_token']:,}"])
    mo.md(f"""
    {_table}

    The same 200 requests, the same GPUs: TP16 makes a request wait
    **{np.median(big_runs['TP16'].ttft) / np.median(big_runs['TP8 x PP2'].ttft):.0f}x**
    longer for its first token (simulated, on the labels' profiles; the first row's stages
    sit across the 50 GB/s link, which its label does not name). And it holds half the KV:
    16 ranks share Llama's 8 KV heads, so each head is kept on two GPUs (`kv_head_range`),
    while a TP8 rank holds one head of half the layers (the planner above, `plan`). The
    bytes below say where the seconds go.
    """)
    return IB, NODE_LINK, big_plans, big_runs, big_workload, latency_table, sim_workload


@app.cell
def _(mo):
    mo.md(r"""
    ## Exercise: predict what crosses the node link

    One decode step of 64 sequences of Llama-3.1-405B in bf16 (2 bytes), hidden size 16384,
    126 layers, a vocabulary of 128,256. How many bytes cross the node link in **TP8 x PP2**
    (all of them, at the stage boundary), and how many through **each GPU's** link in
    **TP16**, whose ring collectives cross it: the all-reduces of the layers and of the
    vocabulary-split embedding, and the all-gather of the split LM head's logits? The
    simulator decides: its executor counts what stage 0 sends, its `StepTimer` what TP16's
    collectives move.
    """)
    return


@app.cell
def _(IB, NODE_LINK, Request, SamplingParams, StepTimer, model_config, simulate):
    def pp_bytes_sent(max_tokens: int) -> int:
        """What stage 0 sends in a simulated TP8 x PP2 run of 64 prompts of 16 tokens."""
        reqs = [Request(list(range(100 + 16 * i, 116 + 16 * i)),
                        SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
                for i in range(64)]
        res = simulate(reqs, model="Llama-3.1-405B", profile="H100", tensor_parallel_size=8,
                       pipeline_parallel_size=2, pipeline_link_bandwidth=NODE_LINK,
                       max_num_seqs=64, max_model_len=8192)
        return res.executors["engine-0"].send_bytes

    _timer = StepTimer(model_config("Llama-3.1-405B"), IB, tensor_parallel_size=16)
    _message = 64 * _timer.cost.hidden_bytes            # one all-reduce: (64, hidden) in bf16
    _logits = 64 * _timer.logits_bytes                   # the gathered (64, vocab) in bf16
    link_truth = {
        # one more token each: 64 more tokens through stage 0, one decode step's worth
        "TP8 x PP2": pp_bytes_sent(3) - pp_bytes_sent(2),
        # all-reduces a step x 2 (tp - 1) / tp of the message (ring = that / link bandwidth),
        # and the all-gather, (tp - 1) / tp of the logits
        "TP16": round((_timer.num_all_reduces * _message + _logits / 2) * _timer.ring
                      * IB.link_bandwidth),
    }
    _ring = 2 * 15 * _message // 16                      # one all-reduce, through one GPU
    _gather = 15 * _logits // 16

    def check_link_bytes(pp_guess: float, tp_guess: float) -> str:
        pp, tp = link_truth["TP8 x PP2"], link_truth["TP16"]
        if pp_guess == pp and tp_guess == tp:
            return (f"Correct: {pp:,} bytes against {tp:,} through each GPU's link, "
                    f"{tp / pp:.1f}x: (2 x 126 + 1) all-reduces x 2 (16 - 1) / 16 per GPU "
                    "and (16 - 1) / 16 of the logits, to one hidden state a token.")
        notes = []
        if pp_guess == 2 * pp:
            notes.append("TP8 x PP2: bf16 is 2 bytes a value, not 4.")
        elif pp_guess == 8 * pp:
            notes.append("TP8 x PP2: one hidden state a token crosses, not one per tensor "
                         "rank (vLLM sends each rank's eighth and gathers it on the far side).")
        elif pp_guess != pp:
            notes.append("TP8 x PP2: one (64, 16384) bf16 tensor crosses the boundary.")
        if tp_guess in (252 * _message, 253 * _message):
            notes.append("TP16: a ring all-reduce moves 2 (tp - 1) / tp of the message "
                         "through every GPU (reduce-scatter, then all-gather), 1.875x here.")
        elif tp_guess in (126 * _ring, 126 * _ring + _gather, 127 * _ring + _gather):
            notes.append("TP16: two all-reduces a layer, after attention's o_proj and after "
                         "the MLP's down_proj.")
        elif tp_guess in (252 * _ring, 252 * _ring + _gather):
            notes.append("TP16: add the embedding's all-reduce: each rank looks up only its "
                         "slice of the vocabulary, and the sum assembles the rows (2L + 1).")
        elif tp_guess == 253 * _ring:
            notes.append("TP16: add the logits' all-gather: each rank's LM head computes its "
                         "slice of the vocabulary, (64, 128256 / 16), and every rank needs "
                         "all of it: (tp - 1) / tp of (64, 128256) x 2 bytes through each GPU.")
        elif tp_guess != tp:
            notes.append("TP16: count (2 x layers + 1) all-reduces x 2 (tp - 1) / tp x "
                         "(64, 16384) x 2 bytes, and (tp - 1) / tp of the (64, 128256) logits.")
        return "Not yet. " + " ".join(notes)
    return check_link_bytes, link_truth


@app.cell
def _(link_truth, mo):
    # The headless run fills in the right answers; the checks at the end also try wrong ones.
    _headless = mo.app_meta().mode == "script" or "headless" in mo.cli_args()
    link_guess_pp = mo.ui.number(start=0, stop=10**12, step=1, label="bytes, TP8 x PP2",
                                 value=link_truth["TP8 x PP2"] if _headless else 0)
    link_guess_tp = mo.ui.number(start=0, stop=10**12, step=1, label="bytes per GPU, TP16",
                                 value=link_truth["TP16"] if _headless else 0)
    mo.hstack([link_guess_pp, link_guess_tp], justify="start")
    return link_guess_pp, link_guess_tp


@app.cell
def _(check_link_bytes, link_guess_pp, link_guess_tp, mo):
    _verdict = check_link_bytes(link_guess_pp.value, link_guess_tp.value)
    mo.callout(mo.md(f"Your prediction: **{link_guess_pp.value:,.0f}** and "
                     f"**{link_guess_tp.value:,.0f}** bytes. {_verdict}"),
               kind="success" if _verdict.startswith("Correct") else "warn")
    return


@app.cell
def _(NODE_LINK, big_runs, big_workload, mo, model_config):
    big_cfg = model_config("Llama-3.1-405B")
    big_hidden_bytes = big_cfg.hidden_size * 2           # one token's hidden state, bf16
    _logits_bytes = big_cfg.vocab_size * 2               # one sampled row's logits, bf16
    _layers = big_cfg.num_hidden_layers

    def link_bytes(tokens: int, sampled: int) -> dict:
        """Bytes that cross the node link in a step of `tokens` tokens, `sampled` of them
        sampling, from the shapes: the pipeline sends one hidden state a token over its one
        boundary; TP16's ring, two all-reduces a layer and one after the embedding, moves
        2 (tp - 1) / tp of each through every GPU's link, so through the node link too (a ring
        goes at its slowest hop), and (tp - 1) / tp of the logits it gathers. And TP8's inside
        a node, over NVLink, per GPU of the last stage (63 layers, the logits' gather)."""
        return {"TP8 x PP2": tokens * big_hidden_bytes,
                "TP16": ((2 * _layers + 1) * 2 * 15 * tokens * big_hidden_bytes // 16
                         + 15 * sampled * _logits_bytes // 16),
                "NVLink": (2 * (_layers // 2) * 2 * 7 * tokens * big_hidden_bytes // 8
                           + 7 * sampled * _logits_bytes // 8)}

    _steps = big_runs["TP8 x PP2"].engine_steps["engine-0"]
    _executor = big_runs["TP8 x PP2"].executors["engine-0"]
    pp_sim_tokens = sum(s.num_batched_tokens for s in _steps)
    pp_sim_sent = _executor.send_bytes
    # Every prompt token and every answer token but the last goes through stage 0 once.
    big_tokens_expected = sum(len(r.prompt) + r.params.max_tokens - 1 for r in big_workload)
    step_bytes = {"a decode step of 64 sequences": link_bytes(64, 64),
                  "a prefill step of 2048 tokens (the token budget), two prompts ending":
                  link_bytes(2048, 2)}

    def _cell(n: float, bandwidth: float = NODE_LINK) -> str:
        return f"{n / 1e6:,.1f} MB ({1000 * n / bandwidth:,.2f} ms)"

    _head = ("| *formula*, from the shapes | TP8 x PP2: across the node link, in all | "
             "TP16: through each GPU's link | TP8 x PP2: over NVLink, each GPU of stage 1 |\n"
             "|---|---|---|---|")
    _rows = "\n".join(f"| {_k} | {_cell(_b['TP8 x PP2'])} | {_cell(_b['TP16'])} | "
                      f"{_cell(_b['NVLink'], 450e9)} |" for _k, _b in step_bytes.items())
    _decode, _prefill = (_b["TP16"] / NODE_LINK for _b in step_bytes.values())
    mo.md(f"""
    ## Bytes across the node link: a formula, then the simulator's count

    {_head}
    {_rows}

    (times: the bytes over the data-sheet bandwidth, 50 GB/s between nodes, 450 GB/s NVLink,
    before latency.) The pipeline sends one hidden state a token across the node link:
    {big_hidden_bytes:,} bytes. Every TP16 all-reduce crosses it, two a layer and the
    embedding's: **{link_bytes(1, 0)['TP16'] / big_hidden_bytes:.1f}x** the bytes a token
    before the logits' gather, each of its {2 * _layers + 1} all-reduces a step waiting the
    link's latency too; TP8 x PP2 keeps them on NVLink. A decode step costs TP16
    {1000 * _decode:.0f} ms of node link, a full prefill step {1000 * _prefill:,.0f} ms: where
    its TTFT went.

    Over the whole run the simulator's executor counted **{pp_sim_sent:,} bytes** in
    {_executor.num_sends:,} sends for the {pp_sim_tokens:,} tokens stage 0 computed
    (x {big_hidden_bytes:,} = {pp_sim_tokens * big_hidden_bytes:,}): the prompts plus the
    answers less one token each ({big_tokens_expected:,}). The TP16 figure is a flat ring's;
    NCCL would reduce inside each node first, still 254 collectives a step across the link to
    the pipeline's one send. vLLM's advice follows: tensor parallel inside a node, pipeline
    stages across nodes.
    """)
    return big_hidden_bytes, big_tokens_expected, link_bytes, pp_sim_sent, pp_sim_tokens


@app.cell
def _(mo):
    mo.md(r"""
    ## Four replicas or one wide engine? Qwen3-32B on 8 H100s (simulated)

    Qwen3-32B's 65 GB of bf16 weights fit on two H100s with room for KV. Eight GPUs run it as
    **TP8**, one engine cut eight ways, or **DP4 x TP2**, four engines of two GPUs behind the
    front end's router (the real `DPLBClient`'s). 300 requests arrive at 60 a second.
    """)
    return


@app.cell
def _(SLO, latency_table, mo, model_config, np, plan, plt, sim_workload, simulate):
    DP_RATE = 60                               # requests/s, where the two layouts part
    SLO_32B = SLO(ttft=1.0, itl=0.05)          # the same for both: TTFT 1 s, mean ITL 50 ms
    _mid = dict(model="Qwen3-32B", profile="H100", max_num_seqs=128, max_model_len=8192)
    print("simulating Qwen3-32B on 8 H100s as TP8 and as DP4 x TP2, 300 requests each "
          "(a few seconds) ...", flush=True)
    layout_workload = sim_workload(300, DP_RATE)
    layout_runs = {
        "TP8": simulate(sim_workload(300, DP_RATE), tensor_parallel_size=8, **_mid),
        "DP4 x TP2": simulate(sim_workload(300, DP_RATE), tensor_parallel_size=2,
                              data_parallel_size=4, **_mid),
    }

    def per_engine(res) -> dict:
        """Each engine's requests, KV pool (blocks of 16 tokens) and computed tokens."""
        return {name: {"requests": len({q.request_id for s in steps for q in s.scheduled}),
                       "kv_blocks": steps[-1].stats.num_blocks_total,
                       "tokens": sum(s.num_batched_tokens for s in steps)}
                for name, steps in res.engine_steps.items()}

    engines = {_k: per_engine(_r) for _k, _r in layout_runs.items()}
    _last_arrival = max(r.arrival_time for r in layout_workload)
    # Requests waiting, all engines, after each one's first step past the last arrival.
    waiting_at_last_arrival = {
        _k: sum(next((s.stats.num_waiting for s in _steps if s.start_time >= _last_arrival), 0)
                for _steps in _r.engine_steps.values())
        for _k, _r in layout_runs.items()}
    _qwen = model_config("Qwen3-32B")

    def all_reduce_bytes(tp: int, tokens: int) -> int:
        """What one GPU of a TP group moves in all-reduces for `tokens` tokens: two a layer,
        each 2 (tp - 1) / tp of the (tokens, hidden) bf16 message."""
        return 2 * _qwen.num_hidden_layers * 2 * (tp - 1) * tokens * _qwen.hidden_size * 2 // tp

    gpu_all_reduce_bytes = {
        "TP8": all_reduce_bytes(8, engines["TP8"]["engine-0"]["tokens"]),
        "DP4 x TP2": max(all_reduce_bytes(2, e["tokens"])
                         for e in engines["DP4 x TP2"].values())}
    _weights = {"TP8": plan("Qwen3-32B", 8, 1, 1), "DP4 x TP2": plan("Qwen3-32B", 2, 1, 4)}
    _longest = max(r.params.max_tokens for r in layout_workload)
    _itl = {_k: 1000 * np.median(_r.itl) for _k, _r in layout_runs.items()}

    _fig, _ax = plt.subplots(figsize=(8, 2.8))
    for _k, _r in layout_runs.items():
        _ax.plot(_r.arrival, _r.ttft, ".", ms=3, label=f"{_k}: {_r.label}")
    _ax.axhline(SLO_32B.ttft, ls=":", c="k", label="TTFT SLO")
    _ax.set(xlabel="arrival, s (simulated)", ylabel="TTFT, s (simulated)", yscale="log")
    _ax.legend(fontsize=7)
    _fig.tight_layout()
    _table = latency_table(
        f"8 GPUs, simulated, {DP_RATE} req/s", layout_runs,
        ["within the SLO", "waiting at the last arrival", "preemptions"],
        lambda k, r: [f"{r.goodput(SLO_32B):.0%}", f"{waiting_at_last_arrival[k]}",
                      f"{r.num_preemptions}"])

    def _per(field: str) -> str:
        return " | ".join(", ".join(f"{e[field]:,}" for e in engines[k].values())
                          for k in layout_runs)

    _gb = {_k: f"{_p['stages'][0]['weights_gb']:.1f} GB" for _k, _p in _weights.items()}
    _ar = {_k: f"{_b / 1e9:,.0f} GB" for _k, _b in gpu_all_reduce_bytes.items()}
    _counts = "\n".join([
        "| counted in the run, except rows marked *formula* | TP8 | DP4 x TP2 |", "|---|---|---|",
        f"| weights a GPU holds (*formula*: the planner) | {_gb['TP8']} | {_gb['DP4 x TP2']} |",
        f"| KV pool per engine, blocks of 16 tokens | {_per('kv_blocks')} |",
        f"| requests each engine served | {_per('requests')} |",
        f"| tokens each engine computed | {_per('tokens')} |",
        f"| bytes a GPU all-reduced (formula; DP4: busiest) | {_ar['TP8']} | {_ar['DP4 x TP2']} |"])
    mo.vstack([_fig, mo.md(f"""
    {_table}

    {_counts}

    The counts first. The balancer spread the requests evenly. One TP8 engine keeps the
    weights once and so has the bigger KV pool: the four replicas' four copies leave pools
    that add up to {sum(e['kv_blocks'] for e in engines['DP4 x TP2'].values())
    / engines['TP8']['engine-0']['kv_blocks']:.0%} of it (no run here needed more). A TP8 GPU
    all-reduces every token, 2 x 7/8 of the message; a TP2 GPU its engine's quarter, 2 x 1/2
    of it: {gpu_all_reduce_bytes['TP8'] / gpu_all_reduce_bytes['DP4 x TP2']:.0f}x fewer bytes.

    Then the seconds, **simulated on the data-sheet profile (assumed efficiencies)**. TP8
    gives each token the lower ITL, {_itl['TP8']:.1f} ms against {_itl['DP4 x TP2']:.1f}
    (p50): a step reads a quarter of the weights a GPU. But one engine steps all 300 requests
    and at {DP_RATE} req/s falls behind: at the last arrival {waiting_at_last_arrival['TP8']}
    requests waited in its queue, against {waiting_at_last_arrival['DP4 x TP2']} in all four
    replicas'. TTFT climbs with each arrival, and {layout_runs['TP8'].goodput(SLO_32B):.0%}
    meet the SLO against {layout_runs['DP4 x TP2'].goodput(SLO_32B):.0%}. Output tokens/s
    can still favour TP8 in a run of 300: it ends with the longest answer, {_longest}
    tokens, {_longest * _itl['TP8'] / 1000:.0f} s against
    {_longest * _itl['DP4 x TP2'] / 1000:.0f} s at each ITL p50. Lesson 17's capacity search
    finds the rate where each layout stops meeting an SLO.
    """)])
    return (DP_RATE, SLO_32B, engines, gpu_all_reduce_bytes, layout_runs, layout_workload,
            waiting_at_last_arrival)


@app.cell
def _(mo):
    mo.md(r"""
    ## Where the code lives

    - `minivllm/distributed/pipeline.py`: `get_pp_indices`, `split_for_stage` (each stage's
      `PPMissingLayer`s), the pipeline's checks.
    - `minivllm/distributed/parallel_state.py`: `PipelineParallelGroup` (send and receive of
      the hidden states, counted), `TensorParallelGroup` (the all-reduces).
    - `minivllm/engine/core.py`: `EngineCore.step_with_batch_queue`; the scheduler's
      `in_flight` set in `minivllm/core/scheduler.py`.
    - `minivllm/executor/multiproc_executor.py`: the ranks, `execute_model(non_block=True)`.
    - `minivllm/engine/multiproc/dp_client.py`: `DPLBClient`; `minivllm/routing.py`: the
      policies and the per-replica index of KV events (`core/kv_events.py`).
    - `minivllm/simulator/simulator.py`: `SimulatedExecutor._run_stages` (a clock per stage,
      the hidden states counted) and `simulate(data_parallel_size=...)` (the replicas behind
      the same `Router`); `cost_model.py`: `StepTimer`'s all-reduce term.
    - Several hosts and Ray: README's *Scale out* (`--nnodes`, `--headless`, Ray) and
      `scripts/two_hosts.sh`.

    Next, lesson 19, the capstone: given a memory budget and an SLO on TTFT and ITL, which
    settings of the whole engine, Part I's knobs and Part II's mechanisms, meet it?
    """)
    return


@app.cell
def _(mo):
    mo.callout(mo.md(r"""
    **In vLLM V1** (as of vLLM 0.33). Open `vllm/distributed/utils.py` (`get_pp_indices`),
    `vllm/model_executor/models/utils.py` (`PPMissingLayer`, `make_layers`), `vllm/sequence.py`
    (`IntermediateTensors`: the hidden states *and* the residual cross a stage, because vLLM's
    fused add-norm keeps the residual apart; minivllm's model adds it in place, so one tensor
    crosses), `vllm/v1/engine/core.py` (`step_with_batch_queue`, `max_concurrent_batches`),
    `vllm/v1/executor/multiproc_executor.py` and `ray_executor_v2.py` (`RayExecutorV2`: the
    same message queues, workers as Ray actors), and `vllm/v1/engine/core_client.py`
    (`DPLBAsyncMPClient`: waiting + running, waiting weighed more once a replica's KV cache is
    over half full). vLLM's output rank is the last stage's first tensor rank, in a worker
    process; minivllm's driver is the same rank in the engine core's process. vLLM's DP
    coordinator process publishes the replicas' queue lengths and keeps MoE replicas in
    lockstep ("waves"; minivllm: dense models only, stats with the outputs). Its KV events
    (`vllm/distributed/kv_events.py`) go out on a ZMQ socket to routers outside vLLM (llm-d,
    the production-stack router): its own DP client balances by load, not by prefix.
    """), kind="info")
    return


@app.cell
def _(PROMPTS, big_hidden_bytes, big_plans, big_runs, big_tokens_expected, big_workload,
      bubble_runs, check_bytes, check_link_bytes, cfg, dp_runs, engines, exercise_bytes,
      gpu_all_reduce_bytes, layout_runs, layout_workload, link_bytes, link_truth, np, plan,
      pp_bytes, pp_sim_sent, pp_sim_tokens, pp_tokens, pp_tokens_computed, reference, routed,
      tp_all_reduces_per_step, tp_bytes, tp_tokens, tp_tokens_computed):
    def test_pipeline_and_tensor_ranks_match_one_process():
        assert pp_tokens == reference == tp_tokens and len(reference) == len(PROMPTS)
        assert all(len(t) == 4 for t in reference)

    def test_one_row_per_token_crosses_a_stage():
        assert pp_bytes == pp_tokens_computed * cfg.hidden_size * 4 > 0

    def test_tensor_parallel_sends_two_rows_per_layer():
        assert tp_all_reduces_per_step == 2 * cfg.num_hidden_layers + 1
        assert tp_bytes == tp_tokens_computed * tp_all_reduces_per_step * cfg.hidden_size * 4
        assert tp_bytes / tp_tokens_computed > 50 * pp_bytes / pp_tokens_computed

    def test_batches_overlap_only_with_room_in_flight():
        one, two = bubble_runs["one batch in flight"], bubble_runs["two in flight"]
        assert one["steps"] == two["steps"] == 6 and (one["overlaps"], two["overlaps"]) == (0, 5)

    def test_prefix_routing_keeps_each_chat_on_its_replica():
        assert any(len(set(w)) > 1 for w in routed["score"]["where"].values())
        assert all(len(set(w)) == 1 for w in routed["prefix"]["where"].values())
        assert routed["prefix"]["hits"] > routed["score"]["hits"]
        assert routed["score"]["where"][1][1] == 0          # the exercise's answer

    def test_the_score_spreads_the_long_requests():
        assert dp_runs["round_robin"]["longs"] == [5, 0]
        assert max(dp_runs["score"]["longs"]) < 5 and sum(dp_runs["score"]["longs"]) == 5

    def test_planner_uses_the_engines_checks():
        assert "error" in plan("SmolLM2-135M", 2, 1, 1)          # 9 heads do not split in 2
        assert "error" in plan("SmolLM2-135M", 1, 31, 1)         # more stages than layers
        assert not plan("Llama-3-70B", 1, 1, 1)["fits"]          # 141 GB on one GPU
        assert plan("Llama-3-70B", 8, 2, 1)["fits"]

    def test_exercise():
        assert check_bytes(exercise_bytes).startswith("Correct")
        assert not check_bytes((7 + 12 + 20) * cfg.hidden_size * 4).startswith("Correct")
        assert not check_bytes(exercise_bytes // 2).startswith("Correct")
        assert exercise_bytes == (7 + 12 + 20 + 3 * 2) * cfg.hidden_size * 4

    # The simulated sections: counts only (bytes, blocks, requests), none of which moves with
    # the profile's assumed efficiencies; their seconds are shown, not asserted.
    def test_simulated_layouts_finish_every_request():
        for runs, workload in ((big_runs, big_workload), (layout_runs, layout_workload)):
            for res in runs.values():
                assert len(res.ttft) == len(workload) and np.isfinite(res.ttft).all()
                assert res.num_output_tokens == sum(r.params.max_tokens for r in workload)

    def test_one_hidden_state_a_token_crosses_the_simulated_stages():
        # No preemption: each GPU's pool holds ~800k tokens, 128 sequences at most 640k.
        assert big_runs["TP8 x PP2"].num_preemptions == 0
        assert pp_sim_tokens == big_tokens_expected
        assert pp_sim_sent == pp_sim_tokens * big_hidden_bytes
        assert link_truth["TP8 x PP2"] == link_bytes(64, 64)["TP8 x PP2"] == 64 * big_hidden_bytes

    def test_tp16_sends_hundreds_of_times_the_bytes_across_the_node_link():
        assert link_truth["TP16"] == link_bytes(64, 64)["TP16"]  # the cost model's count agrees
        assert link_truth["TP16"] > 400 * link_truth["TP8 x PP2"]

    def test_tp16_keeps_each_kv_head_twice():
        kv = {k: p["stages"][0]["kv_per_token"] for k, p in big_plans.items()}
        assert kv["TP16"] == 2 * kv["TP8 x PP2"]
        assert big_runs["TP8 x PP2"].num_kv_blocks > 1.9 * big_runs["TP16"].num_kv_blocks

    def test_replicas_split_the_requests_and_the_memory():
        tp8, dp4 = engines["TP8"]["engine-0"], engines["DP4 x TP2"].values()
        assert tp8["requests"] == 300 == sum(e["requests"] for e in dp4)
        assert len(dp4) == 4 and min(e["requests"] for e in dp4) > 0.15 * 300
        assert len({e["kv_blocks"] for e in dp4}) == 1
        assert sum(e["kv_blocks"] for e in dp4) < tp8["kv_blocks"]      # four weight copies
        assert gpu_all_reduce_bytes["TP8"] > 2 * gpu_all_reduce_bytes["DP4 x TP2"]

    def test_exercise_node_link():
        pp, tp = link_truth["TP8 x PP2"], link_truth["TP16"]
        assert check_link_bytes(pp, tp).startswith("Correct")
        assert not check_link_bytes(pp, 2 * 126 * 64 * big_hidden_bytes).startswith("Correct")
        assert not check_link_bytes(2 * pp, tp).startswith("Correct")
        assert not check_link_bytes(pp, tp // 2).startswith("Correct")
        without_logits = 253 * 2 * 15 * 64 * big_hidden_bytes // 16       # all-reduces alone
        assert "all-gather" in check_link_bytes(pp, without_logits)
    return


@app.cell
def _(SLO_32B, big_runs, bubble_runs, dp_runs, engines, exercise_bytes, layout_runs,
      link_truth, np, pp_bytes, pp_tokens, pp_tokens_computed, reference,
      tp_all_reduces_per_step, tp_bytes, tp_tokens, tp_tokens_computed):
    findings = {
        "pp_tokens_identical": pp_tokens == reference,
        "tp_tokens_identical": tp_tokens == reference,
        "pp_bytes_per_token": pp_bytes // pp_tokens_computed,
        "tp_bytes_per_token": tp_bytes // tp_tokens_computed,
        "tp_all_reduce_per_step": tp_all_reduces_per_step,
        "overlapping_batches": {k: v["overlaps"] for k, v in bubble_runs.items()},
        "stage_idle_measured": {k: round(v["bubble"], 3) for k, v in bubble_runs.items()},
        "dp_long_requests": {k: v["longs"] for k, v in dp_runs.items()},
        "exercise_bytes": exercise_bytes,
        "sim_405b_node_link_bytes_per_64_seq_decode": link_truth,
        "sim_405b_kv_blocks_per_gpu": {k: r.num_kv_blocks for k, r in big_runs.items()},
        "sim_405b_ttft_p50_s": {k: round(float(np.median(r.ttft)), 2)
                                for k, r in big_runs.items()},
        "sim_32b_requests_per_engine": {k: [e["requests"] for e in v.values()]
                                        for k, v in engines.items()},
        "sim_32b_within_slo": {k: round(r.goodput(SLO_32B), 2) for k, r in layout_runs.items()},
    }
    print("findings:", findings)
    return


if __name__ == "__main__":
    app.run()
