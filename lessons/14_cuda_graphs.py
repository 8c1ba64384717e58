import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell
def _():
    import minivllm.platforms  # noqa: F401  first: without CUDA, Triton's interpreter on

    import time

    import marimo as mo
    import matplotlib.pyplot as plt
    import torch

    from minivllm import LLM, SamplingParams
    from minivllm.benchmarks.compile import decode_step_seconds, profile_decode_step
    from minivllm.benchmarks.host import decode_steps, summarize
    from minivllm.worker.compilation import capture_sizes
    from torch._dynamo.utils import counters as dynamo_counters
    return (LLM, SamplingParams, capture_sizes, decode_step_seconds, decode_steps,
            dynamo_counters, mo, plt, profile_decode_step, summarize, time, torch)


@app.cell
def _(mo):
    mo.md(r"""
    # 14 · The host's share of a step: torch.compile, CUDA graphs, async scheduling

    After this lesson you can say where a decode step's time goes besides arithmetic: the
    hundreds of small operations a forward pass issues one by one, each with its fixed cost
    of being asked for (Python, the dispatcher, on a GPU a kernel launch), and why that
    cost dominates at small batch; then the engine's own work around the forward
    (scheduling, building inputs, sampling, applying tokens). You will count those
    operations in a real decode step, measure what share of the step they leave to Python on
    this device, compile the parts around attention with `torch.compile`, see how CUDA graphs
    (record once, replay every step) pad a batch to a captured size, and time each phase of
    a step with and without V1's async scheduling.

    Lesson 13 made a decode step read fewer bytes; but at batch 1 a step's time is not only
    bytes and arithmetic. It also pays for every operation the forward pass issues, one at a
    time.
    """)
    return


@app.cell
def _(LLM, mo, torch):
    BATCHES = [1, 4, 16]
    llm = LLM(max_model_len=128, max_num_seqs=max(BATCHES), num_kv_blocks=4 * max(BATCHES))
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    mo.md(f"**running on:** {device} · **model:** SmolLM2-135M-Instruct "
          f"({str(llm.engine.dtype).removeprefix('torch.')}, {torch.get_num_threads()} torch "
          f"thread(s))  \n`{llm.engine!r}`")
    return BATCHES, device, llm


@app.cell
def _(mo):
    mo.md(r"""
    ## The problem, measured: a step is many small asks

    One decode step of SmolLM2 runs 30 layers, each a dozen or so operations (norms, four
    projections, rotary, the attention's gather and softmax, the MLP's three matmuls and
    its SiLU, residual adds). Below, one decode step at each batch size runs under torch's
    profiler, through the engine's public API: how many torch operations the whole step
    issued (the forward pass, and the engine's input tensors and sampling around it), and
    how much of the step they spent computing inside themselves. The rest of the step is Python:
    the model's forward code, the engine around it, the dispatcher in front of every op.
    """)
    return


@app.cell
def _(BATCHES, decode_step_seconds, llm, profile_decode_step):
    def profiled(batch, steps=3):
        """One batch size: the median decode step, and one decode step under the profiler:
        its top-level torch ops, their own time, and the rest of the step (Python)."""
        _wall = decode_step_seconds(llm, batch, steps=steps)
        _p = profile_decode_step(llm, batch)
        # The share outside the ops comes from the profiled step itself (the profiler adds a
        # little to every op, so its step is slower than the plain median beside it).
        return {"step_ms": 1e3 * _wall, "ops": _p["ops"], "op_ms": 1e3 * _p["op_s"],
                "profiled_ms": 1e3 * _p["profiled_wall_s"],
                "python_ms": max(0.0, 1e3 * (_p["profiled_wall_s"] - _p["op_s"]))}

    breakdown = {}
    for _b in BATCHES:
        print(f"eager decode step, batch {_b}: timing and profiling ...", flush=True)
        breakdown[_b] = profiled(_b)
    ops_per_step = {_b: _r["ops"] for _b, _r in breakdown.items()}
    print(breakdown)
    return breakdown, ops_per_step, profiled


