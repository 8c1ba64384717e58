import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell
def _():
    import marimo as mo
    import matplotlib.pyplot as plt
    import numpy as np
    import torch

    from minivllm import LLM, SamplingParams
    from minivllm.core.kv_cache import REFERENCE_MODELS, kv_bytes_per_token, reference_config
    from minivllm.benchmarks.roofline import StepCost, measure_peaks
    from minivllm.workloads import Request, lognormal_requests, serve
    return (LLM, REFERENCE_MODELS, Request, SamplingParams, StepCost, kv_bytes_per_token,
            lognormal_requests, measure_peaks, mo, np, plt, reference_config, serve, torch)


@app.cell
def _(mo):
    mo.md(r"""
    # 01 · The KV cache: where every optimization is aimed

    After this lesson you can compute, for any model, how many bytes of memory one token of
    context costs; you will have measured how much of that memory a classic per-request
    cache wastes on a realistic mix of requests; and you will have seen on your own machine
    why generating a token is limited by memory traffic, not arithmetic. Every later lesson
    (paging, continuous batching, prefix caching, quantization) attacks one of these numbers.

    *Terms: TTFT, ITL, E2E latency, throughput and goodput are defined once for the course,
    in seconds and in engine steps, on the Glossary page (docs/glossary.md).*
    """)
    return


@app.cell
def _(LLM, kv_bytes_per_token, mo, torch):
    # The packaged SmolLM2-135M-Instruct. SLABS is the baseline this lesson dissects: every
    # request reserves MAX_MODEL_LEN slots the moment it starts. The decode measurement
    # below reconfigures the same loaded model to the paged layout.
    MAX_MODEL_LEN = 2048
    # Loaded with a placeholder pool of one slab; the engine then says what one token of
    # K and V costs in the dtype it picked (fp32 on a CPU, 46,080 bytes; bf16 on a GPU, half).
    llm = LLM(max_model_len=MAX_MODEL_LEN, kv_layout="contiguous", num_kv_blocks=1)
    _per_token = kv_bytes_per_token(llm.engine.model_config.hf_config, llm.engine.dtype)
    SLABS = dict(kv_layout="contiguous", kv_cache_memory=8 * MAX_MODEL_LEN * _per_token,
                 num_kv_blocks=None, max_num_seqs=64)              # 8 slabs: 8 requests
    llm.reconfigure(**SLABS)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    mo.md(f"**running on:** {device} · **model:** SmolLM2-135M-Instruct "
          f"({str(llm.engine.dtype).removeprefix('torch.')})  \n`{llm.engine!r}`")
    return MAX_MODEL_LEN, SLABS, device, llm


@app.cell
def _(mo):
    mo.md(r"""
    ## What the cache costs

    To produce token *t + 1*, attention needs the keys and values of tokens *1..t* at every
    layer. Recomputing them at each step would make generation quadratic, so every engine
    keeps them: the **KV cache**. Its size follows from the attention shape alone:

    $$\text{bytes per token} = 2\;(K\text{ and }V) \times \text{layers} \times
      \text{KV heads} \times \text{head dim} \times \text{bytes per element}$$

    Hidden size and vocabulary do not appear. The number of *KV* heads does, which is why
    grouped-query attention (lesson 09) shrinks the cache so much.
    """)
    return


@app.cell
def _(REFERENCE_MODELS, kv_bytes_per_token, mo, reference_config, torch):
    bytes_table = {_n: kv_bytes_per_token(reference_config(_n), torch.bfloat16)
                   for _n in REFERENCE_MODELS}
    _rows = [f"| {_n} | {_l} | {_h} / {_kv} | {_d} | {bytes_table[_n]:,} B "
             f"| {bytes_table[_n] * 4096 / 2**30:.2f} GiB |"
             for _n, (_l, _h, _kv, _d, _hid) in REFERENCE_MODELS.items()]
    print("KV bytes per token, bf16:", bytes_table)
    mo.md("| model | layers | query / KV heads | head dim | KV per token (bf16) "
          "| one 4k-token request |\n|---|---|---|---|---|---|\n" + "\n".join(_rows))
    return (bytes_table,)


