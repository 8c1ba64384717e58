import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell
def _():
    import marimo as mo
    import matplotlib.pyplot as plt
    import numpy as np
    import torch
    from matplotlib.patches import Rectangle

    import collections

    from minivllm import LLM, BeamSearchParams, SamplingParams
    from minivllm.engine.core import EngineCoreRequest
    from minivllm.config.scheduler import V0_SCHEDULER
    from minivllm.core.block_manager import cdiv
    from minivllm.config import resolve_device, resolve_dtype
    from minivllm.core.kv_cache import kv_bytes_per_token, reference_config
    from minivllm.workloads import Request, lognormal_requests, serve
    return (BeamSearchParams, EngineCoreRequest, LLM, Request, Rectangle, SamplingParams,
            V0_SCHEDULER, cdiv, collections, kv_bytes_per_token, lognormal_requests, mo, np, plt,
            reference_config, resolve_device, resolve_dtype, serve, torch)


@app.cell
def _(mo):
    mo.md(r"""
    # 02 · PagedAttention: the KV cache as virtual memory

    After this lesson you can explain why vLLM cuts the KV cache into small fixed-size
    blocks, read a block table, and predict how many blocks a set of requests occupies,
    including requests whose samples share a prompt and the beams of a beam search. You
    will serve one request set twice on the real model with the same memory budget, once
    with a slab per request (lesson 01's cache) and once with pages, and measure how much of
    the reserved memory holds tokens and how many requests run at the same time.
    """)
    return


@app.cell
def _(LLM, kv_bytes_per_token, mo, reference_config, resolve_device, resolve_dtype, torch):
    # One byte budget for both caches: room for NUM_SLABS requests of MAX_MODEL_LEN tokens.
    MAX_MODEL_LEN, NUM_SLABS, BLOCK_SIZE = 2048, 8, 16
    _dtype = resolve_dtype("auto", resolve_device("auto"))     # fp32 on CPU, bf16 on CUDA
    bytes_per_token = kv_bytes_per_token(reference_config("SmolLM2-135M"), _dtype)
    kv_budget = NUM_SLABS * MAX_MODEL_LEN * bytes_per_token    # 755 MB in fp32
    # The baseline: a slab of MAX_MODEL_LEN slots per running request. On CUDA the engine
    # sizes its pool from free GPU memory, so max_num_seqs is what keeps it to NUM_SLABS.
    SLABS = dict(kv_layout="contiguous", kv_cache_memory=kv_budget, num_kv_blocks=None,
                 max_num_seqs=NUM_SLABS, enable_prefix_caching=True)
    # Paged: the same bytes cut into blocks of BLOCK_SIZE tokens. Prefix caching (lesson 05)
    # is off, so that every shared block below comes from parallel sampling alone.
    PAGED = dict(kv_layout="paged", kv_cache_memory=None, max_num_seqs=64,
                 num_kv_blocks=kv_budget // (BLOCK_SIZE * bytes_per_token),
                 enable_prefix_caching=False)
    # One loaded model; llm.reconfigure(**SLABS) or (**PAGED) switches the cache over the
    # same weights.
    llm = LLM(max_model_len=MAX_MODEL_LEN, block_size=BLOCK_SIZE, **PAGED)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    mo.md(f"**running on:** {device} · **model:** SmolLM2-135M-Instruct "
          f"({str(llm.engine.dtype).removeprefix('torch.')}) · **KV budget:** "
          f"{kv_budget / 2**20:,.0f} MiB for each cache  \n`{llm.engine!r}`")
    return BLOCK_SIZE, MAX_MODEL_LEN, NUM_SLABS, PAGED, SLABS, device, llm


@app.cell
def _(mo):
    mo.md(r"""
    ## The idea: an operating system already solved this

    A process believes it owns one long, contiguous address space. In reality the kernel
    hands it physical memory one small page at a time, only when it first touches an
    address, and keeps a *page table* that says where each of its pages really lives. Pages
    of one process can sit anywhere in RAM; two processes can map the same physical page
    (a reference count says how many do), and after `fork()` a shared page is duplicated only
    when one side writes to it (*copy-on-write*).

    PagedAttention (Kwon et al., SOSP 2023, the paper vLLM came from) applies the same
    bookkeeping to the KV cache:

    | operating system | minivllm / vLLM |
    |---|---|
    | process | a `Request`: the core's unit (one sample, with its own request id) |
    | virtual page | a *logical block*: `block_size` consecutive tokens of the sequence |
    | page table | the sequence's `block_table`: logical block `i` -> physical block id |
    | physical page frame | a block of the KV pool, `block_size` tokens of K and V in every layer |
    | page size | `block_size` (16 by default) |
    | reference count, `fork()`, copy-on-write | `BlockManager.ref_counts`, V0's `fork_blocks`, `append_slots` (vLLM V0's design for `n > 1`; V1 fans out instead, below) |

    A sequence is given a new block only when its last one is full, so the memory it holds but
    does not use is at most `block_size - 1` slots, whatever `max_model_len` is. Attention
    pays for this with one extra lookup: to find token `j` it reads
    `block_table[j // block_size]` first.
    """)
    return


@app.cell
def _(BLOCK_SIZE, MAX_MODEL_LEN, NUM_REQUESTS, NUM_SLABS, mo):
    mo.md(f"""
    ## The problem, measured: one request set, one budget, two caches

    Both caches get the same number of bytes for K and V: room for {NUM_SLABS} requests of
    {MAX_MODEL_LEN} tokens. The contiguous one (`llm.reconfigure(**SLABS)`) spends it as
    {NUM_SLABS} slabs; the paged one (`**PAGED`) as blocks of {BLOCK_SIZE} tokens. We send both
    the same {NUM_REQUESTS} requests, with prompt and output lengths drawn from log-normal
    distributions (most requests short, a few long, as in chat traffic), and after every
    engine step record how many KV slots are reserved and how many hold a token.
    """)
    return


@app.cell
def _(llm, lognormal_requests, np, torch):
    # A seeded workload with a long tail (log-normal lengths, (mu, sigma, min, max)). On a GPU
    # the same lesson serves more requests.
    NUM_REQUESTS = 48 if torch.cuda.is_available() else 16
    workload = lognormal_requests(llm.tokenizer, NUM_REQUESTS, prompt=(5.0, 0.6, 16, 600),
                                  output=(3.3, 0.5, 8, 100), seed=5, stride=7)
    prompt_lens = np.array([len(_r.prompt) for _r in workload])
    output_lens = np.array([_r.params.max_tokens for _r in workload])
    print(f"{NUM_REQUESTS} requests; prompt tokens: median {int(np.median(prompt_lens))}, "
          f"max {prompt_lens.max()}; output tokens: median {int(np.median(output_lens))}, "
          f"max {output_lens.max()}")
    return NUM_REQUESTS, output_lens, prompt_lens, workload