@app.cell
def _(BATCHES, breakdown, mo, plt):
    _fig, _ax = plt.subplots(figsize=(6.5, 3.2))
    _x = range(len(BATCHES))
    _op = [breakdown[_b]["op_ms"] for _b in BATCHES]
    _py = [breakdown[_b]["python_ms"] for _b in BATCHES]
    _ax.bar(_x, _op, label="inside the ops (math, memory)")
    _ax.bar(_x, _py, bottom=_op, label="Python + dispatch around them")
    _ax.set_xticks(list(_x), [f"batch {_b}" for _b in BATCHES])
    _ax.set_ylabel("ms, one profiled decode step")
    _ax.legend(fontsize=8)
    _fig.tight_layout()
    _rows = "\n    ".join(f"| {_b} | {_r['ops']} | {_r['step_ms']:.1f} | {_r['op_ms']:.1f} | "
                      f"{100 * _r['python_ms'] / _r['profiled_ms']:.0f}% |"
                      for _b, _r in breakdown.items())
    mo.vstack([_fig, mo.md(f"""
    | batch | ops per step | step ms (median) | inside ops ms (profiled) | Python share |
    |---|---|---|---|---|
    {_rows}

    The number of operations hardly depends on the batch: a batch of 16 issues the ops of a
    batch of 1, each on a bigger tensor. (The small difference, about one op a layer, is the
    CPU's attention path, whose calls vary a little with the batch's shape: it groups decode
    rows by length. A CUDA graph cannot allow even that: on a GPU one paged-attention kernel
    takes every row whatever its length, so every step of a given batch size launches the
    same kernels. Batch 1 on a CPU issues one more op for each fp32 projection and the LM
    head: the engine sends its single row to the matrix multiply as two, because MKL's
    one-column path reads the weights 2.6x slower; see `linear` in models/llama.py.)
    So the fixed cost per op is paid once per
    step whatever the batch, and it is the larger share when the batch is small. On this
    CPU the ops run synchronously, so Python's time adds to theirs. On a GPU the ops are
    kernels launched asynchronously: the GPU idles whenever launching (a few microseconds
    each, from Python) is slower than running, which is exactly the small-batch decode
    step. These are CPU measurements under whatever else this machine is doing.
    """)])
    return


@app.cell
def _(mo):
    mo.md(r"""
    ## Remedy 1, live here: torch.compile around attention

    `LLM(compilation_config=3)` (3 is vLLM's `CompilationMode.VLLM_COMPILE`: vLLM 0.33
    calls the setting `mode`, minivllm keeps its older name, level) hands the model's whole
    forward to TorchDynamo and TorchInductor, with a dynamic token count: the embedding,
    every layer's norms, projections, rotary, residual adds and MLP, and the final norm
    become one graph.
    Attention alone stays outside, as one opaque op, `minivllm::unified_attention`: its batch
    layout is Python that changes every step, so instead of being a graph input (whose ints
    would force a recompile whenever a sequence grows) the step's metadata waits in a
    *forward context* that the op reads, as vLLM's does. Inductor fuses the elementwise
    operations between the matmuls (RMSNorm's square, mean, rsqrt, multiply and cast into
    one loop; SiLU and the multiply by `up` into one; the residual adds and rotary with
    them) and calls the matmuls itself, so no Python runs between ops inside the graph. The
    first steps pay for the compilation: a graph for a single token, and graphs whose token
    count is a symbol for the rest (the exercise below has you count them).
    """)
    return


@app.cell
def _(BATCHES, SamplingParams, dynamo_counters, llm, profiled, time):
    _params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    _prompts = ["The capital of France is", "def fibonacci(n):\n    "]
    eager_tokens = [o.outputs[0].token_ids for o in llm.generate(_prompts, _params,
                                                                  use_tqdm=False)]
    print("torch.compile: compiling the forward around attention (Inductor builds C++: "
          "30-50 s on a 2-core CPU, about 2 min on a first run, from a cold cache) ...",
          flush=True)
    dynamo_counters.clear()               # torch's own tally of the graphs Dynamo builds
    _t0 = time.perf_counter()
    llm.reconfigure(compilation_config=3)
    with llm.engine.trace() as _compiled_steps:
        compiled_tokens = [o.outputs[0].token_ids for o in llm.generate(_prompts, _params,
                                                                         use_tqdm=False)]
        compile_s = time.perf_counter() - _t0
        compiled = {}
        for _b in BATCHES:
            print(f"compiled decode step, batch {_b}: timing and profiling ...", flush=True)
            compiled[_b] = profiled(_b)
    # Counted by torch, not by this page: the graphs Dynamo compiled for every step above,
    # and the token counts those steps had (each a different input shape).
    graphs_compiled = int(dynamo_counters["stats"]["unique_graphs"])
    token_counts_seen = sorted({_s.num_batched_tokens for _s in _compiled_steps})
    llm.reconfigure(compilation_config=0)
    same_tokens = compiled_tokens == eager_tokens
    compiled_ops = {_b: _r["ops"] for _b, _r in compiled.items()}
    # How many graphs that took is the exercise's answer below: not printed before it.
    print(f"compiled steps of {len(token_counts_seen)} different token counts: "
          f"{token_counts_seen}")
    return (compile_s, compiled, compiled_ops, graphs_compiled, same_tokens,
            token_counts_seen)


