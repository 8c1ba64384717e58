import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell
def _():
    import marimo as mo
    import matplotlib.pyplot as plt
    import numpy as np
    import torch

    from minivllm import LLM
    from minivllm.benchmarks.ablation import (PAIRS, RUNGS, ablation_ladder, ablation_workload,
                                              part_two_pairs)
    from minivllm.workloads import lognormal_requests, poisson_arrivals, serve
    return (LLM, PAIRS, RUNGS, ablation_ladder, ablation_workload, lognormal_requests, mo, np,
            part_two_pairs, plt, poisson_arrivals, serve, torch)


@app.cell
def _(mo):
    mo.md(r"""
    # 19 · Capstone: tune the engine to meet a latency SLO

    After this lesson you can state a serving target the way operators do (a service-level
    objective on time to first token and on inter-token latency), measure *goodput*, the
    share of requests that met it, and tune the four knobs of Part I (`max_num_seqs`, the
    token budget `max_num_batched_tokens`, `block_size` and the KV pool `num_kv_blocks`)
    until the engine meets it under open-loop arrivals.

    **The terms, as the whole course uses them** (the site's Glossary page,
    docs/glossary.md, defines each once, in seconds and in engine steps). For one request:

    * **TTFT**, time to first token: from its arrival to its first output token (queueing
      plus prefill). In steps, `ServeResult.ttft_steps`: the steps it was present for, up
      to and including the one that sampled its first token.
    * **ITL**, inter-token latency: the gap between two consecutive output tokens of the
      same request (one step, unless it was preempted or left out of a step; a step's
      seconds grow with its tokens).
    * **E2E**, end-to-end latency: from arrival to its last token.
    * **Goodput**: the requests that met every SLO, here as a share of the workload (per
      second in vLLM's `bench serve`); a server that is fast on average but misses the SLO
      for a third of its requests has a goodput of two thirds, whatever its throughput.
    """)
    return


@app.cell
def _(LLM, mo, torch):
    # One loaded model; every configuration below is llm.reconfigure(**config) over it.
    llm = LLM(max_model_len=512, enable_prefix_caching=False, num_kv_blocks=128)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    mo.md(f"**running on:** {device} · **model:** SmolLM2-135M-Instruct "
          f"({str(llm.engine.dtype).removeprefix('torch.')})  \n`{llm.engine!r}`")
    return device, llm


@app.cell
def _(llm, lognormal_requests, mo, poisson_arrivals):
    # Open-loop Poisson arrivals, counted in engine steps (exponential gaps, mean
    # MEAN_GAP steps): a request arrives whether or not the engine has caught up, and the
    # run is the same on every machine. Lesson 06 does the same in seconds, over HTTP.
    NUM_REQUESTS, MEAN_GAP = 16, 1.5
    workload = poisson_arrivals(
        lognormal_requests(llm.tokenizer, NUM_REQUESTS, prompt=(4.0, 0.6, 16, 240),
                           output=(2.7, 0.5, 4, 32), seed=17),
        rate=1 / MEAN_GAP, seed=17, unit="steps")
    # The SLO, in engine steps and tokens so that it can be checked on any machine: the
    # first token within TTFT_SLO steps of arrival; between two tokens, one step (nobody
    # preempted) and never a step of more than ITL_SLO_TOKENS tokens (a step's time grows
    # with its tokens, lesson 10).
    TTFT_SLO, ITL_SLO_TOKENS = 6, 160
    mo.md(f"""
    **Workload**: {NUM_REQUESTS} requests, prompts of 16 to 240 tokens and 4 to 32 output
    tokens (log-normal), arriving on average every {MEAN_GAP} steps. **SLO**: TTFT at most
    **{TTFT_SLO} steps** after arrival; every ITL one step, in a step of at most
    **{ITL_SLO_TOKENS} tokens**. The seconds are shown too, for this machine.
    """)
    return ITL_SLO_TOKENS, TTFT_SLO, workload


