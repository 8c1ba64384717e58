import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell
def _():
    import minivllm  # noqa: F401  first: without CUDA it switches Triton's interpreter on

    import time

    import marimo as mo
    import matplotlib.pyplot as plt
    import torch

    from minivllm import LLM, SamplingParams
    from minivllm.benchmarks.compile import decode_step_seconds, profile_decode_step
    from minivllm.worker.compilation import capture_sizes
    return (LLM, SamplingParams, capture_sizes, decode_step_seconds, mo, plt,
            profile_decode_step, time, torch)


@app.cell
def _(mo):
    mo.md(r"""
    # 14 · CUDA graphs and torch.compile: the cost of asking

    After this lesson you can say where a decode step's time goes besides arithmetic: the
    hundreds of small operations a forward pass issues one by one, each with its fixed cost
    of being asked for (Python, the dispatcher, on a GPU a kernel launch), and why that
    cost dominates at small batch. You will count those operations in a real decode step,
    measure what share of the step they leave to Python on this device, compile the parts
    around attention with `torch.compile` and measure the difference, and see how CUDA
    graphs (record once, replay every step) pad a batch to a captured size.
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
    breakdown = {}
    for _b in BATCHES:
        _wall = decode_step_seconds(llm, _b, steps=3)
        _p = profile_decode_step(llm, _b)
        # The share outside the ops comes from the profiled step itself (the profiler adds a
        # little to every op, so its step is slower than the plain median beside it).
        breakdown[_b] = {"step_ms": 1e3 * _wall, "ops": _p["ops"], "op_ms": 1e3 * _p["op_s"],
                         "profiled_ms": 1e3 * _p["profiled_wall_s"],
                         "python_ms": max(0.0, 1e3 * (_p["profiled_wall_s"] - _p["op_s"]))}
    ops_per_step = {_b: _r["ops"] for _b, _r in breakdown.items()}
    print(breakdown)
    return breakdown, ops_per_step


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
    same kernels.) So the fixed cost per op is paid once per
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

    `LLM(compilation_config=3)` (vLLM's level) compiles every RMSNorm and every MLP with
    TorchInductor, with a dynamic token count so one compiled graph serves every batch and
    every layer. Inductor fuses their elementwise operations (RMSNorm's square, mean,
    rsqrt, multiply and cast into one loop; SiLU and the multiply by `up` into one), so
    the step issues fewer ops and reads each activation fewer times. Attention, rotary and
    the residual adds stay eager. The first step pays for the compilation.
    """)
    return


@app.cell
def _(BATCHES, SamplingParams, decode_step_seconds, llm, time):
    _params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    _prompts = ["The capital of France is", "def fibonacci(n):\n    "]
    eager_tokens = [o.outputs[0].token_ids for o in llm.generate(_prompts, _params,
                                                                  use_tqdm=False)]
    _t0 = time.perf_counter()
    llm.reconfigure(compilation_config=3)
    compiled_tokens = [o.outputs[0].token_ids for o in llm.generate(_prompts, _params,
                                                                     use_tqdm=False)]
    compile_s = time.perf_counter() - _t0
    compiled_ms = {_b: 1e3 * decode_step_seconds(llm, _b, steps=3) for _b in (BATCHES[0],
                                                                             BATCHES[-1])}
    llm.reconfigure(compilation_config=0)
    same_tokens = compiled_tokens == eager_tokens
    return compile_s, compiled_ms, same_tokens


@app.cell
def _(breakdown, compile_s, compiled_ms, mo, same_tokens):
    _rows = "\n    ".join(f"| {_b} | {breakdown[_b]['step_ms']:.1f} | {_ms:.1f} | "
                      f"{breakdown[_b]['step_ms'] / _ms:.2f}x |"
                      for _b, _ms in compiled_ms.items())
    mo.md(f"""
    Compiling took **{compile_s:.0f} s** (Inductor writes and builds C++ on a CPU, Triton on a
    GPU). Greedy tokens: **{'identical' if same_tokens else 'DIFFERENT'}**.

    | batch | eager ms/step | compiled ms/step | eager / compiled |
    |---|---|---|---|
    {_rows}

    On this CPU the gain is small or negative: the fused norms and SiLU were a small part of
    the step, and the matmuls, which dominate, are the same calls either way. That is why
    compilation is off by default here. (Timings from a shared machine: they move by tens of
    percent between runs.)
    """)
    return


@app.cell
def _(mo):
    mo.md(r"""
    ## Remedy 2, GPU only: CUDA graphs

    A CUDA graph records every kernel a piece of code launches, with its arguments and
    buffer addresses, and replays the whole sequence with a single launch. minivllm
    captures the decode forward once per **batch-size bucket** (1, 2, 4, 8, ... up to
    `max_num_seqs`) when the KV pool is built; a decode step copies its token ids,
    positions, slot mapping and block tables into the static buffers the graph reads, pads
    the batch up to its bucket (padded rows write their K/V to slot -1, which the kernel
    skips), and replays. Everything must keep its address and shape, so the paged decode
    kernel runs with a fixed partition count and a scratch buffer allocated once. Prefill
    and mixed steps run eagerly; `enforce_eager=True` turns graphs off.

    **GPU measurements: none recorded yet.** docs/benchmarks.md has no graph timing, and this
    page will not invent one; `bash scripts/gpu_check.sh graphs` measures eager against
    graphs against graphs + compile at batch 1 to 64 on the next GPU. What can be computed
    here is the padding each batch pays:
    """)
    return


@app.cell
def _(capture_sizes, llm, mo):
    batch_pick = mo.ui.slider(1, 2 * llm.engine.config.max_num_seqs, value=5,
                              label="decode batch size", show_value=True)
    batch_pick
    return (batch_pick,)