@app.cell
def _(breakdown, compile_s, compiled, llm, mo, same_tokens):
    _layers = llm.engine.model_config.hf_config.num_hidden_layers
    _rows = "\n    ".join(
        f"| {_b} | {breakdown[_b]['ops']} | {_c['ops']} | "
        f"{(breakdown[_b]['ops'] - _c['ops']) / _layers:.0f} | "
        f"{100 * breakdown[_b]['python_ms'] / breakdown[_b]['profiled_ms']:.0f}% | "
        f"{100 * _c['python_ms'] / _c['profiled_ms']:.0f}% | "
        f"{breakdown[_b]['step_ms']:.1f} | {_c['step_ms']:.1f} |" for _b, _c in compiled.items())
    mo.md(f"""
    Compiling took **{compile_s:.0f} s** (Inductor writes and builds C++ on a CPU, Triton on a
    GPU). Greedy tokens: **{'identical' if same_tokens else 'DIFFERENT'}**.

    | batch | ops eager | ops compiled | ops saved per layer | Python share eager | Python share compiled | eager ms/step | compiled ms/step |
    |---|---|---|---|---|---|---|---|
    {_rows}

    The op count is the measurement that holds on any machine. What a compiled step still
    asks for is the matmuls the graph calls, attention's own ops inside its opaque op, and
    the engine's few ops around the forward; the elementwise work between the matmuls became
    fused loops, which are not ops at all. The count is the same at every batch size above
    1 (a symbolic token count; torch compiles batch 1 apart). What that saves in
    time depends on how much of the step those ops and the Python between them were: the
    most at batch 1, and in the quantized formats, whose matmuls read the fewest bytes
    (`minivllm bench cpu --compile` measures every format; docs/benchmarks.md has the
    numbers). Compiling costs tens of seconds at start-up, which is why compilation is off
    by default here. (Timings from a shared machine: they move by tens of percent between
    runs.)
    """)
    return


@app.cell
def _(mo):
    mo.md(r"""
    ## Remedy 2, GPU only: CUDA graphs

    A CUDA graph records every kernel a piece of code launches, with its arguments and
    buffer addresses, and replays the whole sequence with a single launch. minivllm
    captures the whole decode forward as one *full* graph per **batch-size bucket** (powers
    of two below `max_num_seqs`, then `max_num_seqs` itself) when the KV pool is built; a
    decode step copies its token ids, positions, slot mapping and block tables into the
    static buffers the graph reads, pads the batch up to its bucket (padded rows write their
    K/V to slot -1, which the kernel skips), and replays. Everything must keep its address
    and shape, so the paged decode kernel runs with a fixed partition count and a scratch
    buffer allocated once. Prefill and mixed steps run eagerly; `enforce_eager=True` turns
    graphs off.

    **That is vLLM V0's scheme, not V1's.** V0 captured full graphs of decode batches only
    and ran every other step eagerly, as minivllm does. V1 chooses with
    `CompilationConfig.cudagraph_mode` (`vllm/config/compilation.py`):

    - `PIECEWISE`: the compiled graph is split at each attention op (the `splitting_ops`),
      and the pieces between them are captured. Attention runs eagerly between two
      replays, so prefill and mixed batches, whose attention layout changes every step,
      still replay everything else.
    - `FULL_DECODE_ONLY`: minivllm's and V0's scheme.
    - `FULL_AND_PIECEWISE`, V1's default: a full graph for a pure decode batch, piecewise
      graphs for every other batch.

    The buckets differ too. V1 captures sizes 1, 2, 4, then every multiple of 8 up to 256,
    then every 16th up to `max_cudagraph_capture_size` (by default min(2 x `max_num_seqs`,
    512)); V0's list was 1, 2, 4 and multiples of 8 up to 256. Steps of 8 pad a batch by at
    most 7 rows; minivllm's powers of two can pad it by nearly half, in exchange for
    a handful of graphs that capture in seconds. The slider below shows both.

    **Measured on a GPU** (one NVIDIA H200, Qwen3-0.6B's shapes with random bf16 weights,
    median decode step; `bash scripts/gpu_check.sh graphs`, docs/benchmarks.md, not this
    page's run): eager 27 to 38 ms at every batch from 1 to 64, launch-bound; CUDA graphs
    4.4 to 5.3 ms (6x; capturing took 0.5 s); graphs + compile 2.2 to 3.0 ms (12x at batch 8;
    compiling took 85 s). What can be computed here is the padding each batch pays:
    """)
    return


@app.cell
def _(BATCHES, llm, mo):
    batch_pick = mo.ui.slider(1, llm.engine.vllm_config.scheduler_config.max_num_seqs, value=BATCHES[1],
                              label="decode batch size", show_value=True)
    mo.md(f"""
    ### Try it: slide the batch

    Each position runs one decode step of that many sequences on the engine, eager and
    compiled, under the profiler (a few seconds on a CPU). Watch the op counts stay put
    while the batch grows, the Python share fall, and the padding a CUDA graph would add.

    {batch_pick}
    """)
    return (batch_pick,)