@app.cell
def _(PAGED, SLABS, llm, serve, workload):
    # Every step recorded, with the engine's stats after it (StepRecord.stats).
    static_trace = [_s.stats for _s in serve(llm.reconfigure(**SLABS), workload).steps]
    paged_trace = [_s.stats for _s in serve(llm.reconfigure(**PAGED), workload).steps]
    return paged_trace, static_trace


@app.cell
def _(BLOCK_SIZE, np, paged_trace, plt, static_trace):
    def utilization(trace):
        """Tokens held / slots reserved, summed over all steps (a time average)."""
        return (sum(s.tokens_cached for s in trace)
                / sum(s.slots_reserved for s in trace))

    static_utilization = utilization(static_trace)
    paged_utilization = utilization(paged_trace)
    static_concurrency = max(s.num_running for s in static_trace)
    paged_concurrency = max(s.num_running for s in paged_trace)
    paged_peak_pool = max(s.num_blocks_used for s in paged_trace) / paged_trace[0].num_blocks_total

    _budget_slots = paged_trace[0].num_blocks_total * BLOCK_SIZE
    _fig, _axes = plt.subplots(2, 2, figsize=(10, 5.5), sharex="col", sharey="row",
                               height_ratios=[3, 2])
    for _col, (_name, _trace, _u) in enumerate([
            ("slab per request", static_trace, static_utilization),
            (f"paged, {BLOCK_SIZE}-token blocks", paged_trace, paged_utilization)]):
        _steps = np.arange(len(_trace))
        _top, _bottom = _axes[0, _col], _axes[1, _col]
        _top.fill_between(_steps, [s.slots_reserved for s in _trace], step="post",
                          alpha=0.3, color="tab:red", label="slots reserved")
        _top.fill_between(_steps, [s.tokens_cached for s in _trace], step="post",
                          alpha=0.8, color="tab:blue", label="slots holding a token")
        _top.axhline(_budget_slots, color="k", ls="--", lw=1, label="budget")
        _top.set_title(f"{_name}: {_u:.1%} of reserved slots used")
        _bottom.step(_steps, [s.num_running for s in _trace], where="post",
                     color="tab:green", label="running")
        _bottom.step(_steps, [s.num_waiting for s in _trace], where="post",
                     color="tab:orange", label="waiting")
        _bottom.set_xlabel("engine step")
    _axes[0, 0].set_ylabel("KV slots")
    _axes[1, 0].set_ylabel("requests")
    _axes[0, 0].legend(loc="center right", fontsize=8)
    _axes[1, 0].legend(loc="upper right", fontsize=8)
    _fig.tight_layout()
    print(f"utilization: slab {static_utilization:.1%}, paged {paged_utilization:.1%}; "
          f"requests at once: slab {static_concurrency}, paged {paged_concurrency}; "
          f"paged pool at most {paged_peak_pool:.0%} full; steps: slab {len(static_trace)}, "
          f"paged {len(paged_trace)}")
    _fig
    return (paged_concurrency, paged_peak_pool, paged_utilization, static_concurrency,
            static_utilization)


@app.cell
def _(NUM_REQUESTS, NUM_SLABS, mo, paged_concurrency, paged_peak_pool, paged_utilization,
      static_concurrency, static_utilization):
    mo.md(f"""
    With slabs, only **{static_utilization:.1%}** of the reserved memory ever held a token,
    and the budget ran out after **{static_concurrency}** requests: the other
    {NUM_REQUESTS - NUM_SLABS} waited in the queue although almost all of the memory was
    empty. With pages, **{paged_utilization:.1%}** of the reserved slots held a token, all
    **{paged_concurrency}** requests ran at once, and the pool was never more than
    **{paged_peak_pool:.0%}** full: the same bytes could have served several times as many
    requests of this mix. The remaining few percent is the unfilled tail of each sequence's
    last block (plus, for a step or two, reserved blocks of a prefill split over two steps).

    Memory that holds more requests is throughput: a decode step for 16 sequences costs little
    more than for one (lesson 01), and lesson 04 shows the scheduler keeping the batch full.
    """)
    return


@app.cell
def _(MAX_MODEL_LEN, mo, output_lens, prompt_lens, static_utilization):
    # A request with prompt p and output o holds p + k tokens at its k-th decode step: about
    # p + o/2 on average, for o steps. Weighted by steps, that is the mean a slab holds; the
    # slab reserves max_model_len whatever it holds. So slab waste ~ 1 - mean / max_model_len.
    mean_held = float(((prompt_lens + output_lens / 2) * output_lens).sum() / output_lens.sum())
    longest_request = int((prompt_lens + output_lens).max())

    def slab_waste(max_len):
        """Predicted share of a slab's slots that never hold a token."""
        return 1 - mean_held / max_len

    predicted_static_waste = slab_waste(MAX_MODEL_LEN)
    print(f"slab waste at max_model_len {MAX_MODEL_LEN}: predicted 1 - {mean_held:.0f} / "
          f"{MAX_MODEL_LEN} = {predicted_static_waste:.1%}, measured "
          f"{1 - static_utilization:.1%}")
    max_len_steps = [256, 384, 512, 768, 1024, 1536, 2048, 4096]
    max_len_pick = mo.ui.slider(steps=max_len_steps, value=MAX_MODEL_LEN, show_value=True,
                                label="max_model_len")
    mo.md(f"""
    ### Where the slab's waste comes from: one knob

    The slab's waste is almost entirely `max_model_len` against the requests' real lengths.
    While it runs, a request of this mix holds on average **{mean_held:.0f}** tokens (prompt
    plus half its output, weighted by how many steps it lives); its slab reserves
    {MAX_MODEL_LEN}. So waste is about 1 - {mean_held:.0f} / {MAX_MODEL_LEN} =
    **{predicted_static_waste:.1%}**, and the engine measured **{1 - static_utilization:.1%}**.
    Lesson 01's 96% is the same formula with shorter requests. The series quotes 60-80%
    for the slab systems it surveys: that is what this formula gives when `max_model_len` is
    2.5 to 5 times the mean length held, a tighter limit than 2048 is for this mix. Move the
    knob down and watch the waste fall, until the longest request no longer fits.

    {max_len_pick}
    """)
    return (longest_request, max_len_pick, max_len_steps, mean_held, predicted_static_waste,
            slab_waste)


