import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell
def _():
    import collections
    import functools

    import marimo as mo
    import matplotlib.pyplot as plt
    import numpy as np
    import torch

    from minivllm import LLM, SamplingParams
    from minivllm.core.block_manager import cdiv
    from minivllm.core.kv_cache import kv_bytes_per_token
    from minivllm.workloads import Request, serve
    return (LLM, Request, SamplingParams, cdiv, collections, functools, kv_bytes_per_token,
            mo, np, plt, serve, torch)


@app.cell
def _(mo):
    mo.md(r"""
    # 11 · Preemption: when the KV pool runs out

    After this lesson you can say what an engine does when a running request needs one more
    KV block and none is free, compare its answers (recompute the evicted request's KV
    later; swap its blocks out to host memory and back, V0's way; or load them back from a
    CPU tier that already holds them, V1's way with KV offloading) in work and bytes, predict
    which request is evicted and when, and how much of it is computed again, and explain why tail latency climbs steeply once the block
    pool is smaller than the working set of the requests it serves. You will shrink the
    pool of the real engine step by step until preemption starts.

    Lesson 10's scheduler admitted new work every step, each request taking blocks for its
    prompt and none for the answer it had yet to write. Here the pool is shrunk until those
    answers no longer fit.

    *Terms: TTFT, ITL, E2E latency, throughput and goodput are defined once for the course,
    in seconds and in engine steps, on the Glossary page (docs/glossary.md).*
    """)
    return


@app.cell
def _(LLM, kv_bytes_per_token, mo, torch):
    # One loaded model. Every run below calls llm.reconfigure(preemption_mode=...,
    # num_kv_blocks=...) with its policy and pool size: a fresh pool over the same weights.
    # Prefix caching is off: with it on, a recomputed request would find its own old blocks
    # in the cache and skip part of the recompute.
    BLOCK_SIZE, SWAP_BLOCKS = 16, 96
    llm = LLM(max_model_len=256, block_size=BLOCK_SIZE, num_kv_blocks=128, max_num_seqs=16,
              enable_prefix_caching=False)
    _shape = llm.engine.model_config.hf_config
    block_bytes = kv_bytes_per_token(_shape, llm.engine.dtype) * BLOCK_SIZE
    TIER_GIB = SWAP_BLOCKS * block_bytes / 2**30     # the swap pool and the CPU tier alike
    llm.reconfigure(swap_space=TIER_GIB)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    mo.md(f"**running on:** {device} · **model:** SmolLM2-135M-Instruct "
          f"({str(llm.engine.dtype).removeprefix('torch.')}) · **KV block:** {BLOCK_SIZE} "
          f"tokens = {block_bytes:,} bytes · **swap space:** {SWAP_BLOCKS} blocks  \n"
          f"`{llm.engine!r}`")
    return BLOCK_SIZE, TIER_GIB, block_bytes, device, llm


@app.cell
def _(mo):
    mo.md(r"""
    ## Why an engine must be able to take memory back

    A paged engine admits a request when its *prompt* fits in free blocks (lesson 02). It
    cannot know how long the answer will be, so it does not reserve blocks for it; every
    16 tokens the request asks for one more block. Admitting optimistically is what keeps
    the batch large. The price: when many requests grow at once, a running request can need
    a block when none is free. Something running must then give its blocks back. That is
    **preemption**.

    minivllm follows vLLM's rule: the victim is the *newest* running request, so the oldest
    keep making progress and every request finishes eventually. The victim's blocks are
    released in one of two ways:

    * **recompute**: drop its K/V, keep its tokens, and put it back at the head of the
      queue. When it is admitted again its prompt *and* the tokens it had already generated
      are prefilled again: compute spent twice.
    * **swap**: copy its blocks to a pool in host memory and park it; before any new request
      is admitted, it is copied back. No compute is repeated, but every block crosses the
      host link twice (on a GPU, PCIe).

    vLLM's current engine (V1) preempts by recompute only; swap was an option of its
    earlier engine (V0), and the series still describes both. minivllm keeps swap
    (`preemption_mode="swap"`, in V0's scheduler, `minivllm/core/v0/`) so that the two can
    be measured side by side. V1's answer to swap is a third one, measured below: with KV
    offloading on (`kv_offloading_size`, GiB of host memory), every full block a step
    computes is also stored in a CPU tier, so a request preempted by recompute finds its
    blocks there when it comes back and loads them instead of computing them again.
    """)
    return