@app.cell
def _(batch_pick, breakdown, capture_sizes, compiled, llm, mo, plt, profiled,
      v1_capture_sizes):
    _n = batch_pick.value
    if _n in breakdown:
        _eager, _comp = breakdown[_n], compiled[_n]
    else:
        print(f"decode step of {_n}: profiling eager, then compiled (a few seconds) ...",
              flush=True)
        _eager = profiled(_n, steps=2)
        llm.reconfigure(compilation_config=3)
        _comp = profiled(_n, steps=2)
        llm.reconfigure(compilation_config=0)
    _sizes = capture_sizes(llm.engine.vllm_config.scheduler_config.max_num_seqs)
    _bucket = next(s for s in _sizes if s >= _n)
    _v1 = v1_capture_sizes(llm.engine.vllm_config.scheduler_config.max_num_seqs)
    _v1_bucket = next(s for s in _v1 if s >= _n)
    _fig, _ax = plt.subplots(figsize=(5.5, 2.6))
    for _i, (_name, _r) in enumerate((("eager", _eager), ("compiled", _comp))):
        _ax.bar(_i, _r["op_ms"], color="tab:blue", label="inside the ops" if not _i else None)
        _ax.bar(_i, _r["python_ms"], bottom=_r["op_ms"], color="tab:orange",
                label="Python + dispatch" if not _i else None)
        _ax.text(_i, _r["profiled_ms"], f"{_r['ops']} ops", ha="center", va="bottom",
                 fontsize=8)
    _ax.set_xticks([0, 1], ["eager", "compiled"])
    _ax.set_ylabel(f"ms, one decode step of {_n}")
    _ax.legend(fontsize=7)
    _fig.tight_layout()
    _share = lambda r: 100 * r["python_ms"] / r["profiled_ms"]  # noqa: E731
    mo.vstack([_fig, mo.callout(mo.md(
        f"Batch **{_n}**: eager **{_eager['ops']}** ops, Python {_share(_eager):.0f}% of the "
        f"step; compiled **{_comp['ops']}** ops, Python {_share(_comp):.0f}%. On a GPU with "
        f"graphs captured for {_sizes}, this batch replays the {_bucket} graph: "
        f"{_bucket - _n} padded row(s), {100 * (_bucket - _n) / _bucket:.0f}% of the step's "
        f"rows computed for nothing. vLLM V1's default sizes for this `max_num_seqs` "
        f"({_v1}) would replay the {_v1_bucket} graph: {_v1_bucket - _n} padded row(s)."),
        kind="warn" if _bucket - _n > _n / 2 else "success")])
    return


@app.function
def v1_capture_sizes(max_num_seqs: int) -> list[int]:
    """vLLM V1's default CUDA-graph sizes, as vllm/config/compilation.py documents them
    (not minivllm's: for the comparison on this page)."""
    largest = min(2 * max_num_seqs, 512)                 # max_cudagraph_capture_size
    sizes = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, largest + 1, 16))
    return [n for n in sizes if n <= largest]


@app.cell
def _(mo):
    mo.md(r"""
    ## Remedy 3: the engine's own work, and async scheduling

    Graphs and compilation make the forward cheaper to ask for. A step is more than its
    forward: the scheduler decides who runs (`schedule`), the runner flattens that into
    input tensors (`prepare`), the sampler draws the tokens (`sample`) and the scheduler
    applies them, checks stops and frees blocks (`update`); then the front end detokenizes.
    On the first GPU run of this course (an H200, Qwen3-0.6B's shapes, docs/benchmarks.md)
    a graph-replayed decode step took 4.4 ms and the batch-1 inter-token latency was 26.4 ms:
    about 20 ms a token on the host, with the GPU idle. Every `StepRecord` of
    `engine.trace()` now has each phase's seconds (`phases`, from
    `minivllm/worker/phase_timer.py`; on CUDA the forward's lap waits for the device).

    **vLLM V0's answer, multi-step scheduling** (`--num-scheduler-steps n`): schedule and
    prepare once, then run n forward passes back to back, feeding each step's tokens to the
    next on the GPU. The price: stops are checked only every n steps (a request that ends
    mid-window computes the rest of the window for nothing), and no new request joins for
    n steps. **V1's answer, async scheduling** (`LLM(async_scheduling=True)`,
    `--async-scheduling`, `minivllm/core/async_scheduler.py`): the core schedules step N + 1
    while step N runs; a request decoding in step N is scheduled again before its token is
    back, as a *placeholder* that the worker fills from its own sample. The price: one step
    per request computed after its stop, and nothing else: stops are seen a step late, new
    requests join at once.

    Below, the same decode at batch 1 and 4, synchronous and async, on this device.
    """)
    return