@app.cell
def _(MAX_MODEL_LEN, longest_request, max_len_pick, max_len_steps, mean_held, plt,
      slab_waste, static_utilization):
    _lens = max_len_steps
    _fig, _ax = plt.subplots(figsize=(7, 3))
    _ax.axhspan(60, 80, color="tab:orange", alpha=0.15, label="the series' 60-80%")
    _ax.plot(_lens, [100 * slab_waste(_x) for _x in _lens], "o-", color="tab:red",
             label=f"1 - {mean_held:.0f} / max_model_len")
    _ax.plot([MAX_MODEL_LEN], [100 * (1 - static_utilization)], "k*", ms=12,
             label="measured by the engine")
    _ax.axvline(longest_request, color="k", ls=":", lw=1)
    _ax.axvline(max_len_pick.value, color="tab:blue", lw=2, alpha=0.5)
    _ax.set_xscale("log", base=2)
    _ax.set_xlabel("max_model_len")
    _ax.set_ylabel("slab waste, %")
    _ax.set_ylim(0, 100)
    _ax.legend(loc="lower right", fontsize=8)
    _x = max_len_pick.value
    if _x < longest_request:
        _ax.set_title(f"max_model_len {_x}: the {longest_request}-token request is refused "
                      f"(prompt + max_tokens > max_model_len)", color="tab:red", fontsize=9)
    else:
        _ax.set_title(f"max_model_len {_x}: {slab_waste(_x):.0%} of every slab wasted",
                      fontsize=10)
    _fig.tight_layout()
    _fig
    return


@app.cell
def _(mo):
    mo.md(r"""
    ## The mechanism, live: block tables, reference counts, copy-on-write

    Parallel sampling asks for `n` answers to one prompt (`SamplingParams(n=...)`). What follows
    is **vLLM V0's design** (the PagedAttention paper's), which minivllm's V0 scheduler keeps
    (`minivllm/core/v0/`) for a request handed to the engine core whole (`n > 1`), because it
    shows reference counts and copy-on-write at work; `LLMEngine` itself does it vLLM V1's way,
    shown after it. The engine prefills the prompt once, as sample 0; when its first token is
    sampled, the scheduler forks the others: each gets a block table that points at the same
    physical blocks, and each block's reference count goes up to `n`. Nothing is copied yet.

    On the next step every sample writes: sample 0 its first token, each fork the prompt's last
    token again, whose logits row it draws its first token from (to the model runner a fork is
    a new request, its prompt computed but for one token). A write into a block others still
    read first copies it for the writer (copy-on-write, `append_slots`); the full prompt blocks
    stay shared to the end.

    Below is the real state of the paged engine's block manager for one request with a
    40-token prompt (two full blocks and 8 tokens in a third), after steps 1 and 12. Each
    box in the top row is a logical block of one sample (filled as far as it holds tokens);
    the arrows are its block table; the bottom row is the physical blocks in use, with their
    reference counts.
    """)
    return


@app.cell
def _(EngineCoreRequest, PAGED, SamplingParams, V0_SCHEDULER, collections, llm):
    PROMPT_LEN, SAMPLE_TOKENS = 40, 16
    prompt_ids = llm.tokenizer.encode(
        "The quick brown fox jumps over the lazy dog. A paged cache lends memory one block "
        "at a time, and a block table remembers where each block went. Write a short story "
        "about a fox who learns to share its den with three other foxes, one room at a "
        "time, and keeps a list of which fox sleeps in which room. " * 2)
    assert len(prompt_ids) >= 100, len(prompt_ids)

    def run_parallel(n, prompt_len=PROMPT_LEN, max_tokens=SAMPLE_TOKENS, _cache={}):
        """Serve one request with n samples on the paged engine; snapshot every step.
        Cached, so that moving the slider back to a value is instant."""
        key = (n, prompt_len, max_tokens)
        if key in _cache:
            return _cache[key]
        engine = llm.reconfigure(**PAGED, scheduler_cls=V0_SCHEDULER).engine
        rid = f"parallel-n{n}-p{prompt_len}"
        # V0's path: the request goes to the core whole and forks n samples inside it
        # (LLMEngine's add_request would fan it out into n requests, V1's way, below).
        engine.engine_core.add_request(EngineCoreRequest(
            rid, prompt_ids[:prompt_len],
            SamplingParams(n=n, temperature=0.8, seed=0, max_tokens=max_tokens, ignore_eos=True)))
        samples = engine.scheduler.groups[rid].seqs if n > 1 else [engine.requests[rid]]
        snapshots = []
        with engine.trace() as steps:      # StepRecord.num_blocks_copied: copy-on-write
            while engine.has_unfinished_requests():
                engine.step()
                tables = [(s.request_id, s.num_computed_tokens, list(s.block_table))
                          for s in samples if s.block_table]
                if not tables:             # the last step finished every sample
                    break
                # How many block tables point at each block: its reference count, since this
                # request is alone in the pool and prefix caching is off.
                refs = collections.Counter(b for _, _, t in tables for b in t)
                snapshots.append({
                    "tables": tables,
                    "ref_counts": dict(sorted(refs.items())),
                    "blocks_used": len(refs),
                    "blocks_unshared": sum(len(t) for _, _, t in tables),
                    "shared_blocks": sum(1 for c in refs.values() if c > 1),
                    "cow": sum(r.num_blocks_copied for r in steps),
                })
        texts = [" ".join(llm.tokenizer.decode(s.output_token_ids,
                                               skip_special_tokens=True).split())
                 for s in samples]
        _cache[key] = result = {"n": n, "prompt_len": prompt_len, "snapshots": snapshots,
                                "texts": texts}
        return result
    return PROMPT_LEN, SAMPLE_TOKENS, prompt_ids, run_parallel