@app.cell
def _(BLOCK_SIZE, Request, SamplingParams, TIER_GIB, cdiv, collections, llm, np, serve, torch):
    # The request set: NUM_REQUESTS requests arrive together. EOS is ignored, so every run
    # generates the same number of tokens and can be compared token for token. Enough of
    # them that a tail percentile is not just the slowest request, short enough to sweep
    # many pools in a minute on a CPU.
    NUM_REQUESTS = 64 if torch.cuda.is_available() else 24
    _rng = np.random.default_rng(0)
    _text = llm.tokenizer.encode(
        "When memory runs out, somebody has to give some back. The scheduler picks the "
        "youngest running request, releases its blocks, and lets the older ones finish. " * 20)
    _prompt_lens = _rng.integers(16, 33, NUM_REQUESTS)
    _out_lens = _rng.integers(4, 17, NUM_REQUESTS)
    requests = [(_text[9 * i: 9 * i + int(p)], int(o))
                for i, (p, o) in enumerate(zip(_prompt_lens, _out_lens))]
    # The working set: blocks needed if every request ran at once, at its full length.
    saturation_blocks = sum(cdiv(len(p) + o, BLOCK_SIZE) for p, o in requests)
    largest_request_blocks = max(cdiv(len(p) + o, BLOCK_SIZE) for p, o in requests)

    def blocks_swapped_out(steps):
        """Blocks copied to the host pool: a request swapped out in a step takes with it the
        blocks holding every token it has computed so far (swap keeps them all)."""
        computed, moved = collections.Counter(), 0
        for s in steps:
            moved += sum(cdiv(computed[rid], BLOCK_SIZE) for rid in s.swapped_out)
            for x in s.scheduled:
                computed[x.request_id] += x.num_tokens
        return moved

    def run_set(reqs, mode, num_blocks):
        """Serve `reqs` [(prompt ids, max_tokens)], all arriving now, with preemption_mode
        `mode` ("offload": recompute, with the CPU tier on) and a pool of num_blocks, and
        read the step trace."""
        llm.reconfigure(preemption_mode="recompute" if mode == "offload" else mode,
                        num_kv_blocks=num_blocks,
                        kv_offloading_size=TIER_GIB if mode == "offload" else None)
        res = serve(llm, [Request(p, SamplingParams(temperature=0, max_tokens=o,
                                                    ignore_eos=True)) for p, o in reqs])
        e2e = np.array([o.metrics.e2e_latency for o in res.outputs])
        ttft = np.array([o.metrics.ttft for o in res.outputs])
        finish = np.array(res.finish_step)           # all arrived before step 1
        # Useful work: every prompt token, and every output token but the last (it is
        # sampled, never fed back). Anything scheduled beyond that was computed twice.
        useful = sum(len(p) + o - 1 for p, o in reqs)
        scheduled = sum(s.num_batched_tokens for s in res.steps)
        step_s = np.array([s.duration for s in res.steps])
        return {
            "pool": num_blocks, "mode": mode, "num_steps": len(res.steps),
            "steps": [{"preempted": [int(r.removeprefix("req-")) for r in s.preempted],
                       "running": s.stats.num_running, "waiting": s.stats.num_waiting,
                       "swapped": s.stats.num_swapped} for s in res.steps],
            "step_s": step_s, "wall_s": float(step_s.sum()),
            "preemptions": res.steps[-1].stats.num_preemptions,   # since reconfigure
            "peak_blocks": max(s.stats.num_blocks_used for s in res.steps),
            "swapped_out_blocks": blocks_swapped_out(res.steps),
            "loaded_blocks": res.steps[-1].stats.kv_offload_loaded_blocks,  # since reconfigure
            "stored_blocks": res.steps[-1].stats.kv_offload_stored_blocks,
            "trace": res.steps,
            "recomputed_tokens": scheduled - useful, "useful_tokens": useful,
            "tokens": [o.outputs[0].token_ids for o in res.outputs],
            "e2e_s": e2e, "ttft_s": ttft,
            "e2e_steps": finish,
            "p50_s": float(np.percentile(e2e, 50)), "p99_s": float(np.percentile(e2e, 99)),
            "p50_steps": float(np.percentile(finish, 50)),
            "p99_steps": float(np.percentile(finish, 99)),
            "p90_steps": float(np.percentile(finish, 90)),
            "p50_ttft_s": float(np.percentile(ttft, 50)),
            "p99_ttft_s": float(np.percentile(ttft, 99)),
        }
    return NUM_REQUESTS, largest_request_blocks, requests, run_set, saturation_blocks


@app.cell
def _(
    NUM_REQUESTS,
    functools,
    largest_request_blocks,
    mo,
    requests,
    run_set,
    saturation_blocks,
):
    for _mode in ("recompute", "swap"):     # warm-up: first-step allocations, lazy imports
        run_set([(_p, 2) for _p, _ in requests[:2]], _mode, 64)

    @functools.cache
    def run(mode, pool):
        """The request set on a pool of `pool` blocks with one policy (cached)."""
        return run_set(requests, mode, pool)

    # What the schedule holds at its peak when memory is no constraint (max_num_seqs still
    # is): the pool size below which something must wait or be evicted.
    UNCONSTRAINED = 128
    peak_demand = run("recompute", UNCONSTRAINED)["peak_blocks"]
    # A sweep from well below that peak to just above it, every 4 blocks headless (enough to
    # place the knee; CI runs every lesson), every 2 at the notebook; never below what the
    # largest request needs alone (the engine refuses one that could never fit).
    _every = 4 if mo.app_meta().mode == "script" or "headless" in mo.cli_args() else 2
    POOLS = sorted({max(largest_request_blocks + 1, _p)
                    for _p in range(peak_demand - 14, peak_demand + 3, _every)} | {UNCONSTRAINED})
    mo.md(f"""
    {NUM_REQUESTS} requests, prompts of 16 to 32 tokens, 4 to 16 output tokens each,
    all arriving at once, at most 16 running together (`max_num_seqs`). Run all at once at
    full length they would hold {saturation_blocks} blocks; with 16 at a time, the
    unconstrained schedule held at most **{peak_demand} blocks** at its peak: the peak
    concurrent block demand, measured on a pool of {UNCONSTRAINED}. The largest request
    alone needs {largest_request_blocks}. Pools measured below: {POOLS} blocks.
    """)
    return POOLS, peak_demand, run