@app.cell
def _(REFERENCE_MODELS, mo):
    model_pick = mo.ui.dropdown(list(REFERENCE_MODELS), value="Llama-3-8B", label="model")
    context = mo.ui.slider(512, 131072, step=512, value=8192, label="context tokens")
    batch = mo.ui.slider(1, 256, value=32, label="concurrent requests")
    dtype_pick = mo.ui.dropdown(["float32", "bfloat16", "float8_e4m3fn"], value="bfloat16",
                                label="KV dtype")
    mo.md(f"""
    ### Try it: find the workload that no longer fits

    The bar compares the KV cache a workload needs with what an 80 GB accelerator has left
    after the model's bf16 weights. Push context or concurrency until it turns red: that wall
    is what the rest of the course pushes back.

    {model_pick} {dtype_pick}

    {context} {batch}
    """)
    return batch, context, dtype_pick, model_pick


@app.cell
def _(batch, context, dtype_pick, kv_bytes_per_token, model_pick, plt, reference_config,
      torch):
    def kv_gib(name, tokens_each, requests, dtype="bfloat16"):
        per_token = kv_bytes_per_token(reference_config(name), getattr(torch, dtype))
        return per_token * tokens_each * requests / 2**30

    _billions = {"SmolLM2-135M": 0.135, "Qwen3-0.6B": 0.6, "Qwen3-8B": 8.2,
                 "Llama-3-8B": 8.0, "Qwen3-32B": 32.8, "Llama-3-70B": 70.6}
    _need = kv_gib(model_pick.value, context.value, batch.value, dtype_pick.value)
    _room = max(80e9 - _billions[model_pick.value] * 2e9, 0) / 2**30
    _fig, _ax = plt.subplots(figsize=(7, 1.9))
    _ax.barh(["KV needed", "free after weights"], [_need, _room],
             color=["tab:red" if _need > _room else "tab:green", "tab:gray"])
    _ax.set_xlabel("GiB")
    _ax.set_title(f"{model_pick.value}: {batch.value} x {context.value:,} tokens, "
                  f"{dtype_pick.value}: {_need:,.1f} GiB "
                  f"({'does not fit' if _need > _room else 'fits'})")
    _fig.tight_layout()
    _fig
    return (kv_gib,)


@app.cell
def _(mo):
    mo.md(r"""
    ## The problem, measured: a slab per request

    The simplest cache gives each request one contiguous slab of `max_model_len` slots when
    it starts, because nobody knows in advance how long the answer will be. The engine below
    (`kv_layout="contiguous"`) does exactly that, with `max_model_len = 2048`. We send it a
    realistic mix (short and long prompts, short and long answers, drawn from log-normal
    distributions as chat traffic is) and, after every step, count the slots reserved by
    running requests and the slots that actually hold a token.
    """)
    return


@app.cell
def _(llm, lognormal_requests, np):
    # A seeded workload: prompt and output lengths with a long tail, like real chat traffic
    # (log-normal, clipped: (mu, sigma, min, max) of each length).
    NUM_REQUESTS = 16
    workload = lognormal_requests(llm.tokenizer, NUM_REQUESTS, prompt=(3.8, 0.7, 8, 400),
                                  output=(3.9, 0.6, 4, 160), seed=0, stride=5)
    prompt_lens = np.array([len(_r.prompt) for _r in workload])
    output_lens = np.array([_r.params.max_tokens for _r in workload])
    print(f"{NUM_REQUESTS} requests; prompt tokens: median {int(np.median(prompt_lens))}, "
          f"max {prompt_lens.max()}; output tokens: median {int(np.median(output_lens))}, "
          f"max {output_lens.max()}")
    return NUM_REQUESTS, output_lens, prompt_lens, workload


@app.cell
def _(SLABS, llm, serve, workload):
    # Every step recorded, with the engine's stats after it (StepRecord.stats).
    static_trace = [_s.stats for _s in serve(llm.reconfigure(**SLABS), workload).steps]
    return (static_trace,)


