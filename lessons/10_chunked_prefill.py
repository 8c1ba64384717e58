import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell
def _():
    import functools
    import math

    import marimo as mo
    import matplotlib.pyplot as plt
    import numpy as np
    import torch

    from minivllm import LLM, SamplingParams
    from minivllm.benchmarks.roofline import StepCost, measure_peaks
    from minivllm.workloads import Request, serve
    return (LLM, Request, SamplingParams, StepCost, functools, math, measure_peaks, mo, np,
            plt, serve, torch)


@app.cell
def _(mo):
    mo.md(r"""
    # 10 · Chunked prefill: a long prompt without a frozen stream

    After this lesson you can explain why one long prompt can freeze every other user's
    token stream, how splitting its prefill into chunks under a per-step token budget
    (`max_num_batched_tokens`) prevents that, and what the budget trades: the newcomer's
    time to first token against everyone else's inter-token latency. You will watch the
    real scheduler pack prefill chunks and decodes into the same forward passes, step by
    step, with chunking off and on.

    Lesson 09 made room in a pool for more and longer prompts, and lesson 08 counted how one
    long prompt's prefill stretches the step of every request decoding beside it. This lesson
    keeps both phases in one engine and bounds the step instead.

    *Terms: TTFT, ITL, E2E latency, throughput and goodput are defined once for the course,
    in seconds and in engine steps, on the Glossary page (docs/glossary.md).*
    """)
    return


@app.cell
def _(LLM, mo, torch):
    # One loaded model, two settings. Without chunking a prompt must fit one step whole, so
    # the budget must cover max_model_len (SchedulerConfig checks this). With chunking, the
    # budget is a per-step cap on tokens: BUDGET here, and other values in the widget below.
    # Each run below calls llm.reconfigure(...) with its setting: a fresh KV pool over the
    # same weights. Prefix caching is off: the same prompts are served several times in this
    # lesson and must cost the same every time. num_kv_blocks is fixed so that, on a GPU, the
    # pool is not sized from free memory.
    MAX_MODEL_LEN, BUDGET = 1024, 128
    llm = LLM(max_model_len=MAX_MODEL_LEN, num_kv_blocks=192, enable_prefix_caching=False,
              enable_chunked_prefill=True, max_num_batched_tokens=BUDGET)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    mo.md(f"**running on:** {device} · **model:** SmolLM2-135M-Instruct "
          f"({str(llm.engine.dtype).removeprefix('torch.')}) · **token budget:** "
          f"{MAX_MODEL_LEN} without chunking, {BUDGET} with  \n`{llm.engine!r}`")
    return BUDGET, MAX_MODEL_LEN, device, llm


@app.cell
def _(mo):
    mo.md(r"""
    ## Prefill and decode in one step

    A request's life has two phases. **Prefill** computes K and V for every prompt token in
    one forward pass: hundreds of tokens at once, so the pass is dominated by arithmetic.
    **Decode** then adds one token per step: the pass reads all the weights for a single
    token per sequence, so it is dominated by memory traffic (lesson 01).

    minivllm's scheduler, like vLLM's, fills each step under a budget of
    `max_num_batched_tokens` tokens. Running requests go first: a decoding request costs 1
    token of budget. Then waiting requests are admitted while budget is left. Without
    chunking, a prompt is admitted only if it fits the budget *whole*, so one step may carry
    the decodes plus a 700-token prefill, and every decoding request waits for that whole
    pass before its next token. With chunking, a prompt takes whatever budget is left; its
    `num_computed_tokens` advances by a chunk per step until the prompt is done, and only the
    step that computes its last chunk samples its first token.
    """)
    return