@app.cell
def _(mo):
    mo.md(r"""
    ## The problem, measured: a pool smaller than the working set

    The recompute engine serves the same request set on pools of several sizes. Left: the
    end-to-end latency of the requests (arrival to last token), median and 99th percentile
    and 90th percentile. With 24 requests, p99 is an interpolation between the two slowest,
    so the 90th (two requests above it) is plotted; a p99 that means something needs a few
    hundred requests, more than a CPU serves in a minute. Right: how many preemptions
    happened and how many tokens had to be computed a second time.
    """)
    return


@app.cell
def _(POOLS, mo, np, plt, peak_demand, run):
    sweep = {_p: run("recompute", _p) for _p in POOLS}
    _fine = POOLS[:-1]                  # the sweep; POOLS[-1] is unconstrained
    _free = sweep[POOLS[-1]]
    # The knee: the smallest pool from which on nothing is preempted and the last request
    # finishes in the same step as on the unconstrained pool.
    knee = min(_p for _p in POOLS if all(sweep[_q]["num_steps"] == _free["num_steps"]
                                         and not sweep[_q]["preemptions"]
                                         for _q in POOLS if _q >= _p))
    _fig, (_a, _b, _c) = plt.subplots(1, 3, figsize=(12, 3.4))
    for _ax, _scale in ((_a, "s"), (_b, "steps")):
        if _scale == "steps":
            _ax.plot(_fine, [sweep[_p]["p90_steps"] for _p in _fine], "o-", color="tab:red",
                     label="p90")
        else:
            _ax.plot(_fine, [np.percentile(sweep[_p]["e2e_s"], 90) for _p in _fine], "o-",
                     color="tab:red", label="p90")
        _ax.plot(_fine, [sweep[_p][f"p50_{_scale}"] for _p in _fine], "o-",
                 color="tab:blue", label="p50")
        _ax.axvline(peak_demand, color="k", ls="--", lw=1, label="peak block demand")
        _ax.axvline(knee, color="tab:green", ls=":", lw=2, label="knee")
        _ax.set_xlabel("KV pool, blocks")
        _ax.set_ylim(bottom=0)
    _a.set_ylabel("end-to-end latency, s")
    _a.set_title("latency (RequestOutput.metrics)", fontsize=10)
    _a.legend(fontsize=7)
    _b.set_ylabel("end-to-end latency, engine steps")
    _b.set_title("the same in steps (no timing noise)", fontsize=10)
    _w = 0.8
    _c.bar(np.array(_fine) - _w / 2, [sweep[_p]["preemptions"] for _p in _fine], _w,
           color="tab:purple", label="preemptions")
    _c2 = _c.twinx()
    _c2.bar(np.array(_fine) + _w / 2, [sweep[_p]["recomputed_tokens"] for _p in _fine], _w,
            color="tab:orange", label="tokens computed twice")
    _c.axvline(peak_demand, color="k", ls="--", lw=1)
    _c.set_xlabel("KV pool, blocks")
    _c.set_ylabel("preemptions", color="tab:purple")
    _c2.set_ylabel("tokens computed twice", color="tab:orange")
    _c.set_title("the work preemption adds", fontsize=10)
    _fig.tight_layout()
    for _p in POOLS:
        _r = sweep[_p]
        print(f"pool {_p:3d} blocks: {_r['num_steps']:3d} steps, {_r['preemptions']:2d} "
              f"preemptions, {_r['recomputed_tokens']:4d} tokens recomputed, latency in steps"
              f" p50 {_r['p50_steps']:.0f} / p90 {_r['p90_steps']:.0f} / p99 "
              f"{_r['p99_steps']:.0f}, p99 {_r['p99_s']:5.2f} s, wall {_r['wall_s']:.1f} s")
    print(f"knee at {knee} blocks; peak concurrent block demand {peak_demand} blocks")
    _fig
    return knee, sweep