@app.cell
def _(MAX_MODEL_LEN, np, plt, static_trace):
    _reserved = np.array([s.slots_reserved for s in static_trace])
    _used = np.array([s.tokens_cached for s in static_trace])
    static_utilization = _used.sum() / _reserved.sum()
    _fig, _ax = plt.subplots(figsize=(8, 3.2))
    _ax.fill_between(range(len(_reserved)), _reserved, step="post", alpha=0.3,
                     color="tab:red", label=f"slots reserved ({MAX_MODEL_LEN} per request)")
    _ax.fill_between(range(len(_used)), _used, step="post", alpha=0.8, color="tab:blue",
                     label="slots holding a token")
    _ax.set_xlabel("engine step")
    _ax.set_ylabel("KV slots")
    _ax.set_title(f"Static preallocation: {static_utilization:.1%} of reserved KV memory "
                  "is ever used")
    _ax.legend(loc="upper right")
    _fig.tight_layout()
    print(f"static cache utilization: {static_utilization:.1%} "
          f"(waste {1 - static_utilization:.1%}); at most "
          f"{max(s.num_running for s in static_trace)} requests ran at once")
    _fig
    return (static_utilization,)


@app.cell
def _(mo, static_trace, static_utilization):
    _waiting = max(s.num_waiting for s in static_trace)
    mo.md(f"""
    Only **{static_utilization:.1%}** of the memory reserved for KV ever held a token. The
    rest is the gap between what each request might need (2048 slots) and what it used.
    Worse, that reservation is what limits concurrency: with room for 8 slabs, up to
    {_waiting} requests queued while most of the reserved memory sat empty. Since every decode
    step costs about the same whether it serves 1 request or 8 (next section), requests that
    could not be admitted are throughput thrown away. Lesson 02 keeps the cache in small
    blocks handed out on demand and brings utilization close to 100%.
    """)
    return


@app.cell
def _(mo):
    concurrency = mo.ui.slider(steps=[4, 8, 16, 32, 64], value=16, show_value=True,
                               label="requests arriving together")
    mo.md(f"""
    ### Try it: push the slab engine until the queue blows up

    The same 8 slabs, now offered a burst of short requests (an 8-token prompt, 8 tokens
    each). Slide the burst up: up to 8 everything runs at once; past that, every extra
    request waits in the queue for a whole slab to free, while almost all of the slab
    memory is empty. Each value runs the engine (a few seconds on a CPU).

    {concurrency}
    """)
    return (concurrency,)


@app.cell
def _(Request, SLABS, SamplingParams, concurrency, llm, mo, np, plt, serve):
    _ids = llm.tokenizer.encode("The key to fast inference is")
    _burst = serve(llm.reconfigure(**SLABS),
                   [Request(_ids, SamplingParams(temperature=0, max_tokens=8,
                                                 ignore_eos=True))] * concurrency.value)
    burst = {"requests": concurrency.value, "steps": len(_burst.steps),
             "max_waiting": max(_s.stats.num_waiting for _s in _burst.steps),
             "max_running": max(_s.stats.num_running for _s in _burst.steps),
             "ttft_s": np.array(_burst.ttfts)}
    _fig, _ax = plt.subplots(figsize=(8, 2.6))
    _x = range(1, len(_burst.steps) + 1)
    _ax.step(_x, [_s.stats.num_running for _s in _burst.steps], where="mid",
             color="tab:green", label="running (one slab each)")
    _ax.step(_x, [_s.stats.num_waiting for _s in _burst.steps], where="mid",
             color="tab:red", label="waiting for a slab")
    _ax.set_xlabel("engine step")
    _ax.set_ylabel("requests")
    _ax.legend(fontsize=8)
    _ax.set_title(f"{concurrency.value} requests on 8 slabs: {burst['steps']} steps, "
                  f"the last first token after {burst['ttft_s'].max():.1f} s", fontsize=10)
    _fig.tight_layout()
    print(f"burst of {concurrency.value} on 8 slabs: {burst['steps']} steps, at most "
          f"{burst['max_running']} running and {burst['max_waiting']} waiting; TTFT median "
          f"{np.median(burst['ttft_s']):.2f} s, max {burst['ttft_s'].max():.2f} s")
    mo.vstack([_fig, mo.md(
        f"Each request holds at most {len(_ids) + 8} of its slab's 2048 slots, yet at most "
        f"**{burst['max_running']}** ran and **{burst['max_waiting']}** waited. The queue "
        "grows by one for every request past 8, and each wave of 8 adds 8 steps to the "
        "time the last one waits for its first token.")])
    return (burst,)


