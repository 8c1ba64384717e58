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
    from minivllm.benchmarks.ablation import RUNGS, ablation_ladder, ablation_workload
    from minivllm.workloads import lognormal_requests, poisson_arrivals, serve
    return (LLM, RUNGS, ablation_ladder, ablation_workload, lognormal_requests, mo, np, plt,
            poisson_arrivals, serve, torch)


@app.cell
def _(mo):
    mo.md(r"""
    # 17 · Capstone: tune the engine to meet a latency SLO

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
        """Serve the workload with `config` (EngineConfig fields); per request its TTFT and
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
    # The starting point: two slots, a large token budget and a small pool.
    START = dict(max_num_seqs=2, max_num_batched_tokens=512, block_size=16,
                 num_kv_blocks=24)
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
def _(mo):
    mo.md(r"""
    Two slots cannot keep up with a request every 1.5 steps: the queue grows and TTFT with
    it. A 512-token budget lets one long prompt fill a step, and everyone decoding waits
    through it. A small pool preempts. Each knob fixes one failure and can cause another:
    more slots need more KV blocks, a small budget slows the prompts down.

    ## Exercise: meet the SLO

    Edit `my_config` (any EngineConfig fields; the four that matter here are already
    there) so that at least 90% of the requests meet the SLO. The checker serves the
    workload with it and says which part of the SLO failed, and for how many requests.
    """)
    return


@app.function
def my_config():
    """<- edit me: the engine settings you would deploy."""
    return dict(max_num_seqs=2, max_num_batched_tokens=512, block_size=16, num_kv_blocks=24)


@app.cell
def _(ITL_SLO_TOKENS, TTFT_SLO, measure):
    def check_config(config, result=None):
        """(ok, message) for `config`, from one run of the workload."""
        m = result or measure(config)
        rows = m["rows"]
        late = sum(r["ttft_steps"] > TTFT_SLO for r in rows)
        stalled = sum(r["itl_steps"] > 1 for r in rows)
        slow = sum(r["worst_step"] > ITL_SLO_TOKENS for r in rows)
        if m["goodput"] >= 0.9:
            return True, m, f"Goodput {m['goodput']:.0%}: the SLO is met."
        notes = [f"Goodput {m['goodput']:.0%}, below 90%."]
        if late:
            notes.append(f"{late} requests missed the TTFT SLO: they queued; more slots "
                         "(max_num_seqs) or a budget that admits prompts faster.")
        if stalled:
            notes.append(f"{stalled} requests waited more than one step between tokens: "
                         f"preemption ({m['preemptions']}); give the pool more blocks.")
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
    bytes of KV memory (two slabs of `max_model_len` = 128 tokens). Each rung must produce
    the same tokens: a mechanism changes when work is done, never what is computed. The
    counts are the same on every machine; the tokens/s are this machine's.
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
    ladder = ablation_ladder(llm, ladder_requests, **LADDER)   # settings put back after
    _full = ladder["full engine"]
    print(f"{'rung':<24}{'steps':>6}{'prompt tok':>11}{'at once':>8}{'largest':>8}"
          f"{'tok/step':>9}{'tok/s':>7}  same tokens   settings")
    for _name, _r in ladder.items():
        print(f"{_name:<24}{_r['steps']:6d}{_r['prefill_tokens']:11d}{_r['max_running']:8d}"
              f"{_r['largest_step']:8d}{_r['tokens_per_step']:9.2f}{_r['tokens_per_s']:7.1f}"
              f"  {str(_r['tokens'] == _full['tokens']):<12}  {RUNGS[_name] or '-'}")
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
    _f, _p, _c, _k, _x = (ladder[n] for n in ladder)
    mo.md(f"""
    Read the rows against the full engine ({_f['steps']} steps, {_f['prefill_tokens']}
    prompt tokens computed): without **paging** the same memory holds
    {_p['max_running']} requests instead of {_f['max_running']}, and the shared prompt is
    computed again for each ({_p['steps']} steps); without **continuous batching** a new
    batch waits for the slowest of the last ({_c['steps']} steps); without **prefix
    caching** the system prompt is computed
    once for every request ({_x['prefill_tokens']} prompt tokens). Switching **chunked prefill**
    off costs no steps here: it lets a whole prompt into one step
    ({_k['largest_step']} tokens against a budget of 48), and everyone decoding waits through
    it: its price is inter-token latency (lesson 10), which throughput does not show.
    """)
    return


@app.cell
def _(ITL_SLO_TOKENS, LADDER, SOLUTION, TTFT_SLO, ladder, solved, start):
    findings = {"start_goodput": start["goodput"], "solution_goodput": solved["goodput"],
                "start_steps": start["steps"], "solution_steps": solved["steps"],
                "start_preemptions": start["preemptions"], "solution": SOLUTION,
                "slo": {"ttft_steps": TTFT_SLO, "itl_step_tokens": ITL_SLO_TOKENS},
                # The ablation ladder, per rung (the Optimization catalog page shows it).
                "ablation": {_n: {"steps": _r["steps"], "prefill_tokens": _r["prefill_tokens"],
                                  "tokens_per_step": _r["tokens_per_step"],
                                  "tokens_per_s": _r["tokens_per_s"],
                                  "largest_step": _r["largest_step"],
                                  "max_running": _r["max_running"],
                                  "same_tokens": _r["tokens"] == ladder["full engine"]["tokens"]}
                             for _n, _r in ladder.items()},
                "ablation_settings": LADDER}
    print("findings:", findings)
    return (findings,)


@app.cell
def _(findings, ladder, solution_ok, solved, start, start_ok):
    def test_start_misses_the_slo_and_the_solution_meets_it():
        assert not start_ok and start["goodput"] < 0.5
        assert solution_ok and solved["goodput"] >= 0.9

    def test_tuning_changes_latency_not_tokens():
        assert start["tokens"] == solved["tokens"]
        assert solved["steps"] < start["steps"]

    def test_each_rung_of_the_ladder_changes_the_schedule_not_the_tokens():
        full, rungs = ladder["full engine"], findings["ablation"]
        assert all(r["same_tokens"] for r in rungs.values()) and len(full["tokens"]) == 4
        # Paging: two slabs hold two requests; the same bytes in blocks hold all four.
        assert rungs["no paging"]["max_running"] == 2 < full["max_running"] == 4
        assert rungs["no paging"]["steps"] > full["steps"]
        # Continuous batching: a static batch waits for its slowest request.
        assert rungs["no continuous batching"]["steps"] > full["steps"]
        # Prefix caching: without it the shared system prompt is computed for every request.
        assert rungs["no prefix caching"]["prefill_tokens"] >= (
            full["prefill_tokens"] + 3 * 32)
        # Chunked prefill off: a whole prompt in one step, beyond the 48-token budget.
        assert full["largest_step"] <= 48 < rungs["no chunked prefill"]["largest_step"]
        assert rungs["no chunked prefill"]["steps"] <= full["steps"]
    return


@app.cell
def _(mo, solved, start):
    mo.md(f"""
    ## What we found

    * The starting configuration served everything, token for token the same as the tuned
      one, and met the SLO for only **{start['goodput']:.0%}** of the requests in
      {start['steps']} steps; the tuned one for **{solved['goodput']:.0%}** in
      {solved['steps']}.
    * Throughput alone would not have said so: goodput counts the requests a user would
      call served.
    * On the ablation ladder every mechanism of Part I changed the schedule, never the
      tokens: paging and continuous batching saved steps, prefix caching saved prompt
      tokens, and chunked prefill saved no steps but kept every step within the budget.

    ## Where the code lives

    * `minivllm/config.py`: the four knobs and their checks; `minivllm/core/scheduler.py`: how
      they shape each step; `minivllm/benchmarks/workloads.py`: `serve`, arrivals by step or time,
      and the steps of each request's tokens (`ttft_steps`, `token_steps`).
    * `minivllm/benchmarks/ablation.py`: the ladder's rungs (`RUNGS`) and `ablation_ladder`.
    * Lesson 06 measures TTFT and ITL in seconds over HTTP (`minivllm bench serve`).
    """)
    return


if __name__ == "__main__":
    app.run()