@app.cell
def _(POOLS, knee, mo, peak_demand, sweep):
    _small, _large = sweep[POOLS[0]], sweep[POOLS[-1]]
    mo.md(f"""
    From {knee} blocks up the pool size barely matters: nobody is preempted, nothing is
    computed twice, and the slowest request is done after
    {_large['num_steps']} steps, as on a pool of {POOLS[-1]}. That knee sits at
    **{knee}** blocks against a peak concurrent demand of **{peak_demand}**: the schedule
    needs its peak only for a step or two, and {"a few blocks less only delays an admission"
    if knee < peak_demand else "any block less costs"}. Below the knee, requests queue for
    blocks, the youngest running ones are evicted and their tokens computed again. At
    {POOLS[0]} blocks the p90 latency was
    **{_small['p90_steps'] / _large['p90_steps']:.1f}x** that of the unconstrained pool in
    steps ({_small['p99_s'] / _large['p99_s']:.1f}x for p99 in seconds on this loaded
    machine), the median **{_small['p50_steps'] / _large['p50_steps']:.1f}x**, with
    {_small['preemptions']} preemptions and {_small['recomputed_tokens']} tokens computed
    twice. That is the cliff a server sees in its tail latency when it runs near its pool's
    saturation point.
    """)
    return


@app.cell
def _(mo):
    mo.md(r"""
    ## The mechanism, live: who is evicted, and what it costs

    The timeline below shows, for one pool size, how many requests were running, waiting and
    swapped out after each scheduling decision, with a mark at every preemption. Top:
    recompute. Bottom: swap, on the same pool. A recomputed request goes back to *waiting*
    and must prefill everything again; a swapped one waits in *swapped* with its K/V intact
    in host memory and comes back ahead of any new request.
    """)
    return


@app.cell
def _(plt):
    def draw_timeline(ax, r, title):
        x = range(1, r["num_steps"] + 1)
        for key, color in (("running", "tab:green"), ("waiting", "tab:orange"),
                           ("swapped", "tab:purple")):
            ax.step(x, [s[key] for s in r["steps"]], where="mid", color=color, label=key)
        hits = [(i + 1, len(s["preempted"])) for i, s in enumerate(r["steps"]) if s["preempted"]]
        if hits:
            ax.scatter([h for h, _ in hits], [-0.4] * len(hits), marker="^", color="tab:red",
                       s=[18 * n for _, n in hits], label="preemption", zorder=3)
        ax.set_ylabel("requests")
        ax.set_ylim(bottom=-0.9)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7, loc="upper right", ncol=4)
    return (draw_timeline,)


@app.cell
def _(POOLS, mo, peak_demand):
    pool = mo.ui.slider(POOLS[0], POOLS[-1], step=1, value=POOLS[0], show_value=True,
                        label="KV pool, blocks")
    cliff_guess = mo.ui.number(start=0, stop=POOLS[-1], value=0,
                               label="the largest pool with a preemption, blocks")
    mo.md(f"""
    ### Try it: find the cliff

    The peak concurrent demand of this request set is {peak_demand} blocks. Before you
    slide, write down where you expect the first preemption: the largest pool on which the
    recompute engine preempts anything. Then slide the pool down from the top and watch when
    preemptions start, and how quickly the work grows once they do; the engine's count
    decides, under the timeline. Each new size runs both policies (a few seconds on a CPU).

    {cliff_guess}

    {pool}
    """)
    return cliff_guess, pool


@app.cell
def _(block_bytes, draw_timeline, mo, plt, pool, run):
    _rc, _sw = run("recompute", pool.value), run("swap", pool.value)
    _fig, (_a, _b) = plt.subplots(2, 1, figsize=(10, 4.8), sharex=True)
    draw_timeline(_a, _rc, f"recompute, {pool.value} blocks: {_rc['num_steps']} steps, "
                  f"{_rc['preemptions']} preemptions, {_rc['recomputed_tokens']} tokens "
                  "computed twice")
    draw_timeline(_b, _sw, f"swap, {pool.value} blocks: {_sw['num_steps']} steps, "
                  f"{_sw['preemptions']} preemptions, {_sw['swapped_out_blocks']} blocks "
                  "swapped out and back")
    _b.set_xlabel("engine step")
    _fig.tight_layout()
    mo.vstack([_fig, mo.md(
        f"**{pool.value} blocks**: E2E latency p90 {_rc['p90_steps']:.0f} steps with recompute, "
        f"{_sw['p90_steps']:.0f} with swap (p99 on this machine {_rc['p99_s']:.2f} s and "
        f"{_sw['p99_s']:.2f} s); swap moved "
        f"{2 * _sw['swapped_out_blocks'] * block_bytes / 2**20:.1f} MiB across the host link.")])
    return