@app.cell
def _(mo):
    mo.md(r"""
    ## Decode is memory-bound

    In a decode step each running request contributes one new token. The model's weights
    must still be read in full, once per step, whatever the batch: SmolLM2 in fp32 is
    135 M parameters x 4 bytes = 540 MB per step. Arithmetic per step grows with the batch;
    memory traffic barely does. So until the batch is large, a step takes about the same
    time for 1 request as for 16, and throughput grows almost for free with batch size. That
    is why the KV cache's size matters so much: it decides how many requests fit in a batch.
    Measured live on this device:
    """)
    return


@app.cell
def _(Request, SamplingParams, llm, mo, serve):
    _script = mo.app_meta().mode == "script" or "headless" in mo.cli_args()
    batch_sizes = [1, 2, 4, 8, 16, 32] if _script else [1, 2, 4, 8, 16, 32, 64]
    # Paged now (lesson 02), so that 64 requests fit; the weights stay loaded.
    llm.reconfigure(kv_layout="paged", kv_cache_memory=None, max_num_seqs=64)
    _ids = llm.tokenizer.encode("The key to fast inference is")
    # Warm-up: the first steps after a reconfigure pay one-time costs (allocation, kernel
    # selection); unwarmed, batch 1 looked twice as slow as batch 2 and inflated the ratio.
    serve(llm, [Request(_ids, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))] * 2)
    step_ms, decode_tokens_per_step, num_steps = [], [], []
    for _b in batch_sizes:
        print(f"decoding a batch of {_b} ...", flush=True)
        _run = serve(llm, [Request(_ids, SamplingParams(temperature=0, max_tokens=12,
                                                        ignore_eos=True))] * _b)
        _decodes = [_s for _s in _run.steps if not _s.num_prefill_tokens]
        num_steps.append(len(_run.steps))
        decode_tokens_per_step.append(max(_s.num_decode_tokens for _s in _decodes))
        step_ms.append(1000 * min(_s.duration for _s in _decodes))   # least disturbed step
    tokens_per_s = [b / (ms / 1000) for b, ms in zip(batch_sizes, step_ms)]
    weight_bytes = sum(p.numel() * p.element_size()
                       for p in llm.engine.runner.model.parameters())
    for _b, _n, _ms, _tps in zip(batch_sizes, decode_tokens_per_step, step_ms, tokens_per_s):
        print(f"batch {_b:3d}: {_n:3d} tokens per decode step, one read of the weights "
              f"({weight_bytes / _n / 1e6:6.1f} MB per token); {_ms:7.1f} ms/step  "
              f"{_tps:7.1f} tokens/s  weights read at "
              f"{weight_bytes / (_ms / 1000) / 1e9:5.1f} GB/s")
    decode_context = len(_ids) + 6          # the middle of the 12 decode steps
    return (batch_sizes, decode_context, decode_tokens_per_step, num_steps, step_ms,
            tokens_per_s, weight_bytes)


@app.cell
def _(batch_sizes, device, plt, step_ms, tokens_per_s):
    _fig, (_a, _b) = plt.subplots(1, 2, figsize=(9, 3.2))
    _a.plot(batch_sizes, step_ms, "o-")
    _a.set_xscale("log", base=2)
    _a.set_xlabel("requests in the batch")
    _a.set_ylabel("ms per decode step")
    _a.set_ylim(bottom=0)
    _a.set_title("step time: flat, then growing")
    _b.plot(batch_sizes, tokens_per_s, "o-", color="tab:green")
    _b.set_xscale("log", base=2)
    _b.set_xlabel("requests in the batch")
    _b.set_ylabel("tokens / s")
    _b.set_title("throughput: grows with batch")
    _fig.suptitle(f"Decode on {device}")
    _fig.tight_layout()
    decode_speedup = tokens_per_s[-1] / tokens_per_s[0]
    step_time_growth = step_ms[-1] / step_ms[0]
    print(f"batch {batch_sizes[-1]} vs 1: {decode_speedup:.1f}x the tokens/s for "
          f"{step_time_growth:.1f}x the step time")
    _fig
    return decode_speedup, step_time_growth