@app.cell
def _(SamplingParams, decode_steps, llm, summarize):
    HOST_BATCHES, HOST_TOKENS = [1, 4], 12
    host_rows = {}
    for _mode in ("sync", "async"):
        llm.reconfigure(compilation_config=0, async_scheduling=_mode == "async")
        for _b in HOST_BATCHES:
            print(f"{_mode} scheduling, batch {_b}: {HOST_TOKENS} tokens each ...", flush=True)
            _trace, _tokens = decode_steps(llm, _b, HOST_TOKENS)
            host_rows[(_mode, _b)] = {
                **summarize(_trace, _b), "tokens": _tokens,
                "computed": sum(r.num_tokens for _s in _trace for r in _s.scheduled)}
    llm.reconfigure(async_scheduling=False)
    # Four answers that stop at EOS, for V0's multi-step below: how long each ran.
    _chats = [[{"role": "user", "content": _q}] for _q in
              ("Say hello.", "Name a color.", "What is 2 + 2?", "Name a fruit.")]
    stop_lengths = [len(_o.outputs[0].token_ids) for _o in llm.chat(
        _chats, SamplingParams(temperature=0, max_tokens=64), use_tqdm=False)]
    async_same = all(host_rows[("async", _b)]["tokens"] == host_rows[("sync", _b)]["tokens"]
                     for _b in HOST_BATCHES)
    # Tokens computed that nobody reads: the async run's computed tokens beyond the sync run's.
    dropped = {_b: host_rows[("async", _b)]["computed"] - host_rows[("sync", _b)]["computed"]
               for _b in HOST_BATCHES}
    print({k: {n: round(v, 2) for n, v in r.items() if n != "tokens"}
           for k, r in host_rows.items()})
    return HOST_BATCHES, HOST_TOKENS, async_same, dropped, host_rows, stop_lengths


@app.cell
def _(HOST_BATCHES, async_same, device, host_rows, mo, plt, stop_lengths):
    _fig, _ax = plt.subplots(figsize=(6.5, 3.0))
    _keys = [(_m, _b) for _b in HOST_BATCHES for _m in ("sync", "async")]
    _fwd = [host_rows[_k]["forward"] for _k in _keys]
    _host = [host_rows[_k]["host"] for _k in _keys]
    _ax.bar(range(len(_keys)), _fwd, label="forward (until the device is done)")
    _ax.bar(range(len(_keys)), _host, bottom=_fwd, label="host: the rest of the ITL")
    _ax.set_xticks(range(len(_keys)), [f"{_m}\nbatch {_b}" for _m, _b in _keys])
    _ax.set_ylabel("ms per decode step (median)")
    _ax.legend(fontsize=8)
    _fig.tight_layout()
    _rows = "\n    ".join(
        f"| {_b} | {_m} | {_r['itl']:.1f} | {_r['forward']:.1f} | {_r['host']:.2f} | "
        f"{_r['schedule']:.2f} | {_r['prepare']:.2f} | {_r['sample']:.2f} | "
        f"{_r['update']:.2f} |" for (_m, _b), _r in host_rows.items())
    _multi = {_n: sum(-(_l - 1) % _n for _l in stop_lengths) for _n in (2, 4, 8)}
    _where = ("is kernels queued on the GPU: while they run, the host schedules the next "
              "step, so under async scheduling its phases hide behind the device"
              if device != "CPU" else
              "runs on the same cores as the host's work: under async scheduling it runs on "
              "a thread of its own while the core schedules the next step, and the two "
              "compete for the cores. The host's share of a step is small here, so there is "
              "little to hide, and the contention can cost more than it saves "
              "(docs/benchmarks.md measures both ways)")
    mo.vstack([_fig, mo.md(f"""
    | batch | scheduling | ITL ms | forward | host | schedule | prepare | sample | update |
    |---|---|---|---|---|---|---|---|---|
    {_rows}

    Tokens **{'identical' if async_same else 'DIFFERENT'}** between the two modes. On
    {device} the forward {_where}. What async scheduling saves is the host's time per step,
    so it matters where that time is a large share: a GPU step of a few milliseconds,
    graph-replayed.

    **V0's multi-step, counted.** Four chat answers stopped at EOS after
    {", ".join(map(str, stop_lengths))} tokens. Their first token comes from the prefill
    step; under multi-step the rest come in windows of n decode steps, and a stop is seen
    only when its window ends: {_multi[2]}, {_multi[4]} and {_multi[8]} tokens computed past
    the stops for n = 2, 4 and 8 (and a request arriving mid-window waits up to n - 1 steps
    to start). Async scheduling computes one per request past its stop, {len(stop_lengths)}
    here, and admits new requests every step.
    """)])
    return