@app.cell
def _(POOLS, peak_demand, run):
    # The cliff, exactly: from peak_demand up the unconstrained schedule fits, so nothing is
    # preempted there; below it, the first pool on which the recompute engine preempts. The
    # runs are cached, so the sweep's pools cost nothing again.
    print(f"the cliff: pools from {peak_demand - 1} blocks down, until one preempts ...",
          flush=True)
    first_preempted = next(_p for _p in range(peak_demand - 1, POOLS[0] - 1, -1)
                           if run("recompute", _p)["preemptions"])
    print(f"the first preemption, sliding down: at {first_preempted} blocks")

    def check_cliff_guess(value):
        """The learner's largest pool with a preemption, against the engine's own runs."""
        if not value:
            return "Enter a number of blocks."
        count = run("recompute", first_preempted)["preemptions"]
        times = f"{count} time{'s' if count > 1 else ''}"
        if value == first_preempted:
            return (f"Correct: on {first_preempted} blocks the engine preempted {times}, and "
                    f"on {first_preempted + 1} blocks or more, never.")
        if value > first_preempted:
            why = (f" The schedule holds its peak of {peak_demand} blocks for a step or two "
                   "only, and a few blocks less there just delays an admission."
                   if first_preempted < peak_demand - 1 else "")
            return (f"Too high: on {first_preempted + 1} blocks or more the engine preempted "
                    f"nothing; the first preemption came at {first_preempted}.{why}")
        return f"Too low: on {first_preempted} blocks the engine already preempted {times}."
    return check_cliff_guess, first_preempted


@app.cell
def _(check_cliff_guess, cliff_guess, mo):
    _msg = check_cliff_guess(cliff_guess.value)
    mo.callout(mo.md(f"Your prediction: **{cliff_guess.value:g}** blocks. {_msg}"),
               kind="success" if _msg.startswith("Correct") else "neutral")
    return


@app.cell
def _(POOLS, block_bytes, mo, run):
    # Recompute against swap and offload on the smallest pool (the slider above compares
    # recompute and swap on any).
    compared = {(_m, _p): run(_m, _p) for _p in POOLS[:1]
                for _m in ("recompute", "swap", "offload")}
    _rc0, _sw0 = compared[("recompute", POOLS[0])], compared[("swap", POOLS[0])]
    _of0 = compared[("offload", POOLS[0])]
    _steps_note = ("The three took the same number of steps: a recomputed request's second "
                   "prefill rides in a step that runs anyway, next to the others' decodes."
                   if len({_r["num_steps"] for _r in compared.values()}) == 1
                   else "The step counts differ a little: a recomputed request's second "
                   "prefill can hold up admissions that a swapped one would not.")
    _rows = []
    for (_m, _p), _r in compared.items():
        _blocks = _r["swapped_out_blocks"] or _r["loaded_blocks"]
        _moved = (2 * _r["swapped_out_blocks"] + _r["stored_blocks"]
                  + _r["loaded_blocks"]) * block_bytes
        _rows.append(f"| {_p} | {_m} | {_r['num_steps']} | {_r['preemptions']} | "
                     f"{_r['recomputed_tokens']} | {_blocks} | "
                     f"{_moved / 2**20:.1f} MiB | {_r['wall_s']:.1f} s | {_r['p99_s']:.2f} s |")
        print(f"pool {_p:3d} {_m:9s}: {_r['num_steps']:3d} steps, {_r['preemptions']:2d} "
              f"preemptions, {_r['recomputed_tokens']:4d} tokens recomputed, "
              f"{_blocks:3d} blocks swapped out or loaded back ({_moved / 2**20:.1f} MiB "
              f"moved to and from host memory), wall {_r['wall_s']:.1f} s, p99 {_r['p99_s']:.2f} s")
    mo.md(f"""
    | pool | policy | steps | preemptions | tokens computed twice | blocks swapped out, or loaded back | bytes moved (out + in) | wall | E2E p99 (s) |
    |---|---|---|---|---|---|---|---|---|
    {chr(10).join(_rows)}

    {_steps_note} The difference is the work inside the steps. Recompute pays in arithmetic: at {POOLS[0]}
    blocks it fed {_rc0['recomputed_tokens']} tokens through the model a second time,
    {_rc0['recomputed_tokens'] / _rc0['useful_tokens']:.0%} on top of the useful work. Swap
    pays in copies: {_sw0['swapped_out_blocks']} blocks out and back, and nothing computed
    twice. A block of this model holds {block_bytes:,} bytes of K and V (30 layers x 3 KV
    heads x 64 dims x 2 x 16 tokens x the dtype's bytes). On this device both pools
    live in the same RAM, so a swap is a plain memory copy. On a GPU the copy crosses PCIe
    and waits on it, while a recompute is a prefill, the kind of work a GPU does fastest;
    which one wins then depends on the workload: long contexts make recompute expensive,
    short ones make it cheap. (That GPU trade-off is reasoned, not measured: no GPU run of
    this lesson is recorded yet in docs/benchmarks.md.)

    Offload (V1's recompute with a CPU tier) sits between them. It copies more than swap:
    every full block goes to the tier as it is computed ({_of0['stored_blocks']} blocks
    stored), preempted or not, because nobody knows in advance which request will be
    evicted; on a GPU those stores run beside the forward pass. When a preempted request
    comes back it loads its full blocks ({_of0['loaded_blocks']} loaded here) and computes
    again only the tokens of its last, partial block: {_of0['recomputed_tokens']} tokens
    computed twice against recompute's {_rc0['recomputed_tokens']}. And the tier is a
    cache: what it holds also serves any later request with the same prefix (lesson 05).
    """)
    return (compared,)