@app.cell
def _(mo):
    mo.md(r"""
    ## One cost model: the roofline of this device

    "Memory-bound" is a claim about two numbers, so measure them. This device has a peak
    arithmetic rate (a large matmul) and a peak bandwidth (a large copy); their ratio, the
    **ridge**, is the FLOPs a step must do per byte it moves to be limited by arithmetic
    rather than by memory. `minivllm/benchmarks/roofline.py` counts each step's FLOPs and bytes from the
    model's shapes (every weight read once, the KV read, the activations), and the course
    uses this one model from here on (lessons 08 and 10 reuse it). Each decode step above,
    and one 128-token prefill step, go on the roofline below.
    """)
    return


@app.cell
def _(
    Request,
    SamplingParams,
    StepCost,
    batch_sizes,
    decode_context,
    llm,
    measure_peaks,
    serve,
    step_ms,
):
    _on_gpu = llm.engine.device.type == "cuda"
    peaks = measure_peaks(llm.engine.device, llm.engine.dtype,
                          **(dict(n=8192, copy_mib=2048) if _on_gpu else {}))
    cost = StepCost.of(llm.engine.model_config.hf_config, llm.engine.dtype)
    PREFILL_TOKENS = 512 if _on_gpu else 128
    _ids = llm.tokenizer.encode("A prompt is computed in one step, all of its tokens at "
                                "once, against one read of the weights. " * 40)
    _run = serve(llm, [Request(_ids[:PREFILL_TOKENS],
                               SamplingParams(temperature=0, max_tokens=1))])
    # (name, FLOPs, bytes, measured seconds) of each step put on the roofline.
    roofline_steps = [(f"decode x{_b}", *cost.step([1] * _b, [decode_context] * _b, _b),
                       _ms / 1000) for _b, _ms in zip(batch_sizes, step_ms)]
    roofline_steps.append((f"prefill {PREFILL_TOKENS}",
                           *cost.step([PREFILL_TOKENS], [PREFILL_TOKENS], 1),
                           _run.steps[0].duration))
    # The knee in batch size: where a decode step's FLOPs per byte reaches the ridge.
    knee_batch = next((_b for _b in range(1, 4097)
                       if _b * 2 * (cost.linear_params + cost.head_params)
                       >= peaks.ridge * cost.step([1] * _b, [decode_context] * _b, _b)[1]),
                      None)
    print(f"this device: {peaks.flops / 1e9:.1f} GFLOP/s, {peaks.bandwidth / 1e9:.1f} GB/s, "
          f"ridge {peaks.ridge:.1f} FLOP/byte; decode reaches it at batch {knee_batch}")
    for _name, _f, _m, _t in roofline_steps:
        print(f"{_name:>12}: {_f / _m:7.2f} FLOP/byte, {_f / _t / 1e9:6.2f} GFLOP/s and "
              f"{_m / _t / 1e9:5.2f} GB/s achieved, {1e3 * _t:7.1f} ms (roofline bound "
              f"{1e3 * peaks.bound(_f, _m):6.1f} ms)")
    return PREFILL_TOKENS, cost, knee_batch, peaks, roofline_steps


@app.cell
def _(PREFILL_TOKENS, cost, device, knee_batch, mo, np, peaks, plt, roofline_steps):
    _fig, _ax = plt.subplots(figsize=(7.5, 4))
    _x = np.logspace(-1, 3, 200)
    _ax.loglog(_x, np.minimum(peaks.flops, peaks.bandwidth * _x) / 1e9, "k-", lw=1.5,
               label="roofline (measured peaks)")
    _ax.axvline(peaks.ridge, color="gray", ls=":", lw=1, label=f"ridge {peaks.ridge:.1f}")
    for _name, _f, _m, _t in roofline_steps:
        _pre = _name.startswith("prefill")
        _ax.loglog(_f / _m, _f / _t / 1e9, "s" if _pre else "o",
                   color="tab:orange" if _pre else "tab:blue", ms=8)
        _ax.annotate(_name.removeprefix("decode "), (_f / _m, _f / _t / 1e9), fontsize=7,
                     xytext=(4, -10), textcoords="offset points")
    _ax.set_xlabel("arithmetic intensity, FLOP/byte")
    _ax.set_ylabel("GFLOP/s achieved")
    _ax.set_title(f"{device}: decode steps (blue, by batch) and one prefill (orange)",
                  fontsize=10)
    _ax.legend(fontsize=8, loc="upper left")
    _fig.tight_layout()
    _d1, _pf = roofline_steps[0], roofline_steps[-1]
    mo.vstack([_fig, mo.md(f"""
    A decode step of batch 1 does **{_d1[1] / _d1[2]:.2f} FLOP per byte** (two FLOPs per
    weight, each weight {cost.elem} bytes here): far left of the ridge at
    **{peaks.ridge:.1f}**, so its time is the weights' bytes over the bandwidth,
    and adding sequences adds arithmetic that the memory wait hides. That is the flat part
    of the step-time plot above. Each sequence adds about {2 / cost.elem:g} FLOP per weight byte, so
    decode reaches the ridge near batch **{knee_batch}** here (the knee), and from there on a
    step costs its arithmetic: step time grows with the tokens in it. A prefill of
    {PREFILL_TOKENS} tokens sits at **{_pf[1] / _pf[2]:.0f} FLOP/byte**, far right of the
    ridge: compute-bound, each token paying its own FLOPs. Lesson 10 measures exactly that
    slope (milliseconds per token in a step) on steps of 64 to 644 tokens, all right of the
    knee; lesson 01's flat line and lesson 10's "no slack" are the two sides of this one
    roofline. On a GPU the ridge is near 300 FLOP/byte in bf16, so the knee moves to
    batches of hundreds; no GPU run of this lesson is recorded yet (docs/benchmarks.md).
    """)])
    return