@app.cell
def _(Request, SamplingParams, llm, math, np, serve, torch):
    # The scenario: NUM_DECODERS short requests are decoding when a LONG_PROMPT-token prompt
    # arrives, just before step ARRIVAL_STEP. EOS is ignored so every run has the same shape.
    NUM_DECODERS, DECODE_TOKENS = 4, 24
    LONG_PROMPT = 896 if torch.cuda.is_available() else 640
    ARRIVAL_STEP, LONG_OUTPUT = 4, 4
    _text = llm.tokenizer.encode(
        "Chunked prefill splits a long prompt into pieces that fit the step's token budget. "
        "Each piece writes its keys and values into the paged cache, and the next piece "
        "attends to them, so nothing is computed twice. Meanwhile the requests that are "
        "already generating keep receiving one token per step. " * 30)
    assert len(_text) > LONG_PROMPT + 100, len(_text)

    def scenario(long_prompt=LONG_PROMPT, decoders=NUM_DECODERS, decode_tokens=DECODE_TOKENS,
                 arrival=ARRIVAL_STEP, prompt_len=16):
        """Requests 0..decoders-1 decode from step 1; the last, the long one, is added before
        step `arrival` (arrival_step counts from 0)."""
        def greedy(n):
            return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
        reqs = [Request(_text[50 + 11 * i: 50 + 11 * i + prompt_len], greedy(decode_tokens))
                for i in range(decoders)]
        return reqs + [Request(_text[:long_prompt], greedy(LONG_OUTPUT),
                               arrival_step=arrival - 1)]

    def run(requests, budget, chunked=True):
        """Serve `requests` with chunking on or off at `budget` tokens per step, and read
        from the step trace what every step carried. Steps are numbered from 1."""
        llm.reconfigure(enable_chunked_prefill=chunked, max_num_batched_tokens=budget)
        res = serve(llm, requests)
        long = len(requests) - 1
        per_step = [{int(x.request_id.removeprefix("req-")): x for x in s.scheduled}
                    for s in res.steps]
        long_chunks = np.array([x[long].num_tokens if long in x and x[long].is_prefill else 0
                                for x in per_step])
        # A request samples its first token in the step that computes its last prompt token
        # (the last prefill step) and its last token in its finish step; in every step in
        # between it is decoding and should be scheduled. A step that leaves one out blocked it.
        first = [max(k for k, x in enumerate(per_step, 1) if i in x and x[i].is_prefill)
                 for i in range(len(requests))]
        blocked = [any(first[i] < k <= res.finish_step[i] and i not in x
                       for i in range(len(requests))) for k, x in enumerate(per_step, 1)]
        during = long_chunks > 0                 # the steps that prefilled the long prompt
        itl = [o.inter_token_latencies for o in res.outputs[:long]]
        return {
            "steps": res.steps, "long_chunks": long_chunks,
            "prefill": np.array([s.num_prefill_tokens for s in res.steps]),
            "decode": np.array([s.num_decode_tokens for s in res.steps]),
            "total": np.array([s.num_batched_tokens for s in res.steps]),
            "step_s": np.array([s.duration for s in res.steps]),
            "budget": budget, "chunked": chunked,
            "long_first_token_step": first[long],
            "long_ttft_steps": first[long] - requests[long].arrival_step,
            "long_ttft_s": res.outputs[long].metrics.ttft,
            "long_prefill_steps": int(during.sum()),
            "decodes_during_long_prefill": [             # the decoders' tokens only
                sum(v.num_tokens for i, v in x.items() if i != long and not v.is_prefill)
                for x, d in zip(per_step, during) if d],
            "blocked_decode_steps": sum(blocked),
            "max_decode_itl_s": max(max(v) for v in itl),
            "median_decode_itl_s": float(np.median(np.concatenate(itl))),
            "tokens": [o.outputs[0].token_ids for o in res.outputs],
            "wall_s": float(sum(s.duration for s in res.steps)),
        }

    def expected_prefill_steps(long_prompt, budget, decoders):
        """What the budget rule predicts: each step leaves budget - decoders for the prompt."""
        return math.ceil(long_prompt / (budget - decoders))
    return (ARRIVAL_STEP, DECODE_TOKENS, LONG_PROMPT, NUM_DECODERS, expected_prefill_steps,
            run, scenario)


@app.cell
def _(BUDGET, MAX_MODEL_LEN, functools, run, scenario):
    # Warm-up (first-step allocations, lazy imports), once per setting.
    run(scenario(long_prompt=64, decode_tokens=3, arrival=2), MAX_MODEL_LEN, chunked=False)
    run(scenario(long_prompt=64, decode_tokens=3, arrival=2), BUDGET)

    @functools.cache
    def run_budget(budget):
        """The scenario with chunking on at `budget` tokens per step (cached)."""
        return run(scenario(), budget)

    without = run(scenario(), MAX_MODEL_LEN, chunked=False)
    return run_budget, without


@app.cell
def _(plt):
    def draw_steps(axes, run, title, ms_top=None):
        """Top: tokens per step, decode and prefill stacked, the budget dashed. Bottom: the
        wall time of each step."""
        top, bottom = axes
        x = range(1, len(run["total"]) + 1)
        top.bar(x, run["decode"], color="tab:blue", label="decode tokens")
        top.bar(x, run["prefill"], bottom=run["decode"], color="tab:orange",
                label="prefill tokens")
        if run["chunked"]:
            top.axhline(run["budget"], color="k", ls="--", lw=1,
                        label=f"budget {run['budget']}")
        top.set_yscale("symlog", linthresh=8)
        top.set_ylabel("tokens in the step")
        top.set_title(title, fontsize=10)
        ms = 1000 * run["step_s"]
        bottom.bar(x, ms, color=["tab:orange" if c else "tab:gray" for c in run["long_chunks"]])
        # Scale to the steps that matter. A step slowed by other load on a shared machine is
        # cut off at the top rather than squashing the rest.
        ms_top = ms_top or 1.3 * ms[run["long_chunks"] > 0].max()
        bottom.set_ylim(0, ms_top)
        if ms.max() > ms_top:
            bottom.text(0.01, 0.9, "taller steps cut off (other load on this machine)",
                        fontsize=7, transform=bottom.transAxes)
        bottom.set_ylabel("step time, ms")
        bottom.set_xlabel("engine step (orange: prefills the long prompt)")
        top.legend(fontsize=7, loc="upper right")
    return (draw_steps,)