@app.cell
def _(ITL_SLO_TOKENS, TTFT_SLO, llm, np, serve, workload):
    def measure(config):
        """Serve the workload with `config` (EngineArgs fields, as LLM takes them); per request its TTFT and
        worst ITL in steps (serve records the step of each token: ServeResult.ttft_steps,
        token_steps), the largest step it waited through, and whether it met the SLO."""
        res = serve(llm.reconfigure(**config), workload)
        step_tokens = [s.num_batched_tokens for s in res.steps]
        rows = []
        for ttft, steps in zip(res.ttft_steps, res.token_steps):
            itl = max(np.diff(steps), default=1)
            worst = max((step_tokens[j - 1] for j in steps[1:]), default=0)
            rows.append({"ttft_steps": ttft, "itl_steps": int(itl), "worst_step": worst,
                         "ok": ttft <= TTFT_SLO and itl == 1 and worst <= ITL_SLO_TOKENS})
        return {"rows": rows, "goodput": sum(r["ok"] for r in rows) / len(rows),
                # Requests that missed each part of the SLO (one request can miss several).
                "late": sum(r["ttft_steps"] > TTFT_SLO for r in rows),
                "stalled": sum(r["itl_steps"] > 1 for r in rows),
                "slow": sum(r["worst_step"] > ITL_SLO_TOKENS for r in rows),
                "steps": len(res.steps), "seconds": res.elapsed,
                "preemptions": res.steps[-1].stats.num_preemptions,
                "ttft_s": np.array(res.ttfts),
                "tokens": [o.outputs[0].token_ids for o in res.outputs]}

    def summary(name, m):
        _r = m["rows"]
        return (f"{name}: goodput {m['goodput']:.0%}, {m['steps']} steps, TTFT p90 "
                f"{np.percentile([x['ttft_steps'] for x in _r], 90):.0f} steps "
                f"({np.percentile(m['ttft_s'], 90):.2f} s), worst ITL "
                f"{max(x['itl_steps'] for x in _r)} step(s), largest step waited through "
                f"{max(x['worst_step'] for x in _r)} tokens, {m['preemptions']} preemptions")
    return measure, summary


@app.cell
def _(measure, summary):
    # The starting point: four slots, a large token budget, and a small pool (384 tokens of
    # KV) cut into big blocks. Each knob is set where it fails: the run below is checked
    # for a queue, for preemptions and for steps above the ITL SLO's token limit.
    START = dict(max_num_seqs=4, max_num_batched_tokens=512, block_size=64, num_kv_blocks=6)
    print("serving the workload with the starting configuration ...", flush=True)
    start = measure(START)
    print(summary("start", start))
    return START, start


@app.cell
def _(ITL_SLO_TOKENS, TTFT_SLO, np, plt, start):
    _fig, (_a, _b) = plt.subplots(1, 2, figsize=(10, 3))
    _ok = ["tab:green" if r["ok"] else "tab:red" for r in start["rows"]]
    _a.bar(range(len(_ok)), [r["ttft_steps"] for r in start["rows"]], color=_ok)
    _a.axhline(TTFT_SLO, color="k", ls="--", lw=1, label="TTFT SLO")
    _a.set_xlabel("request (arrival order)")
    _a.set_ylabel("TTFT, steps")
    _a.legend(fontsize=8)
    _b.bar(range(len(_ok)), [r["worst_step"] for r in start["rows"]], color=_ok)
    _b.axhline(ITL_SLO_TOKENS, color="k", ls="--", lw=1, label="ITL SLO (step tokens)")
    _b.set_xlabel("request (arrival order)")
    _b.set_ylabel("largest step between tokens")
    _b.legend(fontsize=8)
    _fig.suptitle(f"the starting configuration: goodput {start['goodput']:.0%} "
                  f"(green: met the SLO)", fontsize=10)
    _fig.tight_layout()
    _fig
    return