@app.cell
def _(mo):
    answer = mo.ui.number(start=0, stop=10**9, value=0, label="bytes per token")
    mo.vstack([mo.md(r"""
    ## Exercise

    Llama-3-70B has 80 layers, 64 query heads, **8 KV heads** and a head dimension of 128.
    How many bytes of KV cache does one token take in bf16? Type your answer; the checker
    tells you what went wrong if it is off.
    """), answer])
    return (answer,)


@app.cell
def _(bytes_table):
    def check_kv_answer(value):
        truth = bytes_table["Llama-3-70B"]
        if value == truth:
            return f"Correct: 2 x 80 x 8 x 128 x 2 = {truth:,} bytes (320 KiB) per token."
        if value == truth * 8:
            return "That used the 64 query heads: only the 8 KV heads are cached."
        if value == truth // 2:
            return "Missing a factor 2: both K and V are stored."
        if value == truth * 2:
            return "bf16 is 2 bytes per element, not 4."
        if not value:
            return "Enter a number of bytes."
        return f"{value:,} is not it: multiply 2 (K, V) x layers x KV heads x head dim x bytes."
    return (check_kv_answer,)


@app.cell
def _(answer, check_kv_answer, mo):
    mo.callout(mo.md(check_kv_answer(answer.value)),
               kind="success" if answer.value and "Correct" in check_kv_answer(answer.value)
               else "neutral")
    return


@app.cell
def _(mo):
    # Headless, the right answer is filled in so that the checker's verdict is tested below.
    _headless = mo.app_meta().mode == "script" or "headless" in mo.cli_args()
    PREDICT_REQUESTS = 20
    steps_guess = mo.ui.number(start=0, stop=1000, value=24 if _headless else 0,
                               label="engine steps until the last request finishes")
    mo.vstack([mo.md(f"""
    ## Predict, then the engine checks

    Back to the 8 slabs (`kv_layout="contiguous"`, room for 8 requests of 2048 slots). A
    burst of **{PREDICT_REQUESTS}** requests arrives at once, each an 8-token prompt asking
    for 8 tokens (the prefill's step gives the first one). How many **engine steps** until the
    last of them finishes? Write your number first; the engine then serves the burst and its
    own step count decides.
    """), steps_guess])
    return PREDICT_REQUESTS, steps_guess