@app.cell
def _(HOST_BATCHES, HOST_TOKENS, mo):
    mo.md(f"""
    ### Predict: how many tokens does async scheduling compute for nothing?

    The async run at batch {HOST_BATCHES[-1]} had {HOST_BATCHES[-1]} requests, each asked
    for exactly {HOST_TOKENS} tokens (EOS ignored). Counted over the whole run, how many
    more tokens did the async engine compute than the synchronous one? The engine's traces
    decide.
    """)
    dropped_guess = mo.ui.text(value="", label="tokens computed for nothing")
    dropped_guess
    return (dropped_guess,)


@app.cell
def _(HOST_BATCHES, dropped):
    def check_dropped(text, truth=dropped[HOST_BATCHES[-1]], batch=HOST_BATCHES[-1]):
        """The learner's count against the two traces'."""
        try:
            guess = int(text)
        except ValueError:
            return "Enter a whole number, e.g. 3."
        if guess == truth:
            return (f"Correct: {truth}. Each request's last step was followed by one the core "
                    "had already scheduled for it, a placeholder for a token it did not need: "
                    "computed, then dropped when the stop was seen.")
        if guess == 0:
            return (f"It computed {truth} more: the step after each request's last was "
                    "scheduled before its stop was known.")
        return (f"It computed {truth} more, not {guess}: one placeholder step for each of the "
                f"{batch} requests after its last token.")
    return (check_dropped,)


@app.cell
def _(check_dropped, dropped, dropped_guess, HOST_BATCHES, mo):
    _headless = mo.app_meta().mode == "script" or "headless" in mo.cli_args()
    _answer = dropped_guess.value or (str(dropped[HOST_BATCHES[-1]]) if _headless else "")
    _msg = check_dropped(_answer)
    print(f"exercise: answered {_answer!r} - {_msg}")
    mo.callout(mo.md(_msg), kind="success" if _msg.startswith("Correct") else "neutral")
    return


@app.cell
def _(mo, token_counts_seen):
    mo.md(f"""
    ## Exercise: how many graphs did torch.compile build?

    The compiled engine above ran steps of **{len(token_counts_seen)}** different token
    counts ({", ".join(map(str, token_counts_seen))}): the two prompts' prefill and
    decodes, then the prefills and decode steps of batches 1, 4 and 16. A graph Dynamo
    compiles holds only for inputs that pass its guards (checks on shapes, dtypes and the
    Python values it read); `dynamic=True` makes the token count a symbol instead of a
    constant. How many graphs did Dynamo compile for all those steps? Enter a number; torch's
    own counter (`torch._dynamo.utils.counters`), kept while the engine ran, decides.
    """)
    graphs_guess = mo.ui.text(value="", label="graphs compiled")
    graphs_guess
    return (graphs_guess,)


@app.cell
def _(graphs_compiled, token_counts_seen):
    def check_graphs(text, truth=graphs_compiled, shapes=len(token_counts_seen)):
        """The learner's count against the one Dynamo kept while the engine ran."""
        try:
            guess = int(text)
        except ValueError:
            return "Enter a whole number, e.g. 5."
        if guess == truth:
            return (f"Correct: Dynamo compiled {truth} graph(s) for {shapes} token counts. A "
                    "symbolic token count lets a graph serve many sizes, except a count of 1, "
                    "which Dynamo always specializes: batch-1 decode has a graph of its own.")
        if guess == shapes:
            return (f"That is one graph per token count; Dynamo compiled {truth}. With "
                    "dynamic=True the count is a symbol, so one graph serves many sizes.")
        if guess == 1 and truth > 1:
            return (f"Dynamo compiled {truth}: a single token is a special size (0 and 1 are "
                    "always specialized), so batch-1 decode gets a graph of its own.")
        return (f"Dynamo compiled {truth} graph(s), not {guess}: a single token is a size of "
                "its own, and the other token counts share graphs with a symbolic count.")
    return (check_graphs,)


@app.cell
def _(check_graphs, graphs_compiled, graphs_guess, mo):
    # The headless run answers with the count itself, so its page shows the checker's verdict.
    _headless = mo.app_meta().mode == "script" or "headless" in mo.cli_args()
    _answer = graphs_guess.value or (str(graphs_compiled) if _headless else "")
    _msg = check_graphs(_answer)
    print(f"exercise: answered {_answer!r} - {_msg}")
    mo.callout(mo.md(_msg), kind="success" if _msg.startswith("Correct") else "neutral")
    return