@app.cell
def _(ARRIVAL_STEP, LONG_PROMPT, NUM_DECODERS, mo):
    mo.md(f"""
    ## The problem, measured: one prompt freezes everyone

    {NUM_DECODERS} short requests start together and decode; before step {ARRIVAL_STEP} a
    **{LONG_PROMPT}-token** prompt arrives. The engine below has chunking off. Top: the
    tokens each step carried (blue: decodes, orange: prefill; note the log scale). Bottom:
    how long each step took on this machine.
    """)
    return


@app.cell
def _(draw_steps, plt, without):
    _fig, _axes = plt.subplots(2, 1, figsize=(9, 4.6), sharex=True, height_ratios=[3, 2])
    draw_steps(_axes, without, f"chunking off: the long prompt is prefilled in one step of "
               f"{without['total'].max()} tokens")
    _fig.tight_layout()
    print(f"chunking off: largest step {without['total'].max()} tokens; the long prompt took "
          f"{without['long_prefill_steps']} step(s); decoders' worst inter-token latency "
          f"{1000 * without['max_decode_itl_s']:.0f} ms (median "
          f"{1000 * without['median_decode_itl_s']:.0f} ms); long prompt TTFT "
          f"{1000 * without['long_ttft_s']:.0f} ms; decodes left out of a step: "
          f"{without['blocked_decode_steps']} step(s)")
    _fig
    return


@app.cell
def _(mo, without):
    mo.md(f"""
    The decoders were not skipped: this scheduler always serves running requests first, so
    they got a token in every step (steps with a decode left out:
    **{without['blocked_decode_steps']}**). But one of their steps carried the whole
    prompt, and a step ends when its slowest part ends. Their median gap between tokens was
    **{1000 * without['median_decode_itl_s']:.0f} ms**; the worst gap, the step that
    prefilled the long prompt, was **{1000 * without['max_decode_itl_s']:.0f} ms**. To a user
    watching a streamed answer, that is the stream freezing. With more or longer prompts
    arriving, it happens again and again.
    """)
    return


@app.cell
def _(BUDGET, mo):
    mo.md(f"""
    ## The mechanism, live: chunks under a budget of {BUDGET} tokens

    Same requests, the chunked engine. Every step first gives each decoding request its
    token, then spends what is left of the {BUDGET}-token budget on the next piece of the
    long prompt. Each piece writes its K and V into the paged cache; the next piece attends
    to them there, so no token is computed twice. The prompt's first output token comes
    from the step that computes its last piece.
    """)
    return


@app.cell
def _(
    BUDGET,
    LONG_PROMPT,
    NUM_DECODERS,
    draw_steps,
    expected_prefill_steps,
    mo,
    plt,
    run_budget,
    without,
):
    with_chunks = run_budget(BUDGET)
    _fig, _axes = plt.subplots(2, 2, figsize=(11, 4.8), sharex="col", sharey="row",
                               height_ratios=[3, 2])
    _top = 1300 * max(_r["step_s"][_r["long_chunks"] > 0].max() for _r in (without, with_chunks))
    draw_steps(_axes[:, 0], without, f"chunking off: one step of {without['total'].max()} "
               "tokens", _top)
    draw_steps(_axes[:, 1], with_chunks, f"chunking on: {with_chunks['long_prefill_steps']} "
               f"chunks, at most {with_chunks['total'].max()} tokens a step", _top)
    _fig.tight_layout()
    same_tokens = with_chunks["tokens"] == without["tokens"]
    predicted_chunks = expected_prefill_steps(LONG_PROMPT, BUDGET, NUM_DECODERS)
    _rows = "\n".join(
        f"| {_name} | {_r['total'].max()} | {_r['long_prefill_steps']} | "
        f"{_r['blocked_decode_steps']} | {1000 * _r['max_decode_itl_s']:.0f} ms | "
        f"{1000 * _r['median_decode_itl_s']:.0f} ms | {_r['long_ttft_steps']} steps, "
        f"{1000 * _r['long_ttft_s']:.0f} ms |"
        for _name, _r in (("off", without), (f"on, budget {BUDGET}", with_chunks)))
    for _name, _r in (("off", without), ("on", with_chunks)):
        print(f"chunking {_name:3s}: largest step {_r['total'].max():4d} tokens, long prompt "
              f"over {_r['long_prefill_steps']} step(s), decodes in those steps "
              f"{_r['decodes_during_long_prefill']}, worst decode gap "
              f"{1000 * _r['max_decode_itl_s']:.0f} ms, long TTFT {_r['long_ttft_steps']} "
              f"steps / {1000 * _r['long_ttft_s']:.0f} ms")
    print(f"predicted chunks: ceil({LONG_PROMPT} / ({BUDGET} - {NUM_DECODERS})) = "
          f"{predicted_chunks}; identical tokens: {same_tokens}")
    mo.vstack([_fig, mo.md(f"""
    | chunking | largest step (tokens) | steps for the long prompt | steps with a decode left out | worst decode gap | median decode gap | long prompt's first token |
    |---|---|---|---|---|---|---|
    {_rows}

    With a budget of {BUDGET} and {NUM_DECODERS} decodes per step, each step had
    {BUDGET - NUM_DECODERS} tokens left for the prompt: ceil({LONG_PROMPT} /
    {BUDGET - NUM_DECODERS}) = **{predicted_chunks}** chunks, exactly what the engine did.
    Every step stayed within the budget, and every one of them carried the decoders' tokens
    too (decode tokens in the prompt's steps: {with_chunks['decodes_during_long_prefill']}).
    The output tokens are identical either way ({same_tokens}): chunking changes when work
    is done, not what is computed.
    """)])
    return predicted_chunks, same_tokens, with_chunks