@app.cell
def _(PREDICT_REQUESTS, Request, SLABS, SamplingParams, llm, serve):
    # The truth: the slab engine serves the burst, and we count its steps.
    _ids = llm.tokenizer.encode("The key to fast inference is")
    _run = serve(llm.reconfigure(**SLABS),
                 [Request(_ids, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))]
                 * PREDICT_REQUESTS)
    predict_truth = {"steps": len(_run.steps),
                     "max_running": max(_s.stats.num_running for _s in _run.steps),
                     "max_waiting": max(_s.stats.num_waiting for _s in _run.steps)}

    def check_steps_guess(value):
        """The learner's step count against the engine's."""
        steps, ran, waited = (predict_truth[_k] for _k in ("steps", "max_running",
                                                           "max_waiting"))
        if not value:
            return "Enter a number of engine steps."
        if value == steps:
            return (f"Correct: the engine took {steps} steps. At most {ran} requests held a "
                    f"slab, so the {PREDICT_REQUESTS} went through in waves of {ran}, each "
                    f"wave 8 steps long, however little of its slabs it used.")
        if value == 8:
            return (f"That is the time for all {PREDICT_REQUESTS} at once, which pages would "
                    f"allow. The engine counted {steps}: only {ran} slabs, so {waited} "
                    "requests waited for one to free.")
        if value == 8 * PREDICT_REQUESTS:
            return (f"That is one request at a time. The engine ran {ran} at once and took "
                    f"{steps} steps.")
        if value < steps:
            return (f"Too few: the engine took {steps}. A wave that is not full still takes "
                    "all 8 steps of its longest request.")
        return f"Too many: the engine took {steps} steps, with up to {ran} running at once."
    return check_steps_guess, predict_truth


@app.cell
def _(check_steps_guess, mo, steps_guess):
    _msg = check_steps_guess(steps_guess.value)
    mo.callout(mo.md(f"Your prediction: **{steps_guess.value}** steps. {_msg}"),
               kind="success" if _msg.startswith("Correct") else "neutral")
    return


@app.cell
def _(mo):
    # Shown at the end, under "Where the code lives".
    v1_box = mo.callout(mo.md(r"""
    **In vLLM V1** (as of vLLM 0.33). The bytes of one block are `page_size_bytes` of the
    layer's `AttentionSpec`, a `KVCacheSpec` (`vllm/v1/kv_cache_interface.py`): block_size x KV
    heads x (K head size + V head size) x dtype bytes, this lesson's formula per block when K
    and V have the same width. `Worker.determine_available_memory`
    (`vllm/v1/worker/gpu_worker.py`) profiles a forward pass and gives the KV cache what
    `gpu_memory_utilization` leaves, unless `kv_cache_memory_bytes` fixes the budget outright.
    `EngineCore._initialize_kv_caches` (`vllm/v1/engine/core.py`) hands those bytes to
    `get_kv_cache_configs` (`vllm/v1/core/kv_cache_planning.py`; it no longer lives in
    `kv_cache_utils.py`), which turns them into one block count shared by every worker; each
    worker's model runner then allocates it in `initialize_kv_cache` (Model Runner V2's
    `GPUModelRunner`, `vllm/v1/worker/gpu/model_runner.py`, the default where Triton is
    available; the older `vllm/v1/worker/gpu_model_runner.py` otherwise). Blocks are then
    handed out by `KVCacheManager.allocate_slots` (`vllm/v1/core/kv_cache_manager.py`). V1
    has no slab layout: it is paged from the start. minivllm keeps `kv_layout="contiguous"`
    only as this lesson's "before". Its `kv_cache_memory` is the twin of
    `kv_cache_memory_bytes`, and its lessons size their pools that way (or by
    `num_kv_blocks`) rather than by profiling, so that a CPU run and a lesson get the same
    pool every time.
    """), kind="info")
    return (v1_box,)