@app.cell
def _(BATCHES, HOST_BATCHES, async_same, check_dropped, check_graphs, compiled_ops, dropped,
      graphs_compiled, llm, ops_per_step, same_tokens, token_counts_seen):
    def test_op_count_hardly_depends_on_batch():
        counts = sorted(ops_per_step[_b] for _b in BATCHES if _b > 1)   # > 10 ops per layer,
        assert counts[0] > 30 * 10 and counts[-1] <= 1.05 * counts[0]   # the same at each batch
        # batch 1: at most one more op per projection and the head (one row sent as two)
        assert ops_per_step[1] <= counts[0] + 7 * 30 + 1

    def test_compiled_tokens_identical():
        assert same_tokens

    def test_compile_fuses_ops_at_every_batch():
        # Counted by the profiler: the fused elementwise ops save at least 10 ops per layer,
        # and a symbolic token count serves every batch size above 1 alike.
        _layers = llm.engine.model_config.hf_config.num_hidden_layers
        for _b in BATCHES:
            assert compiled_ops[_b] <= ops_per_step[_b] - 10 * _layers
        assert len({compiled_ops[_b] for _b in BATCHES if _b > 1}) == 1

    def test_dynamic_shapes_keep_the_graph_count_small():
        # Counted by Dynamo: at least one graph (the forward was compiled), and fewer than
        # the token counts the steps had (a graph per shape would mean no dynamic shapes).
        assert len(token_counts_seen) >= 6
        assert 1 <= graphs_compiled < len(token_counts_seen)

    def test_exercise_checker():
        # The headless run answers with Dynamo's own count; the checker takes it, and
        # refuses one more, one less, and a graph per shape.
        assert check_graphs(str(graphs_compiled)).startswith("Correct")
        assert not check_graphs(str(graphs_compiled + 1)).startswith("Correct")
        assert not check_graphs(str(graphs_compiled - 1)).startswith("Correct")
        assert "per token count" in check_graphs(str(len(token_counts_seen)))
        assert "whole number" in check_graphs("seven")

    def test_async_scheduling_same_tokens_one_dropped_step_each():
        # Counted by the engine: the same tokens, and exactly one placeholder step computed
        # after each request's last token (the batch's size in tokens).
        assert async_same
        assert dropped == {_b: _b for _b in HOST_BATCHES}
        assert check_dropped(str(dropped[HOST_BATCHES[-1]])).startswith("Correct")
        assert not check_dropped("0").startswith("Correct")
    return