@app.cell
def _(BLOCK_SIZE, Rectangle, plt):
    def draw_block_tables(ax, snap, title, block_size=BLOCK_SIZE):
        """Logical blocks of each sample (top) -> block table (arrows) -> physical blocks."""
        tables, ref_counts = snap["tables"], snap["ref_counts"]
        shared_color, private_color = "tab:orange", "tab:blue"
        # Top row: the samples' logical blocks, side by side, one group per sample.
        x, logical = 0.0, []
        for sample, (request_id, held, table) in enumerate(tables):
            ax.text(x, 1.5, f"sample {sample}\n{table}", fontsize=6.5, va="bottom")
            for j, block in enumerate(table):
                fill = min(max(held - j * block_size, 0), block_size) / block_size
                ax.add_patch(Rectangle((x, 0.8), 0.9, 0.6, fill=False, lw=1))
                ax.add_patch(Rectangle((x, 0.8), 0.9 * fill, 0.6, lw=0, alpha=0.35,
                                       color=shared_color if ref_counts[block] > 1
                                       else private_color))
                ax.text(x + 0.45, 1.1, f"L{j}", ha="center", va="center", fontsize=7)
                logical.append((x + 0.45, block))
                x += 1.0
            x += 0.6
        width = x - 0.6
        # Bottom row: the physical blocks in use, spread over the same width.
        ids = list(ref_counts)
        step = width / len(ids)
        where = {b: (i + 0.5) * step for i, b in enumerate(ids)}
        for b in ids:
            rc = ref_counts[b]
            ax.add_patch(Rectangle((where[b] - 0.45, -1.4), 0.9, 0.6, alpha=0.8,
                                   color=shared_color if rc > 1 else private_color))
            ax.text(where[b], -1.1, f"#{b}\nrc={rc}", ha="center", va="center",
                    fontsize=6.5, color="white")
        for lx, b in logical:
            ax.annotate("", xy=(where[b], -0.78), xytext=(lx, 0.78),
                        arrowprops=dict(arrowstyle="->", lw=0.7, alpha=0.6,
                                        color=shared_color if ref_counts[b] > 1
                                        else private_color))
        ax.text(-0.3, 1.1, "logical\nblocks", ha="right", va="center", fontsize=8)
        ax.text(-0.3, -1.1, "physical\nblocks", ha="right", va="center", fontsize=8)
        ax.set_xlim(-2.2, max(width, 16.0) + 0.2)      # n = 1 keeps its boxes square-ish
        ax.set_ylim(-1.6, 2.15)
        ax.axis("off")
        ax.set_title(title, fontsize=10)

    def draw_parallel(snaps, panels, who="sample"):
        """Block tables at two steps, panels = [(step, title), ...], then blocks per step."""
        fig, axes = plt.subplots(3, 1, figsize=(11, 7.5), height_ratios=[2, 2, 1.6])
        for ax, (step, title) in zip(axes, panels):
            draw_block_tables(ax, snaps[step - 1], title)
        steps, c = range(1, len(snaps) + 1), axes[2]
        c.step(steps, [s["blocks_unshared"] for s in snaps], where="post", color="tab:red",
               label=f"blocks if each {who} had its own copy")
        c.step(steps, [s["blocks_used"] for s in snaps], where="post", color="tab:blue",
               label="blocks in use (shared)")
        c.set_xlabel("engine step")
        c.set_ylabel("KV blocks")
        c.set_ylim(bottom=0)
        c.legend(fontsize=8, loc="lower right")
        fig.tight_layout()
        return fig
    return draw_block_tables, draw_parallel


@app.cell
def _(mo):
    n_samples = mo.ui.slider(1, 8, value=4, label="n: samples of one prompt", show_value=True)
    # Headless, the answer for n = 4 (the slider's start) is filled in, so that the checker's
    # verdict is tested below.
    _headless = mo.app_meta().mode == "script" or "headless" in mo.cli_args()
    cow_guess = mo.ui.number(start=0, stop=99, value=3 if _headless else 0,
                             label="copy-on-write events")
    shared_guess = mo.ui.number(start=0, stop=99, value=2 if _headless else 0,
                                label="blocks still shared at the end")
    mo.md(f"""
    ### Try it: how many copies does parallel sampling make?

    Before you move the slider, pick an `n` and write down your guess: with `n` samples of a
    40-token prompt, how many copy-on-write events happen, and how many blocks are still
    shared at the end? Then move the slider to your `n`: the engine's counts decide, below
    the picture. Each new `n` runs the real engine (a second or two on a CPU).

    {cow_guess} {shared_guess}

    {n_samples}
    """)
    return cow_guess, n_samples, shared_guess


@app.cell
def _(draw_parallel, mo, n_samples, run_parallel):
    _result = run_parallel(n_samples.value)
    _snaps = _result["snapshots"]
    _step = min(12, len(_snaps))
    _first, _late, _last = _snaps[0], _snaps[_step - 1], _snaps[-1]
    _forked = (f"forked into {_result['n']} samples" if _result["n"] > 1
               else "one sample, nothing to share")
    _texts = "\n".join(f"{_i}. …{_t!r}" for _i, _t in enumerate(_result["texts"]))
    mo.vstack([
        draw_parallel(_snaps, [
            (1, f"after step 1: prompt prefilled once, {_forked}; "
                f"{_first['shared_blocks']} shared blocks, {_first['cow']} copies"),
            (_step, f"after step {_step}: {_late['shared_blocks']} shared blocks, "
                    f"{_late['cow']} copy-on-write events, {_late['blocks_used']} blocks in use")]),
        mo.md(f"""
    **n = {_result['n']}**: {_last['cow']} copy-on-write events, {_last['shared_blocks']}
    blocks shared by all samples, {_last['blocks_used']} blocks in use at the end where
    separate requests would hold {_last['blocks_unshared']}. The samples really differ:

    {_texts}
    """),
    ])
    return


@app.cell
def _(run_parallel):
    def check_cow_guess(n, copies, shared):
        """The learner's copies and shared blocks for n samples, against the engine's count."""
        last = run_parallel(n)["snapshots"][-1]
        cow, kept = last["cow"], last["shared_blocks"]
        if (copies, shared) == (cow, kept):
            return (f"Correct: with n = {n} the engine made {cow} copies, and {kept} blocks "
                    "were still shared at the end.")
        if not copies and not shared:
            return "Enter your two numbers."
        notes = []
        if copies != cow:
            notes.append(f"{'Too many' if copies > cow else 'Too few'} copies: the engine "
                         f"made {cow}. Only the partly filled prompt block is copied, by each "
                         "sample that writes to it while another still reads it; the last "
                         "one to write keeps the original.")
        if shared != kept:
            why = ("the prompt's full blocks, which no sample writes to" if n > 1
                   else "one sample shares with no one")
            notes.append(f"{'Too many' if shared > kept else 'Too few'} shared blocks: "
                         f"{kept} at the end, {why}.")
        return " ".join(notes)
    return (check_cow_guess,)


@app.cell
def _(check_cow_guess, cow_guess, mo, n_samples, shared_guess):
    _msg = check_cow_guess(n_samples.value, cow_guess.value, shared_guess.value)
    mo.callout(mo.md(f"Your prediction for n = {n_samples.value}: **{cow_guess.value:g}** "
                     f"copies, **{shared_guess.value:g}** shared blocks. {_msg}"),
               kind="success" if _msg.startswith("Correct") else "neutral")
    return