@app.cell
def _(mo):
    mo.md(r"""
    ## Exercise: who is evicted, and when?

    A pool of **5 blocks** of 16 tokens, the recompute engine. Requests A and B arrive
    together (A first), each with a **24-token prompt** and `max_tokens=12`, greedy, EOS
    ignored. Both are admitted in step 1 (2 blocks each) and sample their first token there.
    In which step does the first preemption happen, and which request is the victim? The
    checker runs this on the engine.
    """)
    answer_step = mo.ui.number(start=0, stop=100, value=0, label="first preemption in step")
    answer_victim = mo.ui.dropdown(["A", "B"], value=None, label="victim")
    mo.hstack([answer_step, answer_victim], justify="start")
    return answer_step, answer_victim


@app.cell
def _(llm, run_set):
    _ids = llm.tokenizer.encode("Two requests share a pool that is one block too small for "
                                "both of them to grow. " * 4)
    exercise_requests = [(_ids[:24], 12), (_ids[30:54], 12)]       # A, then B
    _run = run_set(exercise_requests, "recompute", 5)
    _first = next(_i for _i, _s in enumerate(_run["steps"], 1) if _s["preempted"])
    exercise_truth = (_first, "AB"[int(_run["steps"][_first - 1]["preempted"][0])])

    def check_preemption(step, victim):
        truth_step, truth_victim = exercise_truth
        notes = []
        if not step:
            notes.append("Enter a step number.")
        elif step == truth_step:
            notes.append(f"Step {truth_step}: correct.")
        elif step == truth_step - 1:
            notes.append("One step early. After step k a request holds 24 + k tokens; the "
                         "step that needs a third block is the one that must store token "
                         "33, i.e. the step that starts with 33 tokens.")
        elif step == truth_step + 1:
            notes.append("One step late: the new block is needed for the K/V of the token "
                         "being fed in, before any new token is sampled.")
        else:
            notes.append("Not the step: two blocks hold 32 tokens. Count the tokens each "
                         "request holds at the start of every step (prompt + tokens "
                         "sampled so far).")
        if victim is None:
            notes.append("Pick a victim.")
        elif victim == truth_victim:
            notes.append(f"Victim {truth_victim}: correct, the newest running request is "
                         "evicted, so the oldest keeps making progress.")
        else:
            notes.append("Not A: A asks first and takes the last free block. When B then "
                         "needs one, the engine evicts the newest running request.")
        return "  \n".join(notes)
    return check_preemption, exercise_requests, exercise_truth


@app.cell
def _(answer_step, answer_victim, check_preemption, mo):
    _msg = check_preemption(answer_step.value, answer_victim.value)
    mo.callout(mo.md(_msg), kind="success" if _msg.count("correct") == 2 else "neutral")
    return


@app.cell
def _(mo):
    mo.md(r"""
    ## Exercise: what does B compute when it comes back?

    The same two requests on the same pool of 5 blocks, once more with the CPU tier on
    (`kv_offloading_size`): every full block B computes is stored in host memory as it goes.
    B is evicted as before. When it is admitted again, how many tokens does its first step
    back compute, with recompute alone, and with the tier? The checker reads the engine's
    step records of B's return.
    """)
    back_recompute = mo.ui.number(start=0, stop=100, value=0, label="recompute alone, tokens")
    back_offload = mo.ui.number(start=0, stop=100, value=0, label="with the CPU tier, tokens")
    mo.hstack([back_recompute, back_offload], justify="start")
    return back_offload, back_recompute


@app.cell
def _(exercise_requests, run_set):
    def tokens_back(mode):
        """The tokens B ("req-1") computes in its first step after its preemption."""
        _steps = run_set(exercise_requests, mode, 5)["trace"]
        _out = next(_i for _i, _s in enumerate(_steps) if "req-1" in _s.preempted)
        return next(_x.num_tokens for _s in _steps[_out + 1:] for _x in _s.scheduled
                    if _x.request_id == "req-1")
    back_truth = {_m: tokens_back(_m) for _m in ("recompute", "offload")}

    def check_back(recompute, offload):
        notes = []
        if recompute == back_truth["recompute"]:
            notes.append(f"Recompute alone: {recompute:g} tokens, correct: its prompt and every "
                         "token it had sampled lost their K/V, and come back as one prefill.")
        else:
            notes.append(f"Recompute alone: not {recompute:g}. Count what B holds when it is "
                         "evicted: its prompt and the tokens it has sampled, none with K/V.")
        if offload == back_truth["offload"]:
            notes.append(f"With the tier: {offload:g}, correct: its full blocks load from host "
                         "memory, and only the tokens after the last full block are computed.")
        else:
            notes.append(f"With the tier: not {offload:g}. The tier holds B's full blocks of 16 "
                         "tokens; which of B's tokens are in no full block? (The newest token "
                         "has no K/V yet in any case.)")
        return "  \n".join(notes)
    return back_truth, check_back


@app.cell
def _(back_offload, back_recompute, check_back, mo):
    _msg = check_back(back_recompute.value, back_offload.value)
    mo.callout(mo.md(_msg), kind="success" if _msg.count("correct") == 2 else "neutral")
    return