@app.cell
def _(START, measure, mo, start):
    # One knob at a time: the start with only that knob moved to a value that works.
    KNOB_FIXES = {"max_num_seqs": 16, "max_num_batched_tokens": 128, "num_kv_blocks": 64,
                  "block_size": 16}
    one_knob = {}
    for _k, _v in KNOB_FIXES.items():
        print(f"the start with {_k}={_v} ...", flush=True)
        # block_size keeps the pool's bytes: 6 blocks of 64 tokens are 24 blocks of 16.
        _cfg = {**START, _k: _v} if _k != "block_size" else {
            **START, "block_size": _v,
            "num_kv_blocks": START["num_kv_blocks"] * START["block_size"] // _v}
        one_knob[_k] = measure(_cfg)
    _rows = "\n    ".join(
        f"| {_n} | {_m['goodput']:.0%} | {_m['late']} | {_m['stalled']} | {_m['preemptions']} "
        f"| {_m['slow']} | {_m['steps']} |" for _n, _m in
        [("start", start)] + [(f"`{_k}={KNOB_FIXES[_k]}`", _m) for _k, _m in one_knob.items()])
    mo.md(f"""
    ### Each knob, one at a time

    | configuration | goodput | late (TTFT) | stalled (ITL > 1 step) | preemptions | in a step over the token limit | steps |
    |---|---|---|---|---|---|---|
    {_rows}

    Four slots cannot keep up with a request every 1.5 steps: the queue grows and TTFT with
    it (**{start['late']}** requests late). A 512-token budget lets one long prompt fill a
    step, and everyone decoding waits through it (**{start['slow']}** requests). The small
    pool preempts (**{start['preemptions']}** preemption(s), **{start['stalled']}**
    request(s) waiting more than a step between two tokens), and big blocks make it smaller
    than it looks: a request of 70 tokens holds two blocks of 64, 128 slots. Each row moves
    one knob: the budget (the chunk size of chunked prefill) removes the long steps
    ({one_knob['max_num_batched_tokens']['slow']} left), a larger pool or the same bytes in
    blocks of 16 remove the preemptions ({one_knob['num_kv_blocks']['preemptions']} and
    {one_knob['block_size']['preemptions']}), and more slots alone change nothing for the
    queue ({one_knob['max_num_seqs']['late']} late, {one_knob['max_num_seqs']['preemptions']}
    preemptions): six blocks of 64 cannot hold 16 requests, so slots need blocks with them.
    No knob alone meets the SLO.
    """)
    return KNOB_FIXES, one_knob


@app.cell
def _(mo):
    mo.md(r"""
    ## Exercise: meet the SLO

    Edit `my_config` (any EngineArgs fields, as LLM takes them; the four that matter here are already
    there) so that at least 90% of the requests meet the SLO. The checker serves the
    workload with it and says which part of the SLO failed, and for how many requests.
    """)
    return


@app.function
def my_config():
    """<- edit me: the engine settings you would deploy."""
    return dict(max_num_seqs=4, max_num_batched_tokens=512, block_size=64, num_kv_blocks=6)


@app.cell
def _(ITL_SLO_TOKENS, measure):
    def check_config(config, result=None):
        """(ok, message) for `config`, from one run of the workload."""
        m = result or measure(config)
        late, stalled, slow = m["late"], m["stalled"], m["slow"]
        if m["goodput"] >= 0.9:
            return True, m, f"Goodput {m['goodput']:.0%}: the SLO is met."
        notes = [f"Goodput {m['goodput']:.0%}, below 90%."]
        if late:
            notes.append(f"{late} requests missed the TTFT SLO: they queued; more slots "
                         "(max_num_seqs) or a budget that admits prompts faster.")
        if stalled:
            notes.append(f"{stalled} requests waited more than one step between tokens: "
                         f"preemption ({m['preemptions']}); give the pool more blocks, or "
                         "smaller blocks (less of each one left empty).")
        if slow:
            notes.append(f"{slow} requests decoded through a step of more than "
                         f"{ITL_SLO_TOKENS} tokens: lower max_num_batched_tokens (chunked "
                         "prefill splits the long prompts).")
        return False, m, " ".join(notes)
    return (check_config,)


@app.cell
def _(START, check_config, mo, start):
    _cfg = my_config()
    exercise_ok, _, exercise_message = check_config(_cfg, start if _cfg == START else None)
    print(f"exercise: {'solved' if exercise_ok else 'not yet'} - {exercise_message}")
    mo.callout(mo.md(exercise_message), kind="success" if exercise_ok else "warn")
    return


@app.cell
def _(check_config, start, summary):
    # A configuration that meets it (one of several): 16 slots (arrivals every 1.5 steps,
    # each request alive for about 15: some 10 at once), 128-token chunks, and a pool that
    # holds 16 typical requests several times over.
    SOLUTION = dict(max_num_seqs=16, max_num_batched_tokens=128, block_size=16,
                    num_kv_blocks=256)
    solution_ok, solved, _ = check_config(SOLUTION)
    start_ok = check_config(None, start)[0]
    print(summary("solution", solved))
    return SOLUTION, solution_ok, solved, start_ok


@app.cell
def _(mo):
    slots_pick = mo.ui.slider(steps=[1, 2, 4, 8, 16], value=16, show_value=True,
                              label="max_num_seqs, the rest of the solution kept")
    mo.md(f"""
    ### Try it: how few slots still meet the SLO?

    The solution with fewer slots. Find the value where the queue starts to break the
    TTFT SLO (each value serves the workload once, several seconds on a CPU).

    {slots_pick}
    """)
    return (slots_pick,)


@app.cell
def _(SOLUTION, measure, mo, slots_pick, solved, summary):
    _m = (solved if slots_pick.value == SOLUTION["max_num_seqs"]
          else measure({**SOLUTION, "max_num_seqs": slots_pick.value}))
    mo.callout(mo.md(summary(f"max_num_seqs {slots_pick.value}", _m)),
               kind="success" if _m["goodput"] >= 0.9 else "danger")
    return


@app.cell
def _(mo):
    mo.md(r"""
    ## The ablation ladder: what each Part I mechanism buys

    The series ranks serving optimizations by what they do for throughput. Here the ranking
    is tested on this engine instead of asserted: one small workload (4 requests behind a
    shared 32-token system prompt, greedy, all arriving at once) is served by the full
    engine, then once with each mechanism switched off, over the same weights and the same
    bytes of KV memory (two slabs of `max_model_len` = 128 tokens). One mechanism per rung:
    each row is measured against the row named in its `vs` column, which differs from it
    in that one mechanism. A slab per request cannot share a prefix, so "no paging" is
    measured against "no prefix caching", not against the full engine (which would switch
    two mechanisms off at once). Each rung must produce the same tokens: a mechanism changes
    when work is done, never what is computed. The counts are the same on every machine;
    the tokens/s are this machine's.
    (`uv run minivllm bench ablation` runs it at a larger size; the Optimization catalog
    page shows this table beside the series' ranking.)
    """)
    return


@app.cell
def _(RUNGS, ablation_ladder, ablation_workload, llm, plt):
    # The settings each rung changes (minivllm/benchmarks/ablation.py): paging off is one slab
    # of max_model_len per request; chunked prefill off needs a budget of a whole prompt.
    ladder_requests = ablation_workload(llm.tokenizer, 4, system_tokens=32,
                                        prompt=(3.0, 0.5, 8, 40), output=(2.3, 0.4, 4, 12))
    LADDER = dict(max_model_len=128, slabs=2, max_num_seqs=4, budget=48)
    print("the ablation ladder: the workload once per rung ...", flush=True)
    ladder = ablation_ladder(llm, ladder_requests, **LADDER)   # settings put back after
    _full = ladder["full engine"]
    print(f"{'rung':<24}{'vs':<19}{'steps':>6}{'prompt tok':>11}{'at once':>8}{'largest':>8}"
          f"{'tok/step':>9}{'tok/s':>7}  same tokens   settings changed")
    for _name, _r in ladder.items():
        print(f"{_name:<24}{_r['vs'] or '-':<19}{_r['steps']:6d}{_r['prefill_tokens']:11d}"
              f"{_r['max_running']:8d}{_r['largest_step']:8d}{_r['tokens_per_step']:9.2f}"
              f"{_r['tokens_per_s']:7.1f}  {str(_r['tokens'] == _full['tokens']):<12}  "
              f"{RUNGS[_name][1] or '-'}")
    _fig, (_a, _b) = plt.subplots(1, 2, figsize=(10, 2.8))
    _names = list(ladder)
    _colors = ["tab:green"] + ["tab:gray"] * (len(_names) - 1)
    _a.barh(_names, [ladder[n]["steps"] for n in _names], color=_colors)
    _a.set_xlabel("engine steps for the same tokens")
    _a.invert_yaxis()
    _b.barh(_names, [ladder[n]["prefill_tokens"] for n in _names], color=_colors)
    _b.set_xlabel("prompt tokens computed")
    _b.invert_yaxis()
    _b.set_yticklabels([])
    _fig.suptitle("the same workload with one mechanism switched off per row", fontsize=10)
    _fig.tight_layout()
    _fig
    return LADDER, ladder


@app.cell
def _(ladder, mo):
    _f, _x, _p = ladder["full engine"], ladder["no prefix caching"], ladder["no paging"]
    _c, _k = ladder["no continuous batching"], ladder["no chunked prefill"]
    mo.md(f"""
    Read each row against its `vs` row. Without **prefix caching** the system prompt is
    computed once for every request ({_x['prefill_tokens']} prompt tokens against
    {_f['prefill_tokens']}). Without **paging** as well, the same memory holds
    {_p['max_running']} requests instead of {_x['max_running']}: {_p['steps']} steps against
    {_x['steps']}, the prompt tokens unchanged ({_p['prefill_tokens']}), so paging alone
    is what the steps measure. Without **continuous batching** a new batch waits for the
    slowest of the last ({_c['steps']} steps against {_f['steps']}). Switching **chunked
    prefill** off costs no steps here: it lets a whole prompt into one step
    ({_k['largest_step']} tokens against a budget of 48), and everyone decoding waits through
    it: its price is inter-token latency (lesson 10), which throughput does not show.
    """)
    return


@app.cell
def _(mo):
    mo.md(r"""
    ## Part II on the ladder: each mechanism on the workload it is for

    Part II's mechanisms do nothing on the ladder's workload: speculation needs text it can
    guess, a quantized cache and swapping need a pool that is too small. So each is served
    on a small workload of its own (minivllm/benchmarks/ablation.py, `PAIRS`), off and then
    on, and the count it is meant to lower is compared: engine steps for **n-gram
    speculation** on a copy task (k = 4), engine steps for an **int8 KV cache** in a pool
    that holds 160 fp32 tokens, tokens computed for **swap instead of recompute** when the
    pool preempts. (The chunk size, the token budget per step, is one of the four knobs
    above.) CUDA graphs and tensor parallelism save no count on a CPU
    (lessons 14 and 15 count what they change); FlashAttention changes bytes, not steps
    (lesson 03); GQA is a choice of model (lesson 09).
    """)
    return


@app.cell
def _(PAIRS, llm, mo, part_two_pairs):
    print("Part II pairs: each workload with its mechanism off, then on ...", flush=True)
    pairs = part_two_pairs(llm)
    _names = {"steps": "engine steps", "computed_tokens": "tokens computed"}
    _rows = "\n    ".join(
        f"| {_n} | {_names[_r['count']]} | {_r['off'][_r['count']]} | {_r['on'][_r['count']]} "
        f"| {_r['saved']:.2f}x | {_r['off']['max_running']} → {_r['on']['max_running']} | "
        f"{_r['off']['preemptions']} → {_r['on']['preemptions']} | "
        f"{_r['off']['largest_step']} → {_r['on']['largest_step']} | "
        f"{'yes' if _r['same_tokens'] else 'no'} |" for _n, _r in pairs.items())
    mo.md(f"""
    | mechanism | count | off | on | off / on | at once | preemptions | largest step | same tokens |
    |---|---|---|---|---|---|---|---|---|
    {_rows}

    Speculation and swapping change when work is done, not what: the same tokens. The int8 cache stores every K and V with a rounding error, so a greedy token
    can flip at a near-tie (lesson 13 measures how often): it buys capacity with a little
    accuracy, the only row here that trades one for the other. Settings: {', '.join(
        f"{_n}: {PAIRS[_n][2]} → {PAIRS[_n][3]}" for _n in pairs)}.
    """)
    return (pairs,)


@app.cell
def _(ladder, mo, pairs):
    # The series' ranking by throughput impact (reference/lesson-series-outline.txt, the same
    # order as docs/course.yml's `ranking`): rank, technique.
    SERIES_RANK = {"PagedAttention": 1, "Continuous batching": 2, "FlashAttention": 3,
                   "GQA / MQA": 4, "Chunked prefill": 5, "Automatic prefix caching": 6,
                   "Quantization (weights and KV)": 7, "Speculative decoding": 8,
                   "Preemption": 9, "Tensor parallelism": 10, "CUDA graphs": 11,
                   "Prefill/decode disaggregation": 12, "Multi-LoRA": 13}
    # What switching each off multiplied, read from the ladder (against its `vs` row) and the
    # Part II pairs: the count each one is for.
    _l = lambda rung, key: ladder[rung][key] / ladder[ladder[rung]["vs"]][key]  # noqa: E731
    measured = {
        "PagedAttention": ("steps", _l("no paging", "steps")),
        "Continuous batching": ("steps", _l("no continuous batching", "steps")),
        "Chunked prefill": ("steps", _l("no chunked prefill", "steps")),
        "Automatic prefix caching": ("prompt tokens", _l("no prefix caching",
                                                         "prefill_tokens")),
        "Quantization (weights and KV)": ("steps", pairs["int8 KV cache"]["saved"]),
        "Speculative decoding": ("steps", pairs["n-gram speculation"]["saved"]),
        "Preemption": ("tokens computed", pairs["swap, not recompute"]["saved"]),
    }
    ranking_here = sorted(measured, key=lambda t: -measured[t][1])
    _series_order = sorted(measured, key=SERIES_RANK.get)
    # Why a CPU and these small workloads rank a technique differently from a GPU server.
    WHY = {
        "PagedAttention": "its gain is the memory slabs waste, set here by max_model_len "
        "128 and two slabs; on a GPU the series counts more sequences in the same HBM, "
        "which is the same effect at a larger scale",
        "Continuous batching": "4 requests of similar length leave a static batch little "
        "to wait for; on a GPU server with long-tailed outputs the waiting dominates",
        "Chunked prefill": "it is a latency mechanism: by steps it costs a little. On a GPU "
        "it fills decode steps (memory-bound) with prefill work (compute-bound), both "
        "saturated at once; on a CPU every step is compute-bound, so there is nothing to fill",
        "Automatic prefix caching": "the count is prompt tokens, and a prompt token costs "
        "compute on a CPU as on a GPU: where prompts share a long prefix it saves nearly "
        "all of it, which is why it climbs here",
        "Quantization (weights and KV)": "here it only adds capacity (more requests at once "
        "in a tight pool); on a GPU int8/fp8 also halves the bytes every decode step reads, "
        "a bandwidth gain that a step count does not show",
        "Speculative decoding": "a copy task is its best case; on a GPU a verification step "
        "of k + 1 tokens costs about one decode step (memory-bound), so steps saved are time "
        "saved; on this CPU a step's time grows with its tokens, so the steps overstate it",
        "Preemption": "it counts recomputation avoided when the pool is too small, a "
        "stability mechanism; on a GPU swap pays in PCIe copies that recomputation avoids",
    }
    disagree = [t for t in measured
                if ranking_here.index(t) != _series_order.index(t)]
    _rows = "\n    ".join(
        f"| {SERIES_RANK[t]} | {t} | {measured[t][0]} | **{measured[t][1]:.2f}x** | "
        f"{ranking_here.index(t) + 1} | {_series_order.index(t) + 1} |" for t in _series_order)
    mo.md(f"""
    ## The ranking, measured in counts, beside the series'

    Each technique's factor is its count with the mechanism off over its count with it on
    (above 1: it saves that much; below 1: it costs). Ranked by that factor, the seven
    measured here come out in this order; the last column is the order of the same seven
    in the series' ranking, whose rank by throughput impact on a GPU is the first.

    | series rank | technique | count | off / on | rank here | series rank among these |
    |---|---|---|---|---|---|
    {_rows}

    Where they disagree ({len(disagree)} of {len(measured)}), and why:

    {chr(10).join(f"    * **{t}** (here {ranking_here.index(t) + 1}, series "
                  f"{_series_order.index(t) + 1}): {WHY[t]}." for t in disagree)}

    The factors are counts on small workloads chosen to exercise each mechanism, not one
    server's traffic, so their order is not a verdict on which matters most in production:
    it says what each one saves where it applies, measured, next to the series' claim of
    what it does for throughput on a GPU. The six techniques not on this table (FlashAttention,
    GQA, tensor parallelism, CUDA graphs, disaggregation, multi-LoRA) change bytes, model
    shapes or hardware, which no step count on one CPU can rank; their lessons measure them.
    """)
    return SERIES_RANK, disagree, measured, ranking_here



@app.cell
def _(
    ITL_SLO_TOKENS,
    LADDER,
    SOLUTION,
    TTFT_SLO,
    ladder,
    measured,
    one_knob,
    pairs,
    ranking_here,
    solved,
    start,
):
    findings = {"start_goodput": start["goodput"], "solution_goodput": solved["goodput"],
                "start_steps": start["steps"], "solution_steps": solved["steps"],
                "start_preemptions": start["preemptions"], "solution": SOLUTION,
                "slo": {"ttft_steps": TTFT_SLO, "itl_step_tokens": ITL_SLO_TOKENS},
                # The ablation ladder, per rung (the Optimization catalog page shows it).
                "ablation": {_n: {"vs": _r["vs"], "steps": _r["steps"],
                                  "prefill_tokens": _r["prefill_tokens"],
                                  "tokens_per_step": _r["tokens_per_step"],
                                  "tokens_per_s": _r["tokens_per_s"],
                                  "largest_step": _r["largest_step"],
                                  "max_running": _r["max_running"],
                                  "same_tokens": _r["tokens"] == ladder["full engine"]["tokens"]}
                             for _n, _r in ladder.items()},
                "ablation_settings": LADDER,
                "start_failures": {"late": start["late"], "stalled": start["stalled"],
                                   "slow": start["slow"]},
                "one_knob_goodput": {_k: _m["goodput"] for _k, _m in one_knob.items()},
                "part_two": {_n: {"count": _r["count"], "off": _r["off"][_r["count"]],
                                  "on": _r["on"][_r["count"]], "same_tokens": _r["same_tokens"]}
                             for _n, _r in pairs.items()},
                "ranking_here": ranking_here,
                "factor_off_over_on": {_t: round(_v[1], 3) for _t, _v in measured.items()}}
    print("findings:", findings)
    return (findings,)


@app.cell
def _(
    KNOB_FIXES,
    START,
    findings,
    ladder,
    measured,
    one_knob,
    pairs,
    solution_ok,
    solved,
    start,
    start_ok,
):
    def test_start_misses_the_slo_and_the_solution_meets_it():
        assert not start_ok and start["goodput"] < 0.5
        assert solution_ok and solved["goodput"] >= 0.9

    def test_the_start_hits_every_knob():
        # A queue (slots), preemptions (pool, block size), and steps over the token limit
        # (budget), each counted, and each knob alone removes or shrinks its own failure.
        assert start["late"] > 0 and start["preemptions"] > 0 and start["slow"] > 0
        assert KNOB_FIXES.keys() == START.keys()
        assert one_knob["max_num_batched_tokens"]["slow"] == 0
        assert one_knob["num_kv_blocks"]["preemptions"] == 0
        assert one_knob["block_size"]["preemptions"] < start["preemptions"]
        # The queue needs slots and blocks together: no knob alone meets the SLO, the
        # solution (all four) leaves nobody late.
        assert all(_m["goodput"] < 0.9 for _m in one_knob.values())
        assert solved["late"] == 0 < start["late"]

    def test_tuning_changes_latency_not_tokens():
        assert start["tokens"] == solved["tokens"]
        assert solved["steps"] < start["steps"]

    def test_each_rung_of_the_ladder_changes_the_schedule_not_the_tokens():
        full, rungs = ladder["full engine"], findings["ablation"]
        assert all(r["same_tokens"] for r in rungs.values()) and len(full["tokens"]) == 4
        # One mechanism per rung: "no paging" differs from its vs row in the layout alone.
        assert all(r["vs"] in (None, "full engine") for n, r in rungs.items() if n != "no paging")
        assert rungs["no paging"]["vs"] == "no prefix caching"
        # Paging: two slabs hold two requests; the same bytes in blocks hold all four.
        _x = rungs["no prefix caching"]
        assert rungs["no paging"]["max_running"] == 2 < _x["max_running"] == 4
        assert rungs["no paging"]["steps"] > _x["steps"]
        assert rungs["no paging"]["prefill_tokens"] == _x["prefill_tokens"]
        # Continuous batching: a static batch waits for its slowest request.
        assert rungs["no continuous batching"]["steps"] > full["steps"]
        # Prefix caching: without it the shared system prompt is computed for every request.
        assert rungs["no prefix caching"]["prefill_tokens"] >= (
            full["prefill_tokens"] + 3 * 32)
        # Chunked prefill off: a whole prompt in one step, beyond the 48-token budget.
        assert full["largest_step"] <= 48 < rungs["no chunked prefill"]["largest_step"]
        assert rungs["no chunked prefill"]["steps"] <= full["steps"]

    def test_part_two_mechanisms_save_their_counts():
        _spec, _kv = pairs["n-gram speculation"], pairs["int8 KV cache"]
        _swap = pairs["swap, not recompute"]
        assert _spec["on"]["steps"] < _spec["off"]["steps"] and _spec["same_tokens"]
        assert _kv["on"]["max_running"] > _kv["off"]["max_running"]
        assert _kv["on"]["steps"] < _kv["off"]["steps"]
        assert _swap["off"]["preemptions"] > 0 and _swap["same_tokens"]
        assert _swap["on"]["computed_tokens"] < _swap["off"]["computed_tokens"]

    def test_ranking_from_counts():
        # Every technique saves its count where it applies, but chunked prefill, which
        # pays in steps for latency.
        assert len(measured) == 7
        assert all(v > 1 for t, (_, v) in measured.items() if t != "Chunked prefill")
        assert measured["Chunked prefill"][1] <= 1
    return


@app.cell
def _(mo):
    # Shown at the end, under "Where the code lives".
    v1_box = mo.callout(mo.md(r"""
    **In vLLM V1.** The knobs are fields of `EngineArgs` (`vllm/engine/arg_utils.py`), which builds
    the engine's config: `max_num_seqs`, `max_num_batched_tokens` and `enable_chunked_prefill` land
    in `SchedulerConfig` (`vllm/config/scheduler.py`); `block_size`, `enable_prefix_caching`,
    `kv_cache_dtype` and `gpu_memory_utilization` in `CacheConfig` (`vllm/config/cache.py`). The
    pool is no knob (`num_gpu_blocks_override` aside): vLLM fills the memory left after the weights.
    A deployment measures with `vllm bench serve` (`vllm/benchmarks/serve.py`), where
    `--goodput ttft:500 tpot:50` counts the requests that met every SLO, in milliseconds where this
    lesson counts steps, and tunes the same knobs, plus `tensor_parallel_size`, to its own traffic.
    """), kind="info")
    return (v1_box,)


@app.cell
def _(disagree, mo, pairs, ranking_here, solved, start, v1_box):
    mo.vstack([mo.md(f"""
    ## What we found

    * The starting configuration served everything, token for token the same as the tuned
      one, and met the SLO for only **{start['goodput']:.0%}** of the requests in
      {start['steps']} steps; the tuned one for **{solved['goodput']:.0%}** in
      {solved['steps']}.
    * Throughput alone would not have said so: goodput counts the requests a user would
      call served.
    * The starting configuration failed on every knob, counted: **{start['late']}**
      requests late (too few slots), **{start['preemptions']}** preemptions (a small pool in
      big blocks), **{start['slow']}** requests decoding through a step over the token limit
      (too large a budget). Moving one knob fixed its own failure and never the SLO.
    * On the ablation ladder every mechanism of Part I changed the schedule, never the
      tokens: paging and continuous batching saved steps, prefix caching saved prompt
      tokens, and chunked prefill saved no steps but kept every step within the budget.
    * Part II on its own workloads: n-gram speculation took
      **{pairs['n-gram speculation']['on']['steps']}** steps instead of
      {pairs['n-gram speculation']['off']['steps']} on a copy task; an int8 KV cache,
      **{pairs['int8 KV cache']['on']['steps']}** instead of
      {pairs['int8 KV cache']['off']['steps']} in a tight pool; swap computed
      **{pairs['swap, not recompute']['on']['computed_tokens']}** tokens instead of
      {pairs['swap, not recompute']['off']['computed_tokens']}.
    * Ranked by those counts: {', '.join(ranking_here)}. It disagrees with the series'
      order for {len(disagree)} of the {len(ranking_here)}, for the CPU-versus-GPU reasons
      given beside the table.

    ## Where the code lives

    * `minivllm/config/`: the four knobs and their checks; `minivllm/core/scheduler.py`: how
      they shape each step; `minivllm/benchmarks/workloads.py`: `serve`, arrivals by step or time,
      and the steps of each request's tokens (`ttft_steps`, `token_steps`).
    * `minivllm/benchmarks/ablation.py`: the ladder's rungs (`RUNGS`, each with the row it is
      measured against) and `ablation_ladder`; Part II's pairs (`PAIRS`, `part_two_pairs`).
    * Lesson 06 measures TTFT and ITL in seconds over HTTP (`minivllm bench serve`).
    """), v1_box])
    return


if __name__ == "__main__":
    app.run()