@app.cell
def _(
    batch_sizes,
    burst,
    bytes_table,
    check_kv_answer,
    check_steps_guess,
    decode_tokens_per_step,
    num_steps,
    peaks,
    predict_truth,
    roofline_steps,
    static_utilization,
    steps_guess,
):
    def test_static_preallocation_wastes_most_of_the_cache():
        assert static_utilization < 0.2

    def test_one_decode_step_serves_the_whole_batch():
        # Counted, not timed: every request gets its token in every decode step, so a batch
        # of b reads the weights once per b tokens, and b requests take as many steps as one.
        # (The seconds are printed above; on a shared machine they can swing several-fold.)
        assert decode_tokens_per_step == batch_sizes
        assert num_steps == [num_steps[0]] * len(batch_sizes) == [12] * len(batch_sizes)

    def test_decode_left_of_the_ridge_prefill_right_of_it():
        # FLOPs and bytes are counted from the shapes; the ridge is measured (a ratio of two
        # peaks, which a loaded machine moves by far less than the 100x between the two).
        (_, df, dm, dt), (_, pf, pm, pt) = roofline_steps[0], roofline_steps[-1]
        assert df / dm < 1 < peaks.ridge < pf / pm
        # Same weights, same device: the prefill step gets several times the FLOP/s.
        assert pf / pt > 3 * df / dt

    def test_slab_queue_grows_past_eight_requests():
        # Counted: 8 slabs run 8 requests; the rest wait, in waves of 8 steps each.
        assert burst["max_running"] == min(8, burst["requests"])
        assert burst["max_waiting"] == max(0, burst["requests"] - 8)
        assert burst["steps"] == 8 * -(-burst["requests"] // 8)

    def test_bytes_per_token_of_known_models():
        assert bytes_table["Llama-3-8B"] == 131072
        assert bytes_table["Llama-3-70B"] == 327680

    def test_exercise_checker():
        assert check_kv_answer(327680).startswith("Correct")
        assert "query heads" in check_kv_answer(327680 * 8)
        assert "K and V" in check_kv_answer(327680 // 2)

    def test_the_engine_checks_the_step_prediction():
        # The headless run answered 24 (3 waves of 8 steps); the engine's count decides.
        assert check_steps_guess(steps_guess.value).startswith("Correct")
        assert predict_truth["max_running"] == 8
        assert check_steps_guess(8).startswith("That is the time for all")
        assert not check_steps_guess(20).startswith("Correct")
    return


@app.cell
def _(
    decode_speedup,
    decode_tokens_per_step,
    knee_batch,
    mo,
    peaks,
    roofline_steps,
    static_utilization,
    step_time_growth,
    v1_box,
    weight_bytes,
):
    findings = {
        "ridge_flop_per_byte": peaks.ridge,
        "decode_knee_batch": knee_batch,
        "flop_per_byte": {_n: _f / _m for _n, _f, _m, _ in roofline_steps},
        "static_kv_utilization": static_utilization,
        "decode_tokens_per_step": decode_tokens_per_step,
        "decode_speedup_at_max_batch": decode_speedup,
        "decode_step_time_growth": step_time_growth,
    }
    print("findings:", findings)
    mo.vstack([mo.md(f"""
    ## What we found

    * A token of context costs 2 x layers x KV heads x head dim x bytes: 45 KiB for SmolLM2
      in fp32, 128 KiB for Llama-3-8B and 320 KiB for Llama-3-70B in bf16.
    * Reserving `max_model_len` slots per request used **{static_utilization:.1%}** of the
      reserved memory on a realistic mix.
    * One decode step served the whole batch (counted: {decode_tokens_per_step[-1]} tokens
      for one read of the weights at the largest batch, in as many steps as one request
      took), so the weight bytes read per token fell {decode_tokens_per_step[-1]}-fold:
      {weight_bytes / 1e6:.0f} MB per token at batch 1,
      {weight_bytes / decode_tokens_per_step[-1] / 1e6:.1f} MB at batch
      {decode_tokens_per_step[-1]}. The seconds, beside (a shared machine moves them): on
      this run throughput grew {decode_speedup:.1f}x while each step became
      {step_time_growth:.1f}x slower. Decode is bound by reading weights (and, at long
      contexts, the KV cache), not by arithmetic.
    * This device's roofline puts the ridge at {peaks.ridge:.1f} FLOP/byte: decode crosses it
      near batch {knee_batch}, a prefill sits far to its right.

    ## Where the code lives

    * `minivllm/benchmarks/roofline.py`: `measure_peaks` and `StepCost`, the course's one cost model.
    * `minivllm/core/kv_cache.py`: `kv_bytes_per_token`, `ContiguousAllocator` (this lesson's slab
      per request) and the KV pool layout.
    * `minivllm/attention/torch_attention.py`: how attention finds a sequence's K/V through its block table;
      a slab is one block of `max_model_len` slots, so both layouts share that code.
    * `minivllm/engine/core.py`: `EngineCore.step` and `EngineCore.stats` (the front end,
      `LLMEngine` in `minivllm/engine/llm_engine.py`, reaches them through its client);
      `minivllm/benchmarks/workloads.py`: `lognormal_requests` and `serve` (the step trace), used above.
    * Next: lesson 02 replaces the slab with pages (`minivllm/core/block_manager.py`).
    """), v1_box])
    return (findings,)


if __name__ == "__main__":
    app.run()