@app.cell
def _(BATCHES, async_same, breakdown, compile_s, compiled, compiled_ops, dropped,
      graphs_compiled, host_rows, mo, ops_per_step, same_tokens, stop_lengths,
      token_counts_seen):
    findings = {
        "ops_per_decode_step": ops_per_step[BATCHES[0]],
        "ops_per_decode_step_compiled": compiled_ops[BATCHES[0]],
        "python_share_batch_1": round(breakdown[BATCHES[0]]["python_ms"]
                                      / breakdown[BATCHES[0]]["profiled_ms"], 3),
        "python_share_batch_max": round(breakdown[BATCHES[-1]]["python_ms"]
                                        / breakdown[BATCHES[-1]]["profiled_ms"], 3),
        "eager_ms": {str(b): round(breakdown[b]["step_ms"], 1) for b in BATCHES},
        "compiled_ms": {str(b): round(r["step_ms"], 1) for b, r in compiled.items()},
        "compile_s": round(compile_s, 1),
        "compiled_tokens_identical": same_tokens,
        "dynamo_graphs_compiled": graphs_compiled,
        "token_counts_compiled_for": len(token_counts_seen),
        "gpu_graph_numbers": "none recorded yet",
        "async_tokens_identical": async_same,
        "async_tokens_dropped": {str(b): n for b, n in dropped.items()},
        "eos_stop_lengths": stop_lengths,
        "itl_ms": {f"{m} {b}": round(r["itl"], 2) for (m, b), r in host_rows.items()},
        "host_ms": {f"{m} {b}": round(r["host"], 2) for (m, b), r in host_rows.items()},
    }
    print("findings:", findings)
    mo.md(f"""
    ## What we found

    * A decode step of SmolLM2 issues **{ops_per_step[BATCHES[0]]}** operations at batch 1
      and about as many at every batch size; at batch {BATCHES[0]} the time outside them was
      **{100 * findings['python_share_batch_1']:.0f}%** of the step here, at batch
      {BATCHES[-1]} **{100 * findings['python_share_batch_max']:.0f}%**.
    * `torch.compile` of the forward around attention cut the ops of a step from
      **{ops_per_step[BATCHES[0]]}** to **{compiled_ops[BATCHES[0]]}** (counted by the
      profiler, the same at every batch size above 1), kept the tokens
      **{'identical' if same_tokens else 'different'}**, and changed the step time by the
      ratios above, for **{compile_s:.0f} s** of compiling at start-up: off by default here.
      Dynamo compiled **{graphs_compiled}** graph(s) for steps of {len(token_counts_seen)}
      different token counts (torch's own counter).
    * CUDA graphs need a GPU: on the one H200 run so far (docs/benchmarks.md, not this page)
      they took a decode step from 27-38 ms eager to 4.4-5.3 ms.
      minivllm's are full graphs of decode steps only, V0's scheme; V1 defaults to full
      graphs for decode and piecewise graphs for everything else.

    * Async scheduling kept the tokens **{'identical' if async_same else 'different'}** and
      computed **{dropped[max(dropped)]}** token(s) for nothing at batch {max(dropped)} (one
      placeholder step per request after its last token); the batch-1 ITL went from
      **{host_rows[("sync", 1)]["itl"]:.1f}** ms to **{host_rows[("async", 1)]["itl"]:.1f}**
      ms here, of which the host's share (outside the forward) was
      **{host_rows[("sync", 1)]["host"]:.2f}** and **{host_rows[("async", 1)]["host"]:.2f}**
      ms.

    All of this makes one device's step cheaper; none of it fits a model larger than one
    device. Next, lesson 15: how is each layer cut across N GPUs, and what do its two
    all-reduces per layer cost every step?

    ## Where the code lives

    * `minivllm/worker/compilation.py`: `set_compilation` (what is compiled), `capture_sizes` (the
      buckets), `CUDAGraphRunner` (static buffers, capture, `run`: copy, pad, replay).
    * `minivllm/attention/layer.py`: `unified_attention`, the op a compiled graph calls for
      attention, and `minivllm/forward_context.py`, where it finds the step's metadata.
    * `minivllm/worker/model_runner.py`: `compile_or_warm_up_model` compiles and captures over
      the new pool (the `Worker` calls it after `initialize_cache`, at start and on
      `reconfigure`); `forward` replays a graph for a pure decode step.
    * `kernels/paged_attention.py`: `DecodeScratch`, the fixed partials that make the decode
      kernel's grid the same every step; `kernels/write_kv.py` skips slot -1.
    * `minivllm/benchmarks/compile.py` (`minivllm bench compile`) and `minivllm/benchmarks/gpu.py
      --decode-modes` (the GPU measurement).
    * `minivllm/core/async_scheduler.py` (`AsyncScheduler`: the computed count advanced at
      schedule, `num_output_placeholders`), `EngineCore.step_with_batch_queue` in
      `minivllm/engine/core.py` (two batches in flight), `UniProcExecutor.execute_model` (the
      step's thread), `minivllm/worker/phase_timer.py` and `minivllm/benchmarks/host.py`
      (`minivllm bench host`).
    """)
    return (findings,)


@app.cell
def _(mo):
    mo.callout(mo.md(r"""
    **In vLLM V1** (as of vLLM 0.33). Start at `vllm/config/compilation.py`: `CUDAGraphMode` (`NONE`,
    `PIECEWISE`, `FULL`, `FULL_DECODE_ONLY`, `FULL_AND_PIECEWISE`), and in
    `CompilationConfig` the fields `cudagraph_mode`, `cudagraph_capture_sizes`,
    `max_cudagraph_capture_size` and `splitting_ops`. Then `vllm/compilation/backends.py`
    (`VllmBackend`, which splits the Dynamo graph at the attention ops),
    `vllm/compilation/cuda_graph.py` (`CUDAGraphWrapper`, capture and replay),
    `vllm/v1/cudagraph_dispatcher.py` (`CudagraphDispatcher`, which picks full, piecewise
    or none for each batch), and `capture_model` in `vllm/v1/worker/gpu_model_runner.py`.
    minivllm keeps V0's decode-only full graphs and power-of-two buckets: one
    `CUDAGraphRunner` of about fifty lines a reader can follow, where piecewise graphs need
    a custom Dynamo backend that splits and wraps the graph. Its `torch.compile` already
    leaves attention opaque (`minivllm::unified_attention`), the same cut V1's piecewise
    graphs make.

    For async scheduling: `vllm/v1/core/sched/async_scheduler.py` (`AsyncScheduler`,
    `_update_after_schedule`, `num_output_placeholders`), `step_with_batch_queue` in
    `vllm/v1/engine/core.py`, and in `gpu_model_runner.py` the sampled ids kept on the GPU
    for the next step's inputs. minivllm's worker brings each sampled id to the host and
    appends it to its own state; on a CPU its step runs on a thread of its own.
    """), kind="info")
    return


if __name__ == "__main__":
    app.run()