@app.cell
def _(mo):
    mo.md(r"""
    Does a chunk ride along with the decodes for free? Lesson 01's roofline answers it: a
    step below the ridge waits on reading the weights and has idle arithmetic to spare; a
    step above it pays for every token. On a GPU the ridge is high (near 300 FLOP/byte in
    bf16 on an H100, from its data sheet) and a step stays memory-bound up to a few hundred
    tokens, so a chunk of that size fills arithmetic the decodes leave idle. On this CPU the
    ridge is low, the knee comes within the first few dozen tokens, and every chunk below is past
    it: step time grows with the tokens in the step almost in proportion (the right-hand
    plot in the next section, and the roofline after it), so here chunking buys smoothness,
    not throughput.
    """)
    return


@app.cell
def _(BUDGET, MAX_MODEL_LEN, mo):
    budget = mo.ui.slider(steps=[64, 128, 256, 512, MAX_MODEL_LEN], value=BUDGET,
                          show_value=True, label="max_num_batched_tokens")
    # Headless, the right answers are filled in so that the checker's verdict is tested below.
    _headless = mo.app_meta().mode == "script" or "headless" in mo.cli_args()
    _ways = ["falls", "stays the same", "rises"]
    ttft_guess = mo.ui.dropdown(_ways, value="falls" if _headless else None,
                                label="long prompt's steps to first token")
    gap_guess = mo.ui.dropdown(_ways, value="rises" if _headless else None,
                               label="largest step the decoders wait for")
    mo.md(f"""
    ### Try it: pick the budget

    The budget sets the largest chunk. Before you move the slider, guess which way each
    number moves as the budget grows: the long prompt's time to first token (in steps), and
    the decoders' worst gap between tokens, set by the largest step they wait for (in
    tokens). Is there a budget that is best for both? The engine's counts decide, under the
    sweep below. Each new value runs the scenario on the chunked engine (a few seconds on a
    CPU).

    {ttft_guess} {gap_guess}

    {budget}
    """)
    return budget, gap_guess, ttft_guess


@app.cell
def _(budget, draw_steps, mo, plt, run_budget):
    _r = run_budget(budget.value)
    _fig, _axes = plt.subplots(2, 1, figsize=(9, 4.2), sharex=True, height_ratios=[3, 2])
    draw_steps(_axes, _r, f"budget {budget.value}: {_r['long_prefill_steps']} chunk(s)")
    _fig.tight_layout()
    mo.vstack([_fig, mo.md(
        f"budget **{budget.value}**: long prompt's first token after "
        f"**{_r['long_ttft_steps']} steps / {1000 * _r['long_ttft_s']:.0f} ms**; decoders' "
        f"worst gap **{1000 * _r['max_decode_itl_s']:.0f} ms**, largest step "
        f"{_r['total'].max()} tokens; all requests done in {len(_r['total'])} steps, "
        f"{_r['wall_s']:.1f} s.")])
    return