@app.cell
def _(batch_pick, capture_sizes, decode_step_seconds, llm, mo):
    _sizes = capture_sizes(llm.engine.config.max_num_seqs)
    _n = batch_pick.value
    _bucket = next((s for s in _sizes if s >= _n), None)
    if _n > llm.engine.config.max_num_seqs:
        _msg = (f"A batch of {_n} is more than max_num_seqs ({_sizes[-1]}): the scheduler never "
                f"builds it. Raise max_num_seqs and the engine captures another, larger graph "
                f"(more GPU memory, a longer start).")
        _kind = "danger"
    else:
        _ms = 1e3 * decode_step_seconds(llm, _n, steps=3)
        _msg = (f"Graphs captured for {_sizes}. A decode batch of {_n} replays the {_bucket} "
                f"graph: {_bucket - _n} padded row(s), {100 * (_bucket - _n) / _bucket:.0f}% of "
                f"the step's rows computed for nothing. Measured here, eager: {_ms:.1f} ms "
                "per step at this batch.")
        _kind = "warn" if _bucket - _n > _n / 2 else "success"
    mo.callout(mo.md(_msg), kind=_kind)
    return


@app.cell
def _(mo):
    mo.md(r"""
    ## Exercise: buckets

    An engine runs with `max_num_seqs=48`. How many CUDA graphs does it capture, and which
    bucket does a decode batch of **33** sequences replay? Enter `graphs,bucket`, e.g. `7,40`.
    """)
    answer = mo.ui.text(value="", label="graphs,bucket")
    answer
    return (answer,)


@app.cell
def _(capture_sizes):
    def check_buckets(text):
        sizes = capture_sizes(48)
        truth = (len(sizes), next(s for s in sizes if s >= 33))
        try:
            graphs, bucket = (int(x) for x in text.split(","))
        except ValueError:
            return "Enter two integers separated by a comma, e.g. 7,40."
        if (graphs, bucket) == truth:
            return (f"Correct: {sizes}, {truth[0]} graphs; 33 pads up to {truth[1]}, "
                    f"{truth[1] - 33} rows of padding.")
        if bucket == 64:
            return "No graph is larger than max_num_seqs: the last bucket is 48 itself."
        if graphs == 6:
            return "Count max_num_seqs itself as a bucket: powers of two below 48, then 48."
        return "Powers of two below 48, then 48; then the smallest bucket >= 33."
    return (check_buckets,)


@app.cell
def _(answer, check_buckets, mo):
    _msg = check_buckets(answer.value)
    mo.callout(mo.md(_msg), kind="success" if _msg.startswith("Correct") else "neutral")
    return


@app.cell
def _(BATCHES, breakdown, check_buckets, ops_per_step, same_tokens):
    def test_op_count_hardly_depends_on_batch():
        counts = sorted(ops_per_step.values())     # > 10 ops per layer, about the same for
        assert counts[0] > 30 * 10 and counts[-1] <= 1.05 * counts[0]   # every batch size

    def test_compiled_tokens_identical():
        assert same_tokens

    def test_breakdown_measured():
        assert all(breakdown[b]["op_ms"] > 0 for b in BATCHES)

    def test_exercise_checker():
        assert check_buckets("7,48").startswith("Correct")
        assert "48 itself" in check_buckets("7,64")
        assert "comma" in check_buckets("seven")
    return


@app.cell
def _(BATCHES, breakdown, compile_s, compiled_ms, mo, ops_per_step, same_tokens):
    findings = {
        "ops_per_decode_step": ops_per_step[BATCHES[0]],
        "python_share_batch_1": round(breakdown[BATCHES[0]]["python_ms"]
                                      / breakdown[BATCHES[0]]["profiled_ms"], 3),
        "python_share_batch_max": round(breakdown[BATCHES[-1]]["python_ms"]
                                        / breakdown[BATCHES[-1]]["profiled_ms"], 3),
        "eager_ms": {str(b): round(breakdown[b]["step_ms"], 1) for b in BATCHES},
        "compiled_ms": {str(b): round(ms, 1) for b, ms in compiled_ms.items()},
        "compile_s": round(compile_s, 1),
        "compiled_tokens_identical": same_tokens,
        "gpu_graph_numbers": "none recorded yet",
    }
    print("findings:", findings)
    mo.md(f"""
    ## What we found

    * A decode step of SmolLM2 issues **{ops_per_step[BATCHES[0]]}** operations at batch 1
      and about as many at every batch size; at batch {BATCHES[0]} the time outside them was
      **{100 * findings['python_share_batch_1']:.0f}%** of the step here, at batch
      {BATCHES[-1]} **{100 * findings['python_share_batch_max']:.0f}%**.
    * `torch.compile` of the norms and MLPs kept the tokens
      **{'identical' if same_tokens else 'different'}** and changed the step time by the ratios
      above: on this CPU, not enough to switch it on by default.
    * CUDA graphs need a GPU; no GPU timing of them has been recorded for this course yet.

    ## Where the code lives

    * `minivllm/worker/compilation.py`: `set_compilation` (what is compiled), `capture_sizes` (the
      buckets), `CUDAGraphRunner` (static buffers, capture, `run`: copy, pad, replay).
    * `minivllm/worker/model_runner.py`: `init_kv_cache` compiles and captures over the new pool;
      `forward` replays a graph for a pure decode step.
    * `kernels/paged_attention.py`: `DecodeScratch`, the fixed partials that make the decode
      kernel's grid the same every step; `kernels/write_kv.py` skips slot -1.
    * `minivllm/benchmarks/compile.py` (`minivllm bench compile`) and `minivllm/benchmarks/gpu.py
      --decode-modes` (the GPU measurement).
    """)
    return (findings,)


if __name__ == "__main__":
    app.run()