@app.cell
def _(
    POOLS,
    back_truth,
    check_back,
    check_cliff_guess,
    check_preemption,
    compared,
    exercise_truth,
    first_preempted,
    knee,
    peak_demand,
    saturation_blocks,
    sweep,
):
    def test_outputs_identical_across_pools_and_policies():
        _reference = sweep[POOLS[-1]]["tokens"]
        for _r in [*sweep.values(), *compared.values()]:
            assert _r["tokens"] == _reference, (_r["mode"], _r["pool"])

    def test_preemption_below_the_knee_none_from_peak_demand_up():
        assert POOLS[-1] >= saturation_blocks
        for _p in POOLS:
            if _p >= peak_demand:       # the unconstrained schedule fits: it is the same run
                assert sweep[_p]["preemptions"] == 0 == sweep[_p]["recomputed_tokens"]
                assert sweep[_p]["num_steps"] == sweep[POOLS[-1]]["num_steps"]
        assert POOLS[0] < knee <= peak_demand
        assert sweep[POOLS[0]]["preemptions"] > 0

    def test_tail_latency_smallest_pool_above_largest():
        # In engine steps: deterministic. (The same in seconds is printed, but wall time on a
        # shared machine can jump several-fold between two runs, so it is not asserted.)
        _small, _large = sweep[POOLS[0]], sweep[POOLS[-1]]
        assert _small["p90_steps"] > _large["p90_steps"]
        assert _small["num_steps"] > _large["num_steps"]

    def test_swap_recomputes_nothing_and_moves_blocks():
        for _p in POOLS[:1]:
            _rc, _sw = compared[("recompute", _p)], compared[("swap", _p)]
            if _rc["preemptions"]:
                assert _rc["recomputed_tokens"] > 0
                assert _sw["swapped_out_blocks"] > 0 and _sw["recomputed_tokens"] == 0

    def test_the_cpu_tier_loads_back_what_recompute_computes_again():
        _rc, _of = compared[("recompute", POOLS[0])], compared[("offload", POOLS[0])]
        assert _rc["preemptions"] > 0 and _of["preemptions"] > 0
        assert _of["loaded_blocks"] > 0
        assert _of["recomputed_tokens"] < _rc["recomputed_tokens"]

    def test_the_tokens_back_exercise():
        assert back_truth == {"recompute": 33, "offload": 1}
        assert check_back(33, 1).count("correct") == 2
        assert check_back(32, 17).count("correct") == 0

    def test_exercise_truth_and_checker():
        assert exercise_truth == (10, "B")
        assert check_preemption(10, "B").count("correct") == 2
        assert "early" in check_preemption(9, "B")
        assert "Not A" in check_preemption(10, "A")

    def test_the_engine_checks_the_cliff_guess():
        # No formula gives the cliff: the right answer is the engine's own scan, and it must
        # agree with the sweep (below the knee, at or above its largest pool that preempted).
        assert max(_p for _p in POOLS if sweep[_p]["preemptions"]) <= first_preempted < knee
        assert check_cliff_guess(first_preempted).startswith("Correct")
        for _wrong in (first_preempted - 1, first_preempted + 1, peak_demand):
            assert not check_cliff_guess(_wrong).startswith("Correct")
    return


@app.cell
def _(mo):
    # Shown at the end, under "Where the code lives".
    v1_box = mo.callout(mo.md(r"""
    **In vLLM V1** (as of vLLM 0.33). Preemption is by recompute only. When
    `KVCacheManager.allocate_slots` finds no free block, `Scheduler.schedule`
    (`vllm/v1/core/sched/scheduler.py`) pops the newest running request (the lowest priority
    one under priority scheduling) and calls `Scheduler._preempt_request`: its blocks are
    freed, `num_computed_tokens` goes back to 0, its status becomes `RequestStatus.PREEMPTED`,
    and it goes to the front of the waiting queue. There is no swap space and no swapped
    queue; with prefix caching on, the freed blocks keep their hashes, so the recompute may
    find part of its own prefix still cached. With `--kv-offloading-size` the engine gets the
    `OffloadingConnector` (`vllm/distributed/kv_transfer/kv_connector/v1/offloading_connector.py`,
    its two halves in `offloading/scheduler.py` and `offloading/worker.py` beside it, over
    `vllm/v1/kv_offload/`): its scheduler side stores computed blocks in a CPU tier and, when a
    request (a preempted one too) is admitted, counts the tier's hits as tokens to load; its
    worker side copies on a CUDA stream while the request waits in `WAITING_FOR_REMOTE_KVS`.
    minivllm's tier (`minivllm/kv_offload/`) has the same two sides and copies synchronously,
    before the forward. minivllm keeps V0's swap beside both to show the trade-off: bytes over
    the host link against tokens computed twice.
    """), kind="info")
    return (v1_box,)