@app.cell
def _(BUDGET, MAX_MODEL_LEN, mo, np, plt, run_budget, with_chunks, without):
    # A few budgets measured in every mode (the docs page and the headless run show these).
    _headless = mo.app_meta().mode == "script" or "headless" in mo.cli_args()
    SWEEP = (64, BUDGET, 256) if _headless else (64, BUDGET, 256, 512, MAX_MODEL_LEN)
    sweep = {_b: run_budget(_b) for _b in SWEEP}
    _fig, (_a, _b, _c) = plt.subplots(1, 3, figsize=(13, 3.4))
    _xs = [*SWEEP, MAX_MODEL_LEN] if MAX_MODEL_LEN not in SWEEP else list(SWEEP)
    _runs_at = {**sweep, MAX_MODEL_LEN: sweep.get(MAX_MODEL_LEN, without)}
    # Left: counted, so the same on every machine.
    _a.plot(_xs, [_runs_at[_x]["long_ttft_steps"] for _x in _xs], "o-", color="tab:orange")
    _a.set_ylabel("long prompt: steps to first token", color="tab:orange")
    _a2 = _a.twinx()
    _a2.plot(_xs, [_runs_at[_x]["total"].max() for _x in _xs], "s-", color="tab:blue")
    _a2.set_ylabel("largest step the decoders waited for, tokens", color="tab:blue",
                   fontsize=8)
    _a.set_title("counted (the rightmost point: chunking off)", fontsize=10)
    # Middle: measured on this machine, so noisy when others share it.
    _b.plot(_xs, [1000 * _runs_at[_x]["long_ttft_s"] for _x in _xs], "o-",
            color="tab:orange", label="long prompt: time to first token")
    _b.plot(_xs, [1000 * _runs_at[_x]["max_decode_itl_s"] for _x in _xs], "s-",
            color="tab:blue", label="decoders: worst gap between tokens")
    _b.set_ylabel("ms")
    _b.set_ylim(bottom=0)
    _b.legend(fontsize=7)
    _b.set_title("measured (RequestOutput.metrics)", fontsize=10)
    for _ax in (_a, _b):
        _ax.set_xscale("log", base=2)
        _ax.set_xlabel("max_num_batched_tokens")
    # Right: step time against tokens in the step. The fastest step seen for each token
    # count is the machine's cost for that much work; slower ones met other load.
    _runs = [*sweep.values(), without]
    _tok = np.concatenate([_r["total"] for _r in _runs])
    _ms = 1000 * np.concatenate([_r["step_s"] for _r in _runs])
    _c.scatter(_tok, _ms, s=8, alpha=0.4, label="every step")
    _sizes = np.unique(_tok)
    _fastest = np.array([_ms[_tok == _n].min() for _n in _sizes])
    _c.scatter(_sizes, _fastest, s=14, color="k", label="fastest at that size")
    _c.set_ylim(0, 1.5 * _fastest.max())
    _c.set_xlabel("tokens in the step")
    _c.set_ylabel("step time, ms")
    _c.legend(fontsize=7)
    _c.set_title("what one step costs on this device", fontsize=10)
    _fig.tight_layout()
    ms_per_token = float(np.polyfit(_sizes, _fastest, 1)[0]) if len(_sizes) > 1 else 0.0
    for _x in SWEEP:
        _r = sweep[_x]
        print(f"budget {_x:5d}: long prompt over {_r['long_prefill_steps']:2d} step(s), first "
              f"token after {_r['long_ttft_steps']:2d} steps / {1000 * _r['long_ttft_s']:6.0f} ms; "
              f"decoders' worst gap {1000 * _r['max_decode_itl_s']:5.0f} ms; largest step "
              f"{_r['total'].max()} tokens")
    print(f"step time grows by about {ms_per_token:.2f} ms per token in the step "
          f"(fastest step of each size, {len(_sizes)} sizes)")
    mo.vstack([_fig, mo.md(f"""
    Small budgets keep the steps that the decoders wait for small, but the long prompt needs
    more steps to finish, each of which also pays the fixed cost of reading all the weights,
    so its first token comes later. Large budgets serve the newcomer fastest and make
    everyone else wait. No budget is best for both: it is a latency policy. The counts on
    the left are exact; the milliseconds in the middle are what this machine measured, and
    on a shared machine a single slow step can distort them. On a GPU, where a chunk of a
    few hundred tokens rides along with the decodes almost for free, the sensible budget is
    much larger than on this device, where each token in a step costs about
    {ms_per_token:.2f} ms. (This lesson's default budget, {BUDGET}, took
    {with_chunks['long_prefill_steps']} chunks.)
    """)])
    return ms_per_token, sweep