@app.cell
def _(PROMPT_LEN, mo, run_parallel):
    # The numbers this lesson asserts: n = 4, whatever the slider says.
    _r4 = run_parallel(4)
    parallel_shared_after_fork = _r4["snapshots"][0]["shared_blocks"]
    parallel_shared_blocks = _r4["snapshots"][-1]["shared_blocks"]
    parallel_cow_events = _r4["snapshots"][-1]["cow"]
    _all4 = [_s for _s in _r4["snapshots"] if len(_s["tables"]) == 4][-1]  # all 4 still hold
    parallel_blocks_used, parallel_blocks_unshared = _all4["blocks_used"], _all4["blocks_unshared"]
    # The same request with a prompt that ends exactly on a block boundary (48 = 3 x 16).
    # Three tokens are enough: the copies, if any, happen at step 2.
    aligned_cow_events = run_parallel(4, 48, max_tokens=3)["snapshots"][-1]["cow"]
    print(f"n=4, {PROMPT_LEN}-token prompt: shared after fork {parallel_shared_after_fork}, "
          f"shared after copy-on-write {parallel_shared_blocks}, copy-on-write events "
          f"{parallel_cow_events}, blocks {parallel_blocks_used} vs {parallel_blocks_unshared} "
          f"unshared; 48-token prompt: {aligned_cow_events} copy-on-write events")
    mo.md(f"""
    The surprise is how little gets copied. For `n = 4` the engine made
    **{parallel_cow_events}** copies, not 4: the last sample to write finds the block's
    count already down to 1, so it keeps the original. Only the one partly filled block is
    ever copied; the **{parallel_shared_blocks}** full prompt blocks stay shared to the end.
    A 48-token prompt (on a block boundary) makes **{aligned_cow_events}** copies too: each fork
    rewrites the prompt's last token, in its last block (V0 reused sample 0's row: no copy).
    """)
    return (aligned_cow_events, parallel_blocks_unshared, parallel_blocks_used,
            parallel_cow_events, parallel_shared_after_fork, parallel_shared_blocks)


@app.cell
def _(PAGED, PROMPT_LEN, Request, SAMPLE_TOKENS, SamplingParams, llm, mo, prompt_ids, serve):
    # vLLM V1's way: n > 1 fans out into n child requests of one sample each (seed + i), and
    # the children share the prompt's *full* blocks through prefix caching (lesson 05); no
    # fork, no copy-on-write. minivllm's disaggregated front does exactly this
    # (minivllm/engine/disagg/disagg_llm.py), and so does LLMEngine.add_request for n > 1
    # (minivllm/engine/parallel_sampling.py). A full block is named in the cache as soon as
    # it is scheduled, as in V1, so children scheduled in the same step share it too.
    llm.reconfigure(**{**PAGED, "enable_prefix_caching": True})
    _fan = serve(llm, [Request(prompt_ids[:PROMPT_LEN], SamplingParams(
        temperature=0.8, seed=_i, max_tokens=SAMPLE_TOKENS, ignore_eos=True),
        arrival_step=min(_i, 1)) for _i in range(4)])
    fanout = {"prompt_tokens_computed": sum(_s.num_prefill_tokens for _s in _fan.steps),
              "hit_tokens": _fan.steps[-1].stats.prefix_cache_hit_tokens,
              "peak_blocks": max(_s.stats.num_blocks_used for _s in _fan.steps)}
    print(f"V1 fan-out, n=4: {fanout}")
    mo.md(f"""
    **vLLM V1's way, beside it.** The same `n = 4` as four child requests with prefix caching
    on: the prompt's {PROMPT_LEN // 16} full blocks are computed once and found in the cache
    by the other three children (**{fanout['hit_tokens']}** prompt tokens hit), while each
    child computes the partly filled block itself: **{fanout['prompt_tokens_computed']}**
    prompt tokens computed in all, against {PROMPT_LEN} with fork, at a peak of
    {fanout['peak_blocks']} blocks. V1 pays those few recomputed tokens to keep one code path:
    a child is an ordinary request; no fork, no per-sample groups, no copy-on-write.
    """)
    return (fanout,)


@app.cell
def _(mo):
    mo.md(r"""
    ## Beam search falls out of the same forks

    Beam search keeps the `k` most likely continuations ("beams") of one prompt: every step,
    each beam proposes its best next tokens, the `k` best extensions over all beams survive,
    and the rest die. Two beams often extend the same parent, so their histories are the
    same up to the fork. With block tables that costs nothing: a survivor that extends a beam
    already taken becomes a **fork** of it (V0's `fork_blocks`: same blocks, reference counts
    up), a beam no survivor extends is freed, and copy-on-write splits the one partly filled
    block when each writes to it. This is vLLM V0's design, run by minivllm's V0 scheduler
    (`minivllm/core/v0/beam_group.py`, through `llm.beam_search(..., method="fork")`).

    vLLM V1 took beam search out of the engine, into `LLM.beam_search` (in 0.33,
    `vllm/entrypoints/generate/beam_search/offline.py`): each beam is a one-token request whose
    prompt is its history; the sharing comes back from the prefix cache (lesson 05), a full block
    at a time, and each beam recomputes its last, partly filled block every step. minivllm has
    that too (`method="v1"`, the default). Both return transformers' beams
    (`generate(num_beams=k)`); what differs is what the engine computes and holds.
    """)
    return


@app.cell
def _(BeamSearchParams, PAGED, V0_SCHEDULER, collections, llm, prompt_ids):
    BEAM_WIDTH, BEAM_TOKENS, BEAM_PROMPT = 4, 24, 40

    def run_beams(method, caching=False):
        """One beam search on the paged engine; the live beams' block tables at every step,
        taken once the step is scheduled (copy-on-write done), and what the steps computed."""
        v0 = {"scheduler_cls": V0_SCHEDULER} if method == "fork" else {}   # V0's forks
        engine = llm.reconfigure(**{**PAGED, "enable_prefix_caching": caching, **v0}).engine
        snapshots = []

        def snapshot():                   # each beam is a request of its own in the core
            live = [s for s in engine.requests.values() if s.block_table and not s.is_finished]
            refs = collections.Counter(b for s in live for b in s.block_table)
            snapshots.append({
                "tables": [(s.request_id, s.num_computed_tokens, list(s.block_table))
                           for s in live],
                "ref_counts": dict(sorted(refs.items())), "blocks_used": len(refs),
                "blocks_unshared": sum(len(s.block_table) for s in live),
                "shared_blocks": sum(1 for c in refs.values() if c > 1)})
        engine.add_schedule_callback(snapshot)
        with engine.trace() as steps:     # (the trace counts the copies and the tokens)
            out = llm.beam_search([prompt_ids[:BEAM_PROMPT]], BeamSearchParams(
                beam_width=BEAM_WIDTH, max_tokens=BEAM_TOKENS, ignore_eos=True),
                method=method)[0]
        engine.remove_schedule_callback(snapshot)
        for i, snap in enumerate(snapshots):
            snap["cow"] = sum(r.num_blocks_copied for r in steps[:i + 1])
        return {"beams": [b.tokens[BEAM_PROMPT:] for b in out.sequences],
                "text": out.sequences[0].text, "snapshots": snapshots, "steps": len(steps),
                "computed": sum(r.num_batched_tokens for r in steps),
                "copies": sum(r.num_blocks_copied for r in steps)}

    forked_beams, v1_beams = run_beams("fork"), run_beams("v1", caching=True)
    print(f"beam search k={BEAM_WIDTH}, {BEAM_TOKENS} tokens: forks computed "
          f"{forked_beams['computed']} tokens in {forked_beams['steps']} steps, "
          f"{forked_beams['copies']} copies; V1's way {v1_beams['computed']} tokens; same "
          f"beams: {forked_beams['beams'] == v1_beams['beams']}")
    return BEAM_PROMPT, BEAM_TOKENS, BEAM_WIDTH, forked_beams, v1_beams