@app.cell
def _(POOLS, block_bytes, compared, knee, mo, peak_demand, saturation_blocks, sweep, v1_box):
    _small, _large = sweep[POOLS[0]], sweep[POOLS[-1]]
    _rc, _sw = compared[("recompute", POOLS[0])], compared[("swap", POOLS[0])]
    findings = {
        "saturation_blocks": saturation_blocks,
        "peak_demand_blocks": peak_demand,
        "knee_blocks": knee,
        "preemptions_by_pool": {str(_p): _r["preemptions"] for _p, _r in sweep.items()},
        "recomputed_tokens_by_pool": {str(_p): _r["recomputed_tokens"]
                                      for _p, _r in sweep.items()},
        "p90_steps_by_pool": {str(_p): _r["p90_steps"] for _p, _r in sweep.items()},
        "p99_s_by_pool": {str(_p): _r["p99_s"] for _p, _r in sweep.items()},
        "p50_s_by_pool": {str(_p): _r["p50_s"] for _p, _r in sweep.items()},
        "steps_by_pool": {str(_p): _r["num_steps"] for _p, _r in sweep.items()},
        "smallest_pool_swap_blocks_out": _sw["swapped_out_blocks"],
        "smallest_pool_swap_bytes_moved": 2 * _sw["swapped_out_blocks"] * block_bytes,
        "smallest_pool_steps": {_m: _r["num_steps"] for (_m, _), _r in compared.items()},
        "smallest_pool_offload": {_k: compared[("offload", POOLS[0])][_k] for _k in (
            "recomputed_tokens", "loaded_blocks", "stored_blocks")},
    }
    print("findings:", findings)
    mo.vstack([mo.md(f"""
    ## What we found

    * From a pool of {knee} blocks up (the peak concurrent demand is {peak_demand}), nothing
      is preempted; at {POOLS[0]} blocks the recompute engine preempted
      **{_small['preemptions']}** times and computed **{_small['recomputed_tokens']}**
      tokens twice.
    * The work grew with them: at {POOLS[0]} blocks the {len(_small['tokens'])} requests
      took **{_small['num_steps']}** engine steps against **{_large['num_steps']}** on a pool
      of {POOLS[-1]}, and their E2E latency at p90 was **{_small['p90_steps']:.0f}** steps
      against **{_large['p90_steps']:.0f}** (median {_small['p50_steps']:.0f} against
      {_large['p50_steps']:.0f}): counts, the same on any machine. In seconds on this
      machine, p99 was {_small['p99_s']:.2f} s against {_large['p99_s']:.2f} s, shown only
      beside: over {len(_small['tokens'])} requests p99 is the slowest one or two, and a
      shared machine moves it by tens of percent between runs.
    * Swap, on the same smallest pool, recomputed nothing and moved
      **{_sw['swapped_out_blocks']}** blocks out and back
      ({2 * _sw['swapped_out_blocks'] * block_bytes / 2**20:.1f} MiB).
    * Offload (V1: recompute, with a CPU tier of the same host memory) computed
      **{compared[("offload", POOLS[0])]['recomputed_tokens']}** tokens twice there instead of
      {_small['recomputed_tokens']}, loading {compared[("offload", POOLS[0])]['loaded_blocks']}
      blocks back, after storing {compared[("offload", POOLS[0])]['stored_blocks']} as they
      were computed.
    * Every pool size and all three policies produced exactly the same tokens: preemption
      changes when a request's work is done, never what it computes.

    Preemption takes memory back and pays for it in steps. A server that hosts many fine-tunes
    of one model has a second memory to share: slots for their adapters. Next, lesson 12: how
    does one batch serve several adapters at once, and what happens when the requests want more
    adapters than there are slots?

    ## Where the code lives

    * `minivllm/core/scheduler.py`: in `Scheduler._schedule_running`, the loop over running
      requests that preempts the newest one while `can_append_slots` fails; `Scheduler._preempt`
      (recompute, V1's one policy); `num_preemptions`.
    * `minivllm/core/v0/scheduler.py`: V0's scheduler, picked by `preemption_mode="swap"`:
      `V0Scheduler._preempt` swaps (its blocks' copies into the host pool), the swapped queue
      served before new admissions (`_schedule_waiting`), `num_swapped_out_blocks`.
    * `minivllm/core/block_manager.py`: `can_append_slots`, `free`.
    * `minivllm/worker/swap_pool.py`: `SwapPool`, the host pool V0's swap needs, and the
      block copies between it and the device pool (the Worker makes it for swap only).
    * `minivllm/kv_offload/`: the CPU tier, a KV connector: `CPUOffloadingManager` (hash ->
      host block, LRU), `OffloadingConnectorScheduler.update_state_after_alloc` (the tier's
      hits become loads and count as computed) and `.build_connector_meta` (the step's
      stores), `OffloadingConnectorWorker` (the copies, around the forward).
    * `minivllm/config/`: `num_kv_blocks`, `swap_space` and `kv_offloading_size` (cache.py),
      `preemption_mode` (scheduler.py).
    """), v1_box])
    return (findings,)


if __name__ == "__main__":
    app.run()