@app.cell
def _(sweep):
    def check_budget_guess(ttft, gap):
        """The learner's directions as the budget grows, against the sweep's counts: the
        long prompt's steps to its first token, and the largest step the decoders waited for."""
        if ttft is None or gap is None:
            return "Pick both answers."
        small, large = min(sweep), max(sweep)

        def way(a, b):
            return "rises" if b > a else "falls" if b < a else "stays the same"

        truth = (way(sweep[small]["long_ttft_steps"], sweep[large]["long_ttft_steps"]),
                 way(sweep[small]["total"].max(), sweep[large]["total"].max()))
        counts = (f"from a budget of {small} to {large}, the long prompt's first token came "
                  f"after {sweep[small]['long_ttft_steps']} steps, then "
                  f"{sweep[large]['long_ttft_steps']}, and the largest step the decoders "
                  f"waited for held {sweep[small]['total'].max()} tokens, then "
                  f"{sweep[large]['total'].max()}")
        if (ttft, gap) == truth:
            return (f"Correct: {counts}. Bigger chunks finish the prompt in fewer steps, and "
                    "each is a step the decoders wait through: no budget is best for both.")
        wrong = "; ".join(f"{name} {right} (you said {guess})" for name, guess, right in
                          (("TTFT", ttft, truth[0]), ("the largest step", gap, truth[1]))
                          if guess != right)
        return f"{wrong[0].upper()}{wrong[1:]}. The engine's counts: {counts}."
    return (check_budget_guess,)


@app.cell
def _(check_budget_guess, gap_guess, mo, ttft_guess):
    _msg = check_budget_guess(ttft_guess.value, gap_guess.value)
    mo.callout(mo.md(f"Your prediction, as the budget grows: TTFT **{ttft_guess.value}**, "
                     f"largest step **{gap_guess.value}**. {_msg}"),
               kind="success" if _msg.startswith("Correct") else "neutral")
    return


@app.cell
def _(StepCost, llm, measure_peaks, mo, ms_per_token, sweep):
    # Lesson 01's cost model (minivllm/benchmarks/roofline.py), applied to a step of n tokens: it waits
    # on the weights (bytes / bandwidth) or on its arithmetic (FLOPs / peak), the larger.
    _on_gpu = llm.engine.device.type == "cuda"
    peaks = measure_peaks(llm.engine.device, llm.engine.dtype,
                          **(dict(n=8192, copy_mib=2048) if _on_gpu else {}))
    _cost = StepCost.of(llm.engine.model_config.hf_config, llm.engine.dtype)
    # The knee in tokens per step: where the step's FLOPs per byte reach the ridge.
    def _intensity(n):
        flops, moved = _cost.step([n], [n], 1)
        return flops / moved

    knee_tokens = next(_n for _n in range(1, 1 << 16) if _intensity(_n) >= peaks.ridge)
    # Above the knee each token adds its FLOPs: the roofline's ms per token.
    _f1, _f2 = (_cost.step([_n], [_n], 1)[0] for _n in (256, 257))
    roofline_ms_per_token = 1e3 * (_f2 - _f1) / peaks.flops
    smallest_chunk = min(sweep)
    print(f"roofline: ridge {peaks.ridge:.1f} FLOP/byte ({peaks.flops / 1e9:.1f} GFLOP/s, "
          f"{peaks.bandwidth / 1e9:.1f} GB/s), knee at {knee_tokens} tokens per step; "
          f"{roofline_ms_per_token:.2f} ms per token above it, measured {ms_per_token:.2f}")
    mo.md(f"""
    **The same roofline as lesson 01.** On this device a step reaches the ridge
    ({peaks.ridge:.1f} FLOP/byte, measured) at about **{knee_tokens} tokens**; the smallest
    budget above is {smallest_chunk}, so every chunk here is compute-bound and the roofline
    says each of its tokens costs at least {roofline_ms_per_token:.2f} ms at this device's
    peak matmul rate. The steps measured {ms_per_token:.2f} ms per token (the slope of the
    fastest steps), {ms_per_token / roofline_ms_per_token:.1f}x that bound: work the model
    leaves out (attention's softmax, norms, activations), matmuls smaller than the peak's,
    and on a shared machine other jobs. Either way step time grows with the tokens in the
    step, as a compute-bound step's must. Lesson 01's "step time
    nearly flat" is the other side of the same knee: decode steps of 1 to 8 tokens sit left
    of it. No GPU run of this lesson is recorded yet (docs/benchmarks.md), so the GPU side
    of this paragraph is the data sheet's, not a measurement.
    """)
    return knee_tokens, roofline_ms_per_token


@app.cell
def _(mo):
    mo.md(r"""
    ## Exercise: when does the long prompt speak?

    Four requests are decoding (each costs 1 token of budget per step, and they go first).
    Before step 5, a **400-token** prompt arrives. The budget is **100 tokens per step** and
    chunking is on. In which step is the long prompt's **first output token** sampled? The
    checker runs this scenario on the chunked engine.
    """)
    answer = mo.ui.number(start=0, stop=100, value=0, label="step of the first token")
    answer
    return (answer,)


