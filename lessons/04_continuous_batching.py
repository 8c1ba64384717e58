import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell
def _():
    import functools

    import marimo as mo
    import matplotlib.pyplot as plt
    import numpy as np
    import torch

    from minivllm import LLM, SamplingParams
    from minivllm.workloads import Request, serve, spread_requests
    return (LLM, Request, SamplingParams, functools, mo, np, plt, serve, spread_requests,
            torch)


@app.cell
def _(mo):
    mo.md(r"""
    # 04 · Continuous batching: a free slot is filled at the next step

    After this lesson you can explain why a batch that waits for its slowest request wastes
    the accelerator, predict step by step when a request finishes under static and under
    continuous (iteration-level) batching, and say which workloads gain the most from it.
    You will serve the same requests twice on the real engine, once with each policy, draw
    which request held which batch slot at every step, and measure slot utilization and
    throughput.

    *Terms: TTFT, ITL, E2E latency, throughput and goodput are defined once for the course,
    in seconds and in engine steps, on the Glossary page (docs/glossary.md).*
    """)
    return


@app.cell
def _(LLM, mo, torch):
    # One loaded model, two settings of one knob: `scheduling`, switched with
    # llm.reconfigure(scheduling=...) (a fresh KV pool, the same weights). MAX_NUM_SEQS batch
    # slots. Prefix caching is off so that a prompt served twice costs the same both times.
    # num_kv_blocks is given so that, on a GPU, the pool is not sized from free memory: a
    # budget of KV_BUDGET tokens, which is 2 slabs of max_model_len (the slab layout below).
    MAX_NUM_SEQS, MAX_MODEL_LEN, KV_BUDGET = 4, 512, 1024
    PAGED = dict(kv_layout="paged", num_kv_blocks=KV_BUDGET // 16)
    SLABS = dict(kv_layout="contiguous", num_kv_blocks=KV_BUDGET // MAX_MODEL_LEN)
    llm = LLM(max_model_len=MAX_MODEL_LEN, max_num_seqs=MAX_NUM_SEQS, block_size=16,
              enable_prefix_caching=False, **PAGED)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    mo.md(f"**running on:** {device} · **model:** SmolLM2-135M-Instruct "
          f"({str(llm.engine.dtype).removeprefix('torch.')}) · "
          f"**batch slots:** max_num_seqs = {MAX_NUM_SEQS}  \n`{llm.engine!r}`")
    return KV_BUDGET, MAX_MODEL_LEN, MAX_NUM_SEQS, PAGED, SLABS, device, llm


@app.cell
def _(mo):
    mo.md(r"""
    ## Two ways to fill a batch

    A decode step costs about the same for one sequence as for a handful (lesson 01: the
    weights are read once per step whatever the batch), so an engine wants every batch slot
    busy at every step. Requests, though, want different numbers of tokens: one answer is
    done after 5 tokens, the next needs 60.

    * **Static batching** takes up to `max_num_seqs` requests, runs them until *all* of them
      are done, and only then admits the next group. A request that finishes early leaves
      its slot empty until the slowest member of its batch is done.
    * **Continuous batching** (iteration-level scheduling, Orca, OSDI 2022) decides the batch
      again at every step: the step after a request finishes, a waiting request takes its
      slot. Its prompt is prefilled in the same forward pass as the others' decodes.

    In minivllm the two differ by one condition in `Scheduler.schedule`: with
    `scheduling="static"`, waiting requests are admitted only while nothing is running.
    """)
    return


@app.cell
def _(MAX_NUM_SEQS, PAGED, llm, mo, serve, spread_requests, torch):
    # A seeded request set (minivllm.benchmarks.workloads.spread_requests). Output lengths are
    # log-normal around MEAN_OUT tokens; `spread` is the sigma of the log, rescaled so that
    # every spread asks for (almost) the same number of tokens in total: only the mix
    # changes. EOS is ignored, so each request produces exactly its length and the schedule
    # is the same on every machine.
    NUM_REQUESTS = 24 if torch.cuda.is_available() else 12
    MEAN_OUT = 16 if torch.cuda.is_available() else 6

    def make_requests(spread, n=NUM_REQUESTS, mean_out=MEAN_OUT):
        """Short prompts (8 to 32 tokens), output lengths with `spread`."""
        return spread_requests(llm.tokenizer, n, mean_out, spread, prompt_range=(8, 32))

    def run(scheduling, requests, layout=PAGED, slots=MAX_NUM_SEQS):
        """Serve `requests`, all arriving at once, with `scheduling` over a KV `layout` and
        `slots` batch slots, and read the step trace: the batches (the requests scheduled in
        each step), the step in which each request finished (counted from 1), its tokens and
        the wall time."""
        print(f"serving {len(requests)} requests, {scheduling} batching, {slots} slots ...",
              flush=True)                       # progress: a line per run
        res = serve(llm.reconfigure(scheduling=scheduling, max_num_seqs=slots, **layout),
                    requests)
        batches = [sorted(int(x.request_id.removeprefix("req-")) for x in s.scheduled)
                   for s in res.steps]
        num_out = res.num_output_tokens
        return {"batches": batches, "finish_step": res.finish_step,
                "tokens": [o.outputs[0].token_ids for o in res.outputs],
                "seconds": res.elapsed, "steps": len(batches), "output_tokens": num_out,
                "slot_utilization": sum(map(len, batches)) / (len(batches) * slots),
                "tokens_per_step": num_out / len(batches),
                "tokens_per_s": res.output_throughput,
                "max_running": max(s.stats.num_running for s in res.steps),
                "peak_blocks": max(s.stats.num_blocks_used for s in res.steps),
                "out_lens": [r.params.max_tokens for r in requests]}

    for _mode in ("static", "continuous"):   # warm-up: first-step allocations, lazy imports
        run(_mode, make_requests(0.0, n=2, mean_out=4))
    _lens = [r.params.max_tokens for r in make_requests(1.0)]
    mo.md(f"{NUM_REQUESTS} requests, prompts of 8 to 32 tokens; output lengths at spread 1.0: "
          f"`{_lens}` (sum {sum(_lens)})")
    return MEAN_OUT, NUM_REQUESTS, make_requests, run


@app.cell
def _(functools, make_requests, run):
    @functools.cache
    def compare(spread):
        """Serve the request set with `spread` with each policy (cached per spread)."""
        requests = make_requests(spread)
        return run("static", requests), run("continuous", requests)

    DEFAULT_SPREAD = 1.0
    static_run, continuous_run = compare(DEFAULT_SPREAD)
    return DEFAULT_SPREAD, compare, continuous_run, static_run


@app.cell
def _(np, plt):
    def slot_lanes(batches, num_slots):
        """Give each request a batch slot: the lowest slot free when it enters the batch.
        Returns {request: (slot, first step, last step)} with steps counted from 1."""
        first, last = {}, {}
        for step, batch in enumerate(batches, 1):
            for r in batch:
                first.setdefault(r, step)
                last[r] = step
        free_from = [1] * num_slots                 # the first step each slot is free again
        lanes = {}
        for r in sorted(first, key=lambda r: (first[r], r)):
            slot = next(s for s in range(num_slots) if free_from[s] <= first[r])
            lanes[r] = (slot, first[r], last[r])
            free_from[slot] = last[r] + 1
        return lanes

    def draw_gantt(ax, run, num_slots, title, last_step=None):
        """Batch slots (rows) over engine steps: which request held each slot. Hatched: a
        slot that was empty while some request was still waiting to start."""
        lanes = slot_lanes(run["batches"], num_slots)
        steps = run["steps"]
        busy = np.zeros((num_slots, steps + 2), bool)
        colors = plt.get_cmap("tab20")
        for r, (slot, a, b) in lanes.items():
            busy[slot, a:b + 1] = True
            ax.broken_barh([(a - 0.5, b - a + 1)], (slot - 0.4, 0.8), color=colors(r % 20),
                           edgecolor="white", lw=0.5)
            if b - a >= 2:
                ax.text((a + b) / 2, slot, f"r{r}", ha="center", va="center", fontsize=7)
        starts = sorted(a for _, a, _ in lanes.values())
        for step in range(1, steps + 1):
            if starts[-1] > step:                  # someone is still waiting for a slot
                for slot in np.flatnonzero(~busy[:, step]):
                    ax.broken_barh([(step - 0.5, 1)], (slot - 0.4, 0.8), facecolor="none",
                                   edgecolor="tab:red", hatch="////", lw=0)
        ax.set_yticks(range(num_slots), [f"slot {s}" for s in range(num_slots)])
        ax.set_ylim(num_slots - 0.5, -0.5)
        ax.set_xlim(0.5, (last_step or steps) + 0.5)
        ax.set_title(title, fontsize=10)
        return lanes
    return (draw_gantt,)


@app.cell
def _(mo):
    mo.md(r"""
    ## The problem, measured: slots that wait for the slowest request

    With `scheduling="static"` the engine serves the request set below. Each row is one of the 4 batch slots,
    each bar a request (its prefill step, which also samples its first token, then one step
    per further token). Red hatching marks a slot that sat empty *while a request was
    waiting in the queue*: the step cost the same, that seat produced nothing.
    """)
    return


@app.cell
def _(MAX_NUM_SEQS, draw_gantt, plt, static_run):
    _fig, _ax = plt.subplots(figsize=(10, 2.6))
    draw_gantt(_ax, static_run, MAX_NUM_SEQS,
               f"static batching: {static_run['steps']} steps, "
               f"{static_run['slot_utilization']:.0%} of slot-steps busy")
    _ax.set_xlabel("engine step")
    _fig.tight_layout()
    print(f"static: {static_run['steps']} steps, slot utilization "
          f"{static_run['slot_utilization']:.1%}, {static_run['tokens_per_step']:.2f} output "
          f"tokens/step, {static_run['tokens_per_s']:.1f} tokens/s")
    _fig
    return


@app.cell
def _(mo):
    mo.md(r"""
    ## The mechanism, live: re-decide the batch at every step

    Same requests, same 4 slots, same model, `scheduling="continuous"`. Whenever a bar ends, the
    next waiting request starts in that slot at the very next step. Its prefill rides in the
    same forward pass as the other slots' decodes (lesson 10 looks at that mix closely).
    """)
    return


@app.cell
def _(MAX_NUM_SEQS, continuous_run, draw_gantt, mo, plt, static_run):
    _fig, (_a, _b) = plt.subplots(2, 1, figsize=(10, 5), sharex=True)
    _last = max(static_run["steps"], continuous_run["steps"])
    draw_gantt(_a, static_run, MAX_NUM_SEQS,
               f"static: {static_run['steps']} steps, "
               f"{static_run['slot_utilization']:.0%} slot utilization", _last)
    draw_gantt(_b, continuous_run, MAX_NUM_SEQS,
               f"continuous: {continuous_run['steps']} steps, "
               f"{continuous_run['slot_utilization']:.0%} slot utilization", _last)
    _b.set_xlabel("engine step")
    _fig.tight_layout()
    same_tokens = static_run["tokens"] == continuous_run["tokens"]
    step_ratio = static_run["steps"] / continuous_run["steps"]
    _rows = "\n".join(
        f"| {_name} | {_r['steps']} | {_r['slot_utilization']:.1%} | "
        f"{_r['tokens_per_step']:.2f} | {_r['tokens_per_s']:.1f} | {_r['seconds']:.1f} s |"
        for _name, _r in (("static", static_run), ("continuous", continuous_run)))
    for _name, _r in (("static", static_run), ("continuous", continuous_run)):
        print(f"{_name:10s}: {_r['steps']:3d} steps, slot utilization "
              f"{_r['slot_utilization']:.1%}, {_r['tokens_per_step']:.2f} tokens/step, "
              f"{_r['tokens_per_s']:.1f} tokens/s ({_r['seconds']:.1f} s)")
    print(f"continuous needs {step_ratio:.2f}x fewer steps; identical tokens: {same_tokens}")
    mo.vstack([_fig, mo.md(f"""
    | schedule | steps | slot utilization | output tokens / step | output tokens / s | wall |
    |---|---|---|---|---|---|
    {_rows}

    Both engines produced the same {static_run['output_tokens']} tokens (greedy, identical
    per request: {same_tokens}); continuous batching needed **{step_ratio:.2f}x** fewer
    steps. Steps are the honest unit here: tokens per step do not depend on how busy this
    machine is; tokens per second do, and on a shared CPU they are noisy.
    """)])
    return same_tokens, step_ratio


@app.cell
def _(continuous_run, mo, static_run):
    mo.md(f"""
    Slot utilization is busy slot-steps divided by steps x `max_num_seqs`. Static batching
    kept **{static_run['slot_utilization']:.0%}** of its slots busy: each group of 4 lasted
    as long as its longest member. Continuous batching kept
    **{continuous_run['slot_utilization']:.0%}** busy; its only idle slots are at the very
    end, when the queue is empty and the last long requests finish alone. Nothing wasted
    compute in either case (every step computed real tokens); static batching wasted
    *capacity*: steps that could have carried 4 sequences carried 1 or 2.

    The series says continuous batching is impossible without paged KV memory. That is
    stronger than what the engine shows: the scheduler only has to run every step (it does:
    `EngineCore.step` calls `Scheduler.schedule` each time), and a slab freed by a finished
    request can be handed to a newcomer just as a freed block can. What paging changes is
    how many requests fit in the memory. The 2x2 below measures it on the same requests and
    the same KV budget.
    """)
    return


@app.cell
def _(DEFAULT_SPREAD, KV_BUDGET, MAX_MODEL_LEN, SLABS, continuous_run, make_requests, mo,
      run, static_run):
    # Same requests, same bytes of KV: 2 slabs of max_model_len, or 64 blocks of 16 tokens.
    _requests = make_requests(DEFAULT_SPREAD)
    grid = {("slab", "static"): run("static", _requests, SLABS),
            ("slab", "continuous"): run("continuous", _requests, SLABS),
            ("paged", "static"): static_run, ("paged", "continuous"): continuous_run}
    for (_lay, _sch), _r in grid.items():
        print(f"{_lay:5s} x {_sch:10s}: {_r['steps']:3d} steps, at most {_r['max_running']} "
              f"running, {_r['tokens_per_step']:.2f} tokens/step, {_r['tokens_per_s']:.1f} "
              f"tokens/s ({_r['seconds']:.1f} s)")
    _rows = "\n".join(
        f"| {_name} | " + " | ".join(
            f"{grid[_lay, _sch]['steps']} steps, {grid[_lay, _sch]['tokens_per_step']:.2f} "
            f"tok/step, {grid[_lay, _sch]['max_running']} at once"
            for _sch in ("static", "continuous")) + " |"
        for _lay, _name in (("slab", f"slab of {MAX_MODEL_LEN} per request"),
                            ("paged", "paged, 16-token blocks")))
    mo.md(f"""
    | KV budget {KV_BUDGET} tokens | static | continuous |
    |---|---|---|
    {_rows}

    Continuous batching helps on slabs too (fewer steps than static on the same slabs), so it
    is not *impossible* without pages. But the slabs cap the batch at
    {grid[("slab", "continuous")]["max_running"]} requests, because each reserves
    {MAX_MODEL_LEN} tokens for requests that use a few dozen; with pages the same bytes held
    all {grid[("paged", "continuous")]["max_running"]} slots and the pool never had more than
    {grid[("paged", "continuous")]["peak_blocks"]} of its {KV_BUDGET // 16} blocks in use. The
    two mechanisms multiply: the bottom-right cell is the only one that is both wide and
    refilled every step.
    """)
    return (grid,)


@app.cell
def _(DEFAULT_SPREAD, mo):
    spread = mo.ui.slider(0.0, 1.5, step=0.25, value=DEFAULT_SPREAD, show_value=True,
                          label="spread of output lengths (sigma of the log)")
    # Headless, the right answer is filled in so that the checker's verdict is tested below.
    _headless = mo.app_meta().mode == "script" or "headless" in mo.cli_args()
    ratio_guess = mo.ui.number(start=0, stop=10, step=0.05, value=1.0 if _headless else 0,
                               label="steps at spread 0, static / continuous")
    mo.md(f"""
    ### Try it: when does continuous batching win nothing?

    The slider sets how different the requests' output lengths are, at a fixed total. Before
    moving it, predict the ratio of steps (static / continuous) at spread 0, where every
    request asks for the same number of tokens, and write it here. Then slide to 0: the
    engine's step counts decide, below the chart. Each new value runs both policies (a few
    seconds on a CPU).

    {ratio_guess}

    {spread}
    """)
    return ratio_guess, spread


@app.cell
def _(MAX_NUM_SEQS, compare, draw_gantt, mo, plt, spread):
    _s, _c = compare(spread.value)
    _fig, (_a, _b) = plt.subplots(2, 1, figsize=(10, 4.6), sharex=True)
    _last = max(_s["steps"], _c["steps"])
    draw_gantt(_a, _s, MAX_NUM_SEQS, f"static: {_s['steps']} steps", _last)
    draw_gantt(_b, _c, MAX_NUM_SEQS, f"continuous: {_c['steps']} steps", _last)
    _b.set_xlabel("engine step")
    _fig.suptitle(f"spread {spread.value}: output lengths {_s['out_lens']}", fontsize=9)
    _fig.tight_layout()
    mo.vstack([_fig, mo.md(
        f"spread **{spread.value}**: static {_s['steps']} steps "
        f"({_s['slot_utilization']:.0%} of slots busy), continuous {_c['steps']} steps "
        f"({_c['slot_utilization']:.0%}): **{_s['steps'] / _c['steps']:.2f}x** fewer steps.")])
    return


@app.cell
def _(compare):
    def check_ratio_guess(value):
        """The learner's step ratio at spread 0 against the engine's two step counts."""
        if not value:
            return "Enter a ratio."
        static, continuous = compare(0.0)
        ratio = static["steps"] / continuous["steps"]
        counts = (f"at spread 0 static batching took {static['steps']} steps and continuous "
                  f"{continuous['steps']}, a ratio of {ratio:.2f}")
        if abs(value - ratio) <= 0.05:
            return (f"Correct: {counts}. When every request wants the same number of tokens, "
                    "a batch's members all finish in the same step: no slot frees early, so "
                    "there is nothing to refill.")
        return (f"{'Too high' if value > ratio else 'Too low'}: {counts}. Continuous batching "
                "gains only when a slot frees before the rest of its batch is done.")
    return (check_ratio_guess,)


@app.cell
def _(check_ratio_guess, mo, ratio_guess):
    _msg = check_ratio_guess(ratio_guess.value)
    mo.callout(mo.md(f"Your prediction: **{ratio_guess.value:g}**. {_msg}"),
               kind="success" if _msg.startswith("Correct") else "neutral")
    return


@app.cell
def _(DEFAULT_SPREAD, compare, mo, plt):
    # A few spreads, measured in every mode (the headless run and the docs page show these);
    # more when a person is at the notebook.
    _headless = mo.app_meta().mode == "script" or "headless" in mo.cli_args()
    SWEEP = (0.0, 0.5, DEFAULT_SPREAD) if _headless else (0.0, 0.5, DEFAULT_SPREAD, 1.5)
    sweep = {_x: compare(_x) for _x in SWEEP}
    _fig, (_a, _b) = plt.subplots(1, 2, figsize=(9, 3))
    _a.plot(SWEEP, [sweep[_x][0]["steps"] for _x in SWEEP], "o-", color="tab:red",
            label="static")
    _a.plot(SWEEP, [sweep[_x][1]["steps"] for _x in SWEEP], "o-", color="tab:blue",
            label="continuous")
    _a.set_xlabel("spread of output lengths")
    _a.set_ylabel("engine steps")
    _a.set_ylim(bottom=0)
    _a.legend()
    _b.plot(SWEEP, [sweep[_x][0]["slot_utilization"] for _x in SWEEP], "o-", color="tab:red")
    _b.plot(SWEEP, [sweep[_x][1]["slot_utilization"] for _x in SWEEP], "o-", color="tab:blue")
    _b.set_xlabel("spread of output lengths")
    _b.set_ylabel("slot utilization")
    _b.set_ylim(0, 1.05)
    _fig.suptitle("same total tokens, more varied lengths")
    _fig.tight_layout()
    for _x in SWEEP:
        _s, _c = sweep[_x]
        print(f"spread {_x:4.2f}: static {_s['steps']:3d} steps ({_s['slot_utilization']:.0%} "
              f"busy), continuous {_c['steps']:3d} steps ({_c['slot_utilization']:.0%} busy), "
              f"ratio {_s['steps'] / _c['steps']:.2f}")
    mo.vstack([_fig, mo.md(r"""
    At spread 0 the two schedules are the same schedule: every member of a batch finishes at
    the same step, so there is never an empty slot to refill. The gain comes entirely from
    the variety of lengths, and real chat traffic is very varied (a one-word answer next to
    a page of code), which is why every serving engine batches continuously.
    """)])
    return (sweep,)


@app.cell
def _(DEFAULT_SPREAD, MAX_NUM_SEQS, compare, functools, make_requests, run):
    @functools.cache
    def compare_slots(slots):
        """Both policies on the default request set with `slots` batch slots (cached)."""
        if slots == MAX_NUM_SEQS:
            return compare(DEFAULT_SPREAD)
        _requests = make_requests(DEFAULT_SPREAD)
        return (run("static", _requests, slots=slots),
                run("continuous", _requests, slots=slots))
    return (compare_slots,)


@app.cell
def _(MAX_NUM_SEQS, mo):
    slots_pick = mo.ui.slider(steps=[1, 2, 4, 8], value=MAX_NUM_SEQS, show_value=True,
                              label="max_num_seqs (batch slots)")
    # Headless, the right answer is filled in so that the checker's verdict is tested below.
    _headless = mo.app_meta().mode == "script" or "headless" in mo.cli_args()
    slots_guess = mo.ui.dropdown(["rises", "stays about the same", "falls"],
                                 value="falls" if _headless else None,
                                 label=f"from {MAX_NUM_SEQS} to 8 slots, static's utilization")
    mo.md(f"""
    ### Try it: give static batching more slots

    More slots should help both policies. Before you move it, predict what happens to
    static batching's slot utilization at 8 slots: each batch now waits for the slowest of
    8 requests instead of 4. Pick your answer, then slide to 8: the engine's counts decide.
    Each new value runs both policies (several seconds on a CPU).

    {slots_guess}

    {slots_pick}
    """)
    return slots_guess, slots_pick


@app.cell
def _(compare_slots, draw_gantt, mo, plt, slots_pick):
    _n = slots_pick.value
    _s, _c = compare_slots(_n)
    _fig, (_a, _b) = plt.subplots(2, 1, figsize=(10, 1.6 + 0.5 * _n), sharex=True)
    _last = max(_s["steps"], _c["steps"])
    draw_gantt(_a, _s, _n, f"static, {_n} slots: {_s['steps']} steps, "
               f"{_s['slot_utilization']:.0%} of slot-steps busy", _last)
    draw_gantt(_b, _c, _n, f"continuous, {_n} slots: {_c['steps']} steps, "
               f"{_c['slot_utilization']:.0%} busy", _last)
    _b.set_xlabel("engine step")
    _fig.tight_layout()
    _idle = round((1 - _s["slot_utilization"]) * _s["steps"] * _n)
    mo.vstack([_fig, mo.md(
        f"**{_n} slots**: static wasted **{_idle}** slot-steps "
        f"({1 - _s['slot_utilization']:.0%}), continuous "
        f"{1 - _c['slot_utilization']:.0%}. The wider the static batch, the longer its fast "
        "members sit idle waiting for its slowest; continuous batching refills each slot "
        "as it frees.")])
    return


@app.cell
def _(MAX_NUM_SEQS, compare_slots):
    def check_slots_guess(choice):
        """The learner's direction for static batching's slot utilization, from 4 slots to
        8, against the engine's counts at both."""
        if choice is None:
            return "Pick an answer."
        narrow, wide = compare_slots(MAX_NUM_SEQS)[0], compare_slots(8)[0]
        # A change within 2 points counts as staying about the same.
        change = wide["slot_utilization"] - narrow["slot_utilization"]
        truth = ("rises" if change > 0.02 else "falls" if change < -0.02
                 else "stays about the same")
        counts = (f"Static batching kept {narrow['slot_utilization']:.0%} of {MAX_NUM_SEQS} "
                  f"slots busy over {narrow['steps']} steps, and {wide['slot_utilization']:.0%} "
                  f"of 8 over {wide['steps']}")
        why = (" A batch of 8 lasts as long as the slowest of 8, so more of its fast members "
               "sit idle, and for longer." if truth == "falls" else "")
        if choice == truth:
            return f"Correct: it {truth}. {counts}.{why}"
        return f"Not what the engine did: it {truth}. {counts}.{why}"
    return (check_slots_guess,)


@app.cell
def _(check_slots_guess, mo, slots_guess):
    _msg = check_slots_guess(slots_guess.value)
    mo.callout(mo.md(f"Your prediction: **{slots_guess.value}**. {_msg}"),
               kind="success" if _msg.startswith("Correct") else "neutral")
    return


@app.cell
def _(mo):
    mo.md(r"""
    ## Exercise: when does request F finish?

    Six requests arrive together at an engine with **4 batch slots** and a token budget of
    2048 per step (so every prompt is prefilled whole in the step that admits it, and that
    step also samples the request's first output token). EOS is ignored: each produces
    exactly its number of tokens. Steps are counted from 1.

    | request | A | B | C | D | E | F |
    |---|---|---|---|---|---|---|
    | prompt tokens | 12 | 30 | 8 | 20 | 15 | 10 |
    | output tokens | 6 | 2 | 9 | 3 | 4 | 5 |

    In which step does **F** produce its last token with continuous batching, and in which
    with static batching? Requests are admitted in the order A to F. The checker runs the
    scenario with both policies.
    """)
    answer_continuous = mo.ui.number(start=0, stop=100, value=0, label="continuous: F ends in step")
    answer_static = mo.ui.number(start=0, stop=100, value=0, label="static: F ends in step")
    mo.hstack([answer_continuous, answer_static], justify="start")
    return answer_continuous, answer_static


@app.cell
def _(Request, SamplingParams, llm, run):
    EXERCISE = [(12, 6), (30, 2), (8, 9), (20, 3), (15, 4), (10, 5)]   # (prompt, output)
    _ids = llm.tokenizer.encode("Predict the step in which the last request ends. " * 8)
    _requests = [Request(_ids[:_p], SamplingParams(temperature=0, max_tokens=_o,
                                                   ignore_eos=True)) for _p, _o in EXERCISE]
    exercise_truth = {_mode: run(_mode, _requests)["finish_step"][5]
                      for _mode in ("continuous", "static")}

    def check_finish_step(schedule, value):
        """Say whether `value` is the step in which F finishes under `schedule`."""
        truth, other = exercise_truth[schedule], exercise_truth[
            "static" if schedule == "continuous" else "continuous"]
        if not value:
            return f"{schedule}: enter a step number."
        if value == truth:
            return f"{schedule}: correct, step {truth}."
        if value == truth - 1:
            return (f"{schedule}: one step early. The step that prefills a prompt already "
                    "samples its first token, so a request with k output tokens occupies "
                    "exactly k consecutive steps, and the first step is step 1.")
        if value == truth + 1:
            return (f"{schedule}: one step late. The prefill step already produces the first "
                    "output token: do not add a separate step for the prompt.")
        if value == other:
            return (f"{schedule}: {value} is the answer for the other schedule. "
                    + ("Under continuous batching F takes the first slot that frees up."
                       if schedule == "continuous" else
                       "Under static batching F waits until all of A, B, C, D are done."))
        if schedule == "static":
            return ("static: not yet. The first batch is A, B, C, D; it lasts as long as its "
                    "longest member. E and F start together in the step after that.")
        return ("continuous: not yet. Walk the steps: write down the step in which each of "
                "A to D ends; a waiting request takes a freed slot in the very next step, "
                "E before F.")
    return check_finish_step, exercise_truth


@app.cell
def _(answer_continuous, answer_static, check_finish_step, mo):
    _msgs = [check_finish_step("continuous", answer_continuous.value),
             check_finish_step("static", answer_static.value)]
    mo.callout(mo.md("  \n".join(_msgs)),
               kind="success" if all("correct" in _m for _m in _msgs) else "neutral")
    return


@app.cell
def _(
    check_finish_step,
    check_ratio_guess,
    check_slots_guess,
    continuous_run,
    exercise_truth,
    grid,
    ratio_guess,
    same_tokens,
    slots_guess,
    static_run,
    sweep,
):
    def test_continuous_keeps_more_slots_busy():
        assert continuous_run["slot_utilization"] > static_run["slot_utilization"] + 0.1

    def test_continuous_takes_fewer_steps():
        assert continuous_run["steps"] < static_run["steps"]
        assert continuous_run["tokens_per_step"] > static_run["tokens_per_step"]

    def test_same_tokens_either_way():
        assert static_run["output_tokens"] == continuous_run["output_tokens"]
        assert same_tokens

    def test_no_gain_when_all_lengths_are_equal():
        _s, _c = sweep[0.0]
        assert _s["steps"] == _c["steps"]
        widest = max(sweep)
        assert sweep[widest][0]["steps"] > sweep[widest][1]["steps"]

    def test_two_by_two_continuous_helps_on_slabs_and_paging_widens_the_batch():
        slab_s, slab_c = grid[("slab", "static")], grid[("slab", "continuous")]
        assert slab_c["steps"] < slab_s["steps"]               # possible without pages
        assert slab_s["max_running"] == slab_c["max_running"] == 2
        assert grid[("paged", "continuous")]["max_running"] == 4
        assert grid[("paged", "continuous")]["steps"] < slab_c["steps"]
        assert grid[("paged", "continuous")]["peak_blocks"] <= 64
        assert slab_c["tokens"] == continuous_run["tokens"]    # same greedy tokens

    def test_exercise_truth_and_checker():
        assert exercise_truth == {"continuous": 8, "static": 14}
        assert "correct" in check_finish_step("continuous", 8)
        assert "correct" in check_finish_step("static", 14)
        assert "early" in check_finish_step("continuous", 7)
        assert "other schedule" in check_finish_step("continuous", 14)

    def test_the_engine_checks_the_slider_guesses():
        # The headless run answered a ratio of 1 at spread 0 and "falls" at 8 slots; the
        # engine's step and slot counts decide, and the other answers are turned down.
        assert check_ratio_guess(ratio_guess.value).startswith("Correct")
        for _wrong in (0.5, 1.5, 2.0):
            assert not check_ratio_guess(_wrong).startswith("Correct")
        assert check_slots_guess(slots_guess.value).startswith("Correct")
        for _wrong in ("rises", "stays about the same"):
            assert not check_slots_guess(_wrong).startswith("Correct")
    return


@app.cell
def _(mo):
    # Shown at the end, under "Where the code lives".
    v1_box = mo.callout(mo.md(r"""
    **In vLLM V1** (as of vLLM 0.33). `EngineCore.step` (`vllm/v1/engine/core.py`) calls
    `Scheduler.schedule` (`vllm/v1/core/sched/scheduler.py`), runs the model through the
    executor, and passes the result to `update_from_output`, which appends the tokens and frees
    finished requests' slots and blocks. The schedule is one token-level pass, running requests
    first, then waiting ones: each gets a number of new tokens (its `num_computed_tokens`
    catching up with its tokens) under one budget, `max_num_batched_tokens`, with at most
    `max_num_seqs` running (both in `SchedulerConfig`). There is no static mode and no prefill
    or decode phase. minivllm keeps V0's three queues with a pass each, easier to watch, and the
    one `scheduling="static"` line, so both policies share it.
    """), kind="info")
    return (v1_box,)


@app.cell
def _(continuous_run, grid, mo, static_run, step_ratio, sweep, v1_box):
    findings = {
        "two_by_two_steps": {f"{_l}/{_s}": _r["steps"] for (_l, _s), _r in grid.items()},
        "static_steps": static_run["steps"],
        "continuous_steps": continuous_run["steps"],
        "static_slot_utilization": static_run["slot_utilization"],
        "continuous_slot_utilization": continuous_run["slot_utilization"],
        "static_tokens_per_step": static_run["tokens_per_step"],
        "continuous_tokens_per_step": continuous_run["tokens_per_step"],
        "static_tokens_per_s": static_run["tokens_per_s"],
        "continuous_tokens_per_s": continuous_run["tokens_per_s"],
        "step_ratio_by_spread": {str(_x): _s["steps"] / _c["steps"]
                                 for _x, (_s, _c) in sweep.items()},
    }
    print("findings:", findings)
    mo.vstack([mo.md(f"""
    ## What we found

    * With 4 slots and varied output lengths, static batching kept
      **{static_run['slot_utilization']:.0%}** of its slot-steps busy, continuous batching
      **{continuous_run['slot_utilization']:.0%}**.
    * Continuous batching served the same requests, with identical tokens, in
      **{step_ratio:.2f}x** fewer steps: {continuous_run['tokens_per_step']:.2f} output tokens
      per step against {static_run['tokens_per_step']:.2f}.
    * The gain is zero when all requests want the same length, and grows with the spread of
      lengths.
    * Continuous batching works on slabs too; paging is what lets the same KV bytes hold the
      whole batch: slab/continuous took {grid[("slab", "continuous")]["steps"]} steps,
      paged/continuous {grid[("paged", "continuous")]["steps"]}.

    ## Where the code lives

    * `minivllm/core/scheduler.py`: `Scheduler.schedule`, V1's two passes (running, then
      waiting); `minivllm/core/v0/scheduler.py`: V0's scheduler beside it (picked by
      `scheduling="static"`), whose `_schedule_waiting` holds the one line that makes static
      batching wait for an empty batch, after a third queue's pass (swapped) that is **vLLM
      V0's**; V1's scheduler is in the box below.
    * `minivllm/engine/core.py`: `EngineCore.step`, one scheduling decision and one forward pass per
      call; `minivllm/engine/llm_engine.py`: `LLMEngine.step` turns the core's outputs into a
      `RequestOutput` for every request that moved.
    * `minivllm/config/scheduler.py`: `max_num_seqs` (the slots) and `scheduling`.
    * Next: lesson 10 (chunked prefill) looks at what a newcomer's prompt costs the requests
      already decoding; lesson 11 at what happens when their memory runs out.
    """), v1_box])
    return (findings,)


if __name__ == "__main__":
    app.run()