@app.cell
def _(BEAM_PROMPT, BEAM_TOKENS, BEAM_WIDTH, draw_parallel, forked_beams, mo, v1_beams):
    _snaps = forked_beams["snapshots"]
    _at = [(_s, _snaps[_s - 1]) for _s in (7, len(_snaps))]
    _fig = draw_parallel(_snaps, [
        (_s, f"step {_s}: {len(_x['tables'])} beams, {_x['shared_blocks']} shared blocks, "
             f"{_x['blocks_used']} in use, {_x['cow']} copies so far") for _s, _x in _at],
        who="beam")
    mo.vstack([_fig, mo.md(f"""
    Each beam is a request of its own in the core (a fork makes it; the boxes call it a sample),
    and the beams at step 7 are not the ones at the end: most die, and the survivors fork. In
    {forked_beams['steps']} steps the forks computed **{forked_beams['computed']}** tokens:
    the {BEAM_PROMPT}-token prompt once, then one token per beam per step, and made
    {forked_beams['copies']} block copies. V1's way found the same beams
    ({forked_beams['beams'] == v1_beams['beams']}) and computed
    **{v1_beams['computed']}** tokens, every beam's partly filled block again each step, with
    the prefix cache handing back the full ones. Best beam: …{forked_beams['text']!r}
    (k = {BEAM_WIDTH}, {BEAM_TOKENS} tokens, EOS ignored).
    """)])
    return


@app.cell
def _(mo):
    mo.md(r"""
    ### Exercise: predict the beams' blocks

    The same search: a **40**-token prompt, 16-token blocks, `k = 4` beams, prefix caching off.
    The first step prefills the prompt; every later step computes one new token of each beam.
    At step 7 the beams write the K/V of their **6th** generated token. How many physical
    blocks does the request hold then (copies included)? The checker reads the engine's count.
    """)
    beam_blocks_answer = mo.ui.number(start=0, stop=1000, value=0, label="blocks in use")
    beam_blocks_answer
    return (beam_blocks_answer,)


@app.cell
def _(forked_beams):
    beam_exercise_blocks = forked_beams["snapshots"][6]["blocks_used"]

    def check_beam_blocks(value):
        truth = beam_exercise_blocks
        if value == truth:
            return (f"Correct: {truth}. The prompt's 2 full blocks are shared by all four "
                    "beams; every beam writes its tokens 1-6 into the third block "
                    "(positions 40-45), and no two beams hold the same tokens, so each holds "
                    "its own copy of it.")
        if not value:
            return "Enter a number of blocks."
        if value == 3:
            return ("That keeps the third block shared. The beams differ in the tokens they "
                    "write there: each needs its own (copy-on-write).")
        if value == 12:
            return ("That gives every beam its own prompt. The two full prompt blocks are "
                    "written by no beam, so they stay shared.")
        if value in (5, 9):
            return ("Count the third block once per beam: one beam may keep the original, "
                    "the others hold copies, four blocks in all.")
        return (f"{value} is not it. Count the shared full prompt blocks once, then one block "
                "per beam for the block they write into.")
    return beam_exercise_blocks, check_beam_blocks


@app.cell
def _(beam_blocks_answer, check_beam_blocks, mo):
    _msg = check_beam_blocks(beam_blocks_answer.value)
    mo.callout(mo.md(_msg), kind="success" if _msg.startswith("Correct") else "neutral")
    return


@app.cell
def _(BEAM_PROMPT, BEAM_TOKENS, BEAM_WIDTH, BLOCK_SIZE, beam_exercise_blocks, check_beam_blocks,
      forked_beams, v1_beams):
    def test_forked_beams_are_v1_beams_and_compute_each_token_once():
        assert forked_beams["beams"] == v1_beams["beams"]
        assert forked_beams["steps"] == BEAM_TOKENS
        assert forked_beams["computed"] == BEAM_PROMPT + BEAM_WIDTH * (BEAM_TOKENS - 1)
        assert v1_beams["computed"] > forked_beams["computed"]

    def test_every_beam_shares_the_full_prompt_blocks():
        _full = BEAM_PROMPT // BLOCK_SIZE
        for _snap in forked_beams["snapshots"][1:]:
            _tables = _snap["tables"]
            assert len(_tables) == BEAM_WIDTH
            assert len({tuple(t[:_full]) for _, _, t in _tables}) == 1
            assert all(_snap["ref_counts"][b] == BEAM_WIDTH for b in _tables[0][2][:_full])
        _last = forked_beams["snapshots"][-1]
        assert _last["blocks_used"] < _last["blocks_unshared"]
        assert forked_beams["copies"] > 0

    def test_beam_exercise_checker():
        assert beam_exercise_blocks == BEAM_PROMPT // BLOCK_SIZE + BEAM_WIDTH == 6
        assert check_beam_blocks(6).startswith("Correct")
        for _wrong in (3, 12, 5, 9, 7):
            assert not check_beam_blocks(_wrong).startswith("Correct")
    return


@app.cell
def _(NUM_REQUESTS, mo):
    mo.md(f"""
    ## How big should a block be?

    Pages trade two costs. A large block wastes more of its tail: a sequence of `L` tokens
    reserves `ceil(L / block_size) * block_size` slots. A small block needs more block-table
    entries, and attention must look each one up and read K/V in shorter contiguous runs,
    which GPU kernels dislike. vLLM's default is 16. The slider computes both costs for this
    lesson's {NUM_REQUESTS} requests at their final lengths, with the engine's own `cdiv`.
    """)
    return


@app.cell
def _(MAX_MODEL_LEN, mo):
    block_size_pick = mo.ui.slider(steps=[2**_k for _k in range(12)], value=16,
                                   label="block_size", show_value=True)
    mo.md(f"""
    ### Try it: slide the block size all the way to {MAX_MODEL_LEN}

    {block_size_pick}
    """)
    return (block_size_pick,)