@app.cell
def _(run, scenario):
    EX_PROMPT, EX_BUDGET, EX_ARRIVAL, EX_DECODERS = 400, 100, 5, 4
    _run = run(scenario(long_prompt=EX_PROMPT, decoders=EX_DECODERS, arrival=EX_ARRIVAL,
                        decode_tokens=16, prompt_len=12), EX_BUDGET)
    exercise_truth = _run["long_first_token_step"]
    exercise_chunks = [int(_c) for _c in _run["long_chunks"] if _c]

    def check_first_token_step(value):
        truth = exercise_truth
        if not value:
            return "Enter a step number."
        if value == truth:
            return (f"Correct: step {truth}. Chunks of {exercise_chunks} tokens in steps "
                    f"{EX_ARRIVAL} to {truth}; the step with the last chunk samples.")
        if value == EX_ARRIVAL + -(-EX_PROMPT // EX_BUDGET) - 1:
            return ("Not quite: the four decodes are scheduled first and take 4 tokens of "
                    "every step's budget, so each chunk is 96 tokens, not 100.")
        if value == truth + 1:
            return ("One step late: the step that computes the last chunk also samples the "
                    "first token (its logits come from the prompt's last position).")
        if value == truth - 1:
            return ("One step early: count the chunks. 400 tokens in chunks of 96 leave a "
                    "remainder that needs a step of its own.")
        if value < EX_ARRIVAL:
            return (f"The prompt arrives before step {EX_ARRIVAL}: count steps from there, "
                    "starting with that step.")
        return ("Not yet: the prompt gets (budget - decodes) tokens per step, starting in "
                f"step {EX_ARRIVAL}. How many such steps cover 400 tokens?")
    return EX_ARRIVAL, check_first_token_step, exercise_chunks, exercise_truth


@app.cell
def _(answer, check_first_token_step, mo):
    _msg = check_first_token_step(answer.value)
    mo.callout(mo.md(_msg), kind="success" if _msg.startswith("Correct") else "neutral")
    return


@app.cell
def _(
    BUDGET,
    EX_ARRIVAL,
    LONG_PROMPT,
    check_budget_guess,
    check_first_token_step,
    exercise_chunks,
    exercise_truth,
    gap_guess,
    knee_tokens,
    predicted_chunks,
    same_tokens,
    sweep,
    torch,
    ttft_guess,
    with_chunks,
    without,
):
    def test_the_roofline_knee_sits_where_the_page_says():
        # The knee (tokens where a step's FLOPs per byte reach the ridge measured on this
        # device). On a CPU it is below the smallest chunk: no idle arithmetic for a chunk to
        # fill. On a GPU it is above it: a chunk of that size rides along with the decodes.
        on_gpu = torch.cuda.is_available()
        assert knee_tokens > 1, knee_tokens
        assert (knee_tokens < min(sweep)) == (not on_gpu), (knee_tokens, min(sweep), on_gpu)

    def test_chunked_steps_stay_within_budget():
        assert with_chunks["total"].max() <= BUDGET
        for _b, _r in sweep.items():
            assert _r["total"].max() <= _b

    def test_decodes_continue_while_the_long_prompt_is_prefilled():
        assert with_chunks["long_prefill_steps"] == predicted_chunks > 1
        assert all(_d > 0 for _d in with_chunks["decodes_during_long_prefill"])
        assert with_chunks["blocked_decode_steps"] == 0

    def test_without_chunking_one_step_carries_the_whole_prompt():
        assert without["long_prefill_steps"] == 1
        assert without["long_chunks"].max() == LONG_PROMPT
        assert without["total"].max() > LONG_PROMPT

    def test_chunking_changes_timing_not_tokens():
        # Every prompt token computed exactly once: the chunks add up to the prompt (a
        # boundary that skipped a token's K/V can leave greedy tokens unchanged; not this).
        assert with_chunks["long_chunks"].sum() == LONG_PROMPT
        for _r in sweep.values():
            assert _r["long_chunks"].sum() == LONG_PROMPT
        assert same_tokens

    def test_smaller_budget_more_steps_to_first_token():
        _ttft = [sweep[_b]["long_ttft_steps"] for _b in sorted(sweep)]
        assert _ttft == sorted(_ttft, reverse=True) and _ttft[0] > _ttft[-1]

    def test_exercise_truth_and_checker():
        assert exercise_chunks == [96, 96, 96, 96, 16]
        assert exercise_truth == EX_ARRIVAL + 4 == 9
        assert check_first_token_step(9).startswith("Correct")
        assert "96" in check_first_token_step(8)
        assert "late" in check_first_token_step(10)

    def test_the_engine_checks_the_budget_guess():
        # The headless run answered "falls" and "rises"; the sweep's step and token counts
        # decide, and any other pair is turned down.
        assert check_budget_guess(ttft_guess.value, gap_guess.value).startswith("Correct")
        for _ttft in ("falls", "stays the same", "rises"):
            for _gap in ("falls", "stays the same", "rises"):
                if (_ttft, _gap) != (ttft_guess.value, gap_guess.value):
                    assert not check_budget_guess(_ttft, _gap).startswith("Correct")
        assert "TTFT falls (you said rises)" in check_budget_guess("rises", gap_guess.value)
    return


@app.cell
def _(BUDGET, knee_tokens, mo, predicted_chunks, sweep, with_chunks, without):
    findings = {
        "unchunked_largest_step_tokens": int(without["total"].max()),
        "chunked_largest_step_tokens": int(with_chunks["total"].max()),
        "chunked_long_prefill_steps": with_chunks["long_prefill_steps"],
        "predicted_chunks": predicted_chunks,
        "chunked_decodes_during_prefill": with_chunks["decodes_during_long_prefill"],
        "blocked_decode_steps": {"off": without["blocked_decode_steps"],
                                 "on": with_chunks["blocked_decode_steps"]},
        "worst_decode_gap_ms": {"off": 1000 * without["max_decode_itl_s"],
                                "on": 1000 * with_chunks["max_decode_itl_s"]},
        "long_ttft_ms": {"off": 1000 * without["long_ttft_s"],
                         "on": 1000 * with_chunks["long_ttft_s"]},
        "long_ttft_steps_by_budget": {str(_b): _r["long_ttft_steps"] for _b, _r in sweep.items()},
        "roofline_knee_tokens": knee_tokens,
    }
    print("findings:", findings)
    mo.md(f"""
    ## What we found

    * Without chunking, one step carried **{without['total'].max()}** tokens (the whole
      prompt plus the decodes), and the decoders' worst gap between tokens was
      **{1000 * without['max_decode_itl_s']:.0f} ms**.
    * With a budget of {BUDGET}, no step carried more than
      **{with_chunks['total'].max()}** tokens; the prompt took
      **{with_chunks['long_prefill_steps']}** chunks, and every one of those steps carried
      the decoders' tokens too. Their worst gap fell to
      **{1000 * with_chunks['max_decode_itl_s']:.0f} ms**.
    * The budget is a trade: smaller budgets mean smoother streams for requests already
      running and a later first token for the newcomer.

    Chunked or not, the scheduler admits a prompt once its blocks fit, and each request then
    takes one more block every 16 tokens it writes, blocks it never reserved. Next, lesson 11:
    what does the engine do when a running request needs one more block and none is free?

    ## Where the code lives

    * `minivllm/core/scheduler.py`: `Scheduler._run` (a sequence gets `min(uncomputed tokens,
      budget left)`), and in `Scheduler.schedule` the admission check that, with chunking
      off, refuses a prompt larger than the budget left.
    * `minivllm/core/request.py`: `num_computed_tokens` and `num_uncomputed_tokens`, the two
      numbers that make a partly prefilled prompt an ordinary state.
    * `minivllm/worker/model_runner.py`: `ModelRunner.run` samples only for sequences whose new
      tokens reach their end, so a middle chunk samples nothing.
    * `minivllm/config/scheduler.py`: `enable_chunked_prefill`, `max_num_batched_tokens`, and
      the check that without chunking the budget covers `max_model_len`.
    """)
    return (findings,)


@app.cell
def _(mo):
    mo.callout(mo.md(r"""
    **In vLLM V1** (as of vLLM 0.33). Open `vllm/v1/core/sched/scheduler.py`,
    `Scheduler.schedule`: one `token_budget` (`max_num_batched_tokens`) spent first on the
    running requests, each given `num_tokens_with_spec - num_computed_tokens` capped by what
    is left, then on waiting ones. A prefill is simply a request with many tokens still to
    compute, so chunking is no special mode: `enable_chunked_prefill` is on by default for
    models that support it. The one knob left in `vllm/config/scheduler.py` that shapes it is
    `long_prefill_token_threshold`: when set, it caps the tokens a long prompt may take in
    one step (and only when other requests are there to be starved), with
    `long_prefill_token_threshold_adaptive` to keep that cap at least a fair share of the
    budget. `max_num_partial_prefills`, which limited how many prompts could be mid-prefill
    at once, is gone from the config. minivllm's `Scheduler.schedule`
    (`minivllm/core/scheduler.py`) spends its budget by the same rule, running requests
    first, then waiting ones; it differs in marking each scheduled request as prefill or
    decode (`is_prefill` in the `SchedulerOutput`). V1's `SchedulerOutput` carries no such
    mark (its scheduler only notes on each `Request` whether it is in the middle of its
    prompt, `is_prefill_chunk`, to decide what to defer and whether drafts are worth
    proposing); minivllm needs the mark so that a page like this one can colour the steps and
    count the chunks.
    """), kind="info")
    return


if __name__ == "__main__":
    app.run()