@app.cell
def _(block_size_pick, cdiv, mo, output_lens, plt, prompt_lens, static_utilization):
    final_lens = [int(_p + _o) for _p, _o in zip(prompt_lens, output_lens)]

    def block_costs(block_size, lens=final_lens):
        """(tail waste as a share of reserved slots, block-table entries) for `lens`."""
        entries = sum(cdiv(_l, block_size) for _l in lens)
        return 1 - sum(lens) / (entries * block_size), entries

    _sizes = [2**_k for _k in range(12)]
    _waste, _entries = zip(*(block_costs(_b) for _b in _sizes))
    _b = block_size_pick.value
    _w, _e = block_costs(_b)
    _fig, _ax = plt.subplots(figsize=(8, 3.2))
    _ax.plot(_sizes, [100 * _x for _x in _waste], "o-", color="tab:red")
    _ax.set_xscale("log", base=2)
    _ax.set_xlabel("block_size (tokens)")
    _ax.set_ylabel("tail waste, % of reserved", color="tab:red")
    _ax.axvline(_b, color="k", lw=1, ls="--")
    _ax2 = _ax.twinx()
    _ax2.plot(_sizes, _entries, "s-", color="tab:purple")
    _ax2.set_yscale("log")
    _ax2.set_ylabel("block-table entries", color="tab:purple")
    _ax.set_title(f"block_size {_b}: {_w:.1%} of reserved slots wasted, {_e:,} table entries")
    _fig.tight_layout()
    print(f"block_size {_b}: waste {_w:.1%}, {_e} block-table entries for "
          f"{len(final_lens)} requests")
    _note = (f"At {_b} tokens a block is as long as `max_model_len`: every request gets "
             f"exactly one, and you have rebuilt lesson 01's slab. Its waste here, "
             f"{_w:.1%}, is the slab's (measured over time above: "
             f"{1 - static_utilization:.1%}).") if _b == 2048 else (
             "Move the slider to the right end and look at what a block has become.")
    mo.vstack([_fig, mo.md(_note)])
    return block_costs, final_lens


@app.cell
def _(mo):
    mo.md(r"""
    ## Exercise: predict the blocks

    `block_size = 16`. Four requests arrive together and are prefilled in the same step:

    * three single-sample requests with prompts of **100**, **16** and **33** tokens;
    * one request with a **40**-token prompt and `n = 3` samples.

    Every sequence then decodes until it holds the K/V of **20** generated tokens in the
    cache. How many physical KV blocks are in use at that moment? The cell after the answer
    box runs exactly this on the engine, so the checker compares you with the real thing.
    """)
    blocks_answer = mo.ui.number(start=0, stop=10_000, value=0, label="blocks in use")
    blocks_answer
    return (blocks_answer,)


@app.cell
def _(EngineCoreRequest, PAGED, SamplingParams, V0_SCHEDULER, cdiv, llm, prompt_ids):
    def measure_exercise(generated=20):
        """Run the exercise's request set on the paged engine; count blocks when every
        sequence holds `generated` output tokens' K/V. Then abort it."""
        engine = llm.reconfigure(**PAGED, scheduler_cls=V0_SCHEDULER).engine
        ids = prompt_ids
        requests = [("ex-a", ids[:100], 1), ("ex-b", ids[:16], 1), ("ex-c", ids[:33], 1),
                    ("ex-d", ids[:40], 3)]
        for rid, prompt, n in requests:
            engine.engine_core.add_request(EngineCoreRequest(rid, prompt, SamplingParams(
                n=n, temperature=0.8, seed=1, max_tokens=generated + 5, ignore_eos=True)))
        for _ in range(generated + 1):     # step 1 prefills; each later step caches 1 token
            engine.step()
        held = [s.num_computed_tokens for rid, _, n in requests       # a fork's samples too
                for s in (engine.scheduler.groups[rid].seqs if n > 1 else [engine.requests[rid]])]
        used = engine.stats().num_blocks_used
        for rid, _, _ in requests:
            engine.abort_request(rid)
        return used, held

    exercise_blocks, exercise_held = measure_exercise()
    # The same number by hand: each single sample needs ceil(tokens / 16) blocks; the three
    # samples share the 2 full blocks of their prompt and own the rest (40 + 20 = 60 tokens).
    exercise_by_hand = (cdiv(120, 16) + cdiv(36, 16) + cdiv(53, 16)
                        + 40 // 16 + 3 * (cdiv(60, 16) - 40 // 16))
    print(f"exercise: the engine holds {exercise_blocks} blocks (tokens per sequence "
          f"{exercise_held}); by hand {exercise_by_hand}")
    return exercise_blocks, exercise_by_hand, exercise_held


@app.cell
def _(exercise_blocks):
    def check_blocks_answer(value):
        truth = exercise_blocks
        if value == truth:
            return (f"Correct: {truth} blocks. 120, 36 and 53 tokens need 8 + 3 + 4 blocks; "
                    "the three samples share the prompt's 2 full blocks and each owns 2 "
                    "more (a copy of the partly filled third block and a fresh fourth).")
        if not value:
            return "Enter a number of blocks."
        if value == 27:
            return ("That gives every sample its own copy of the prompt. The samples were "
                    "forked from one prefill: the full prompt blocks are shared by refcount.")
        if value == 21:
            return ("Close, but the prompt's third block is only half full (tokens 32-39). "
                    "Each sample's first new token lands in it, so each gets a private copy "
                    "(copy-on-write): it does not stay shared.")
        if value == 17:
            return ("That rounds down. A block that holds even one token is taken whole: "
                    "use ceil(tokens / 16).")
        if value == 20:
            return ("That packs all tokens into blocks as if they were one sequence. Each "
                    "sequence has its own block table and its own partly filled last block.")
        if value == 14:
            return "That counts only the prompts: add the 20 generated tokens per sequence."
        return (f"{value} is not it. For each sequence count ceil(tokens / 16), then count "
                "the blocks the three samples share only once.")
    return (check_blocks_answer,)


@app.cell
def _(blocks_answer, check_blocks_answer, mo):
    _msg = check_blocks_answer(blocks_answer.value)
    mo.callout(mo.md(_msg), kind="success" if _msg.startswith("Correct") else "neutral")
    return


@app.cell
def _(mo):
    # Shown at the end, under "Where the code lives".
    v1_box = mo.callout(mo.md(r"""
    **In vLLM V1** (as of vLLM 0.33). The pool is `BlockPool` (`vllm/v1/core/block_pool.py`):
    each `KVCacheBlock` (`vllm/v1/core/kv_cache_utils.py`) has its own `ref_cnt`; free blocks
    wait in `free_block_queue`, in eviction order. The scheduler calls `KVCacheManager`
    (`vllm/v1/core/kv_cache_manager.py`): `get_computed_blocks` at admission, `allocate_slots`
    for each step's new tokens. The worker's `BlockTables` (`vllm/v1/worker/gpu/block_table.py`,
    Model Runner V2) keeps each request's row of block ids, takes only new ids
    (`append_block_ids`) and fills the slot mapping on the GPU. V1 has no fork and no
    copy-on-write: `n > 1` fans out into one-sample requests that share full blocks through the
    prefix cache; so does minivllm's `LLMEngine`. Its V0 scheduler keeps the fork to show
    reference counts (`BlockManager.ref_counts`) and copy-on-write; `ModelRunner.prepare`
    rebuilds block tables and `slot_mapping` in Python every step: slower, easy to follow.
    """), kind="info")
    return (v1_box,)


@app.cell
def _(PROMPT_LEN, aligned_cow_events, block_costs, exercise_blocks, forked_beams, mo,
      paged_concurrency, paged_utilization, parallel_blocks_unshared, parallel_blocks_used,
      parallel_cow_events, parallel_shared_after_fork, parallel_shared_blocks,
      predicted_static_waste, static_concurrency, static_utilization, v1_beams, v1_box):
    findings = {
        "static_kv_utilization": float(static_utilization),
        "paged_kv_utilization": float(paged_utilization),
        "static_max_running": int(static_concurrency),
        "paged_max_running": int(paged_concurrency),
        "parallel_n4_shared_blocks_after_fork": int(parallel_shared_after_fork),
        "parallel_n4_shared_blocks": int(parallel_shared_blocks),
        "parallel_n4_copy_on_write": int(parallel_cow_events),
        "parallel_n4_blocks_used": int(parallel_blocks_used),
        "parallel_n4_blocks_unshared": int(parallel_blocks_unshared),
        "aligned_prompt_copy_on_write": int(aligned_cow_events),
        "beam_k4_tokens_computed_fork": int(forked_beams["computed"]),
        "beam_k4_tokens_computed_v1": int(v1_beams["computed"]),
        "exercise_blocks": int(exercise_blocks),
        "tail_waste_block_16": float(block_costs(16)[0]),
        "predicted_static_waste": float(predicted_static_waste),
    }
    print("findings:", findings)

    mo.vstack([mo.md(f"""
    ## What we found

    * With the same KV budget, slabs used **{static_utilization:.1%}** of the memory they
      reserved and ran **{static_concurrency}** requests at once; 16-token pages used
      **{paged_utilization:.1%}** and ran all **{paged_concurrency}**.
    * Parallel sampling with `n = 4` on a {PROMPT_LEN}-token prompt: {parallel_shared_after_fork}
      blocks shared right after the fork, **{parallel_shared_blocks}** still shared after
      **{parallel_cow_events}** copy-on-write events, {parallel_blocks_used} blocks in use
      instead of {parallel_blocks_unshared}. A block-aligned prompt needs
      {aligned_cow_events} copies.
    * Beam search on forks (k = 4, 24 tokens): **{forked_beams['computed']}** tokens
      computed, each once; V1's one-token requests found the same beams computing
      {v1_beams['computed']}, the partly filled block of every beam again each step.
    * Tail waste grows with the block size while the table shrinks: {block_costs(16)[0]:.1%}
      of the reserved slots at 16 tokens per block, {block_costs(2048)[0]:.1%} at 2048,
      where a block is as long as `max_model_len` and a page is a slab again.

    ## Where the code lives

    * `minivllm/core/block_manager.py`: `BlockManager` (`allocate`, `append_slots` with
      copy-on-write, `free`, `ref_counts`) and `cdiv`.
    * `minivllm/core/request.py`: `Request.block_table` and `num_computed_tokens`.
    * `minivllm/attention/torch_attention.py`: `paged_attention` gathers each sequence's K/V
      through its block table; `write_kv_cache` scatters new K/V into slots.
    * `minivllm/worker/model_runner.py`: `copy_blocks` performs the copies `append_slots` asks for.
    * `minivllm/core/scheduler.py`: admission (`can_allocate`, `can_append_slots`); `core/v0/`:
      V0's scheduler (`fork`, `fork_blocks`) and `beam_group.py` (beams forked round by round);
      `minivllm/beam_search.py`: V1's way, the shared rules; `core/kv_cache.py`: the slabs.
    * Next: lesson 03 makes attention over these blocks fast (FlashAttention), lesson 04
      uses the freed memory to keep the batch full (continuous batching), and lesson 05
      turns prefix caching back on: blocks shared across requests, same reference counts.
    """), v1_box])
    return (findings,)


@app.cell
def _(BLOCK_SIZE, PROMPT_LEN, aligned_cow_events, check_blocks_answer, check_cow_guess,
      cow_guess, exercise_blocks, exercise_by_hand, fanout, paged_concurrency, paged_utilization,
      parallel_blocks_unshared, parallel_blocks_used, parallel_cow_events,
      parallel_shared_after_fork, parallel_shared_blocks, predicted_static_waste, shared_guess,
      static_concurrency, static_utilization):
    def test_slab_waste_is_max_model_len_against_mean_length():
        # The engine's measured waste against 1 - mean held / max_model_len from the lengths.
        assert abs(predicted_static_waste - (1 - static_utilization)) < 0.02

    def test_paged_uses_more_of_its_memory_than_slabs():
        assert paged_utilization > static_utilization
        assert paged_utilization >= 0.95, f"paged utilization {paged_utilization:.1%}"

    def test_paged_runs_more_requests_in_the_same_budget():
        assert paged_concurrency > static_concurrency

    def test_parallel_samples_share_the_full_prompt_blocks():
        # 40 tokens = 2 full blocks + 8 tokens: all 3 shared after the fork, then the partly
        # filled one is copied by 3 of the 4 samples; the 2 full ones stay shared.
        assert parallel_shared_after_fork == -(-PROMPT_LEN // BLOCK_SIZE) == 3
        assert parallel_shared_blocks == PROMPT_LEN // BLOCK_SIZE == 2
        assert parallel_cow_events == 4 - 1
        assert aligned_cow_events == 4 - 1      # the forks recompute the last prompt token
        assert parallel_blocks_used < parallel_blocks_unshared

    def test_v1_fan_out_shares_full_blocks_through_the_prefix_cache():
        # Four one-sample children: the 2 full prompt blocks are computed once and hit by 3
        # children; each child computes the partly filled block's 8 tokens.
        _full = PROMPT_LEN // BLOCK_SIZE * BLOCK_SIZE
        assert fanout["hit_tokens"] == 3 * _full
        assert fanout["prompt_tokens_computed"] == PROMPT_LEN + 3 * (PROMPT_LEN - _full)

    def test_exercise_checker():
        assert exercise_blocks == exercise_by_hand == 23
        assert check_blocks_answer(23).startswith("Correct")
        for wrong in (27, 21, 17, 20, 14, 5):
            assert not check_blocks_answer(wrong).startswith("Correct")
        assert "copy-on-write" in check_blocks_answer(21)

    def test_the_engine_checks_the_copy_guess():
        # The headless run answered 3 copies and 2 shared blocks for n = 4; the engine's own
        # counts decide, and a copy per sample or a shared third block is turned down.
        assert check_cow_guess(4, cow_guess.value, shared_guess.value).startswith("Correct")
        for _copies, _shared in ((4, 2), (3, 3), (0, 2), (4, 3)):
            assert not check_cow_guess(4, _copies, _shared).startswith("Correct")
        assert "keeps the original" in check_cow_guess(4, 4, 2)
    return


if __name__ == "__main__":
    app.run()
