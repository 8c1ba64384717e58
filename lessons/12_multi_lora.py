import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell
def _():
    import runpy
    import time

    import marimo as mo
    import matplotlib.pyplot as plt
    import numpy as np
    import torch

    from minivllm import LLM, LoRARequest, SamplingParams
    return LLM, LoRARequest, SamplingParams, mo, np, plt, runpy, time, torch


@app.cell
def _(mo):
    mo.md(r"""
    # 12 · Multi-LoRA: one base model, many fine-tunes, one batch

    After this lesson you can explain why a server that hosts hundreds of fine-tuned
    variants of one model never merges them into the weights, what the two small matmuls
    of a LoRA adapter cost next to the base layer, and how one forward pass serves tokens
    that each use a different adapter (Punica's BGMV and SGMV kernels; S-LoRA added
    unified paging of adapters and KV in one memory pool, with kernels of its own, MBGMM and
    MBGMV). You will serve four
    real adapters and the base model in one batch, watch the adapter slots fill and evict,
    and find the setting that refuses an adapter outright.

    Lesson 11 let requests compete for KV blocks and paid for a pool that was too small in
    extra steps. This lesson shares a second kind of memory the same way: slots for fine-tuned
    adapters over one base model.
    """)
    return


@app.cell
def _(LLM, LoRARequest, mo, runpy, torch):
    # The adapters were made by scripts/lora_adapters.py with PEFT and ship beside it (4.3 MB):
    # each one learned to open every answer with its own phrase. Only if the script's recipe
    # changes are they trained again, here, printing every step (minutes on a CPU).
    adapters_script = runpy.run_path(str(mo.notebook_dir().parent / "scripts" /
                                         "lora_adapters.py"))
    ADAPTERS = adapters_script["ADAPTERS"]
    chat_prompt = adapters_script["chat_prompt"]
    _paths = adapters_script["ensure_adapters"]()
    loras = {name: LoRARequest(name, i + 1, str(_paths[name]))
             for i, name in enumerate(ADAPTERS)}
    llm = LLM(max_model_len=512, enable_lora=True, max_loras=4, max_lora_rank=16,
              enable_prefix_caching=False, enforce_eager=True)   # LoRA: no CUDA graphs
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    mo.md(f"**running on:** {device} · **model:** SmolLM2-135M-Instruct "
          f"({str(llm.engine.dtype).removeprefix('torch.')}) · **adapters:** "
          + ", ".join(f"{n} (r={a[1]}, {len(a[3])} projections)" for n, a in ADAPTERS.items())
          + f"  \n`{llm.engine!r}`")
    return ADAPTERS, chat_prompt, llm, loras


@app.cell
def _(mo):
    mo.md(r"""
    ## Why a multi-tenant server never merges

    A LoRA adapter (Hu et al. 2021) leaves a linear layer's weight $W$ ($N \times K$)
    frozen and learns two thin matrices, $A$ ($r \times K$) and $B$ ($N \times r$), with a
    rank $r$ of 2 to 64. The adapted layer computes $y = xW^\top + s\,(xA^\top)B^\top$, where
    $s$ = `lora_alpha / r`. For one user you would merge: $W' = W + sBA$ costs nothing per
    token. For a thousand users, merging means a thousand copies of $W$. Here is what that
    costs for this model, measured on the adapters just loaded.
    """)
    return


@app.cell
def _(ADAPTERS, chat_prompt, llm, loras, np, plt):
    # Read each adapter once (a one-token request loads it into host memory and a slot).
    llm.generate([chat_prompt("Hi")] * len(loras), None, lora_request=list(loras.values()),
                 use_tqdm=False)
    _stats = llm.engine.runner.lora_manager.stats()
    model_bytes = sum(p.numel() * p.element_size()
                      for p in llm.engine.runner.model.parameters())
    adapter_bytes = {n: llm.engine.runner.lora_manager.cpu_cache[r.lora_int_id].nbytes
                     for n, r in loras.items()}
    slot_bytes = _stats["slot_bytes"]
    _tenants = np.array([1, 10, 100, 1000])
    _mean = np.mean(list(adapter_bytes.values()))
    _fig, _ax = plt.subplots(figsize=(6.5, 3))
    _ax.plot(_tenants, _tenants * model_bytes / 2**30, "o-", label="merged: a model per tenant")
    _ax.plot(_tenants, (model_bytes + _tenants * slot_bytes) / 2**30, "o-",
             label="base + one rank-16 slot per tenant")
    _ax.plot(_tenants, (model_bytes + _tenants * _mean) / 2**30, "o-",
             label="base + the adapters as trained")
    _ax.set_xscale("log")
    _ax.set_yscale("log")
    _ax.set_xlabel("tenants (adapters)")
    _ax.set_ylabel("GiB")
    _ax.legend(fontsize=8)
    _fig.tight_layout()
    print(f"model {model_bytes / 2**20:.0f} MiB; one slot {slot_bytes / 2**20:.1f} MiB; "
          "adapters " + ", ".join(f"{n} {b / 2**20:.2f} MiB" for n, b in adapter_bytes.items()))
    merged_over_slot = model_bytes / slot_bytes
    _fig
    return adapter_bytes, merged_over_slot, model_bytes, slot_bytes


@app.cell
def _(ADAPTERS, adapter_bytes, merged_over_slot, mo, model_bytes, slot_bytes):
    mo.md(f"""
    One merged copy of this 135M-parameter model is **{model_bytes / 2**20:.0f} MiB**. A slot
    that can hold any adapter up to rank 16 on all seven projections of all 30 layers is
    **{slot_bytes / 2**20:.1f} MiB**, {merged_over_slot:.0f}x less, and the adapters as
    trained are smaller still (pirate, rank {ADAPTERS['pirate'][1]} on two projections of
    the last six layers: **{adapter_bytes['pirate'] / 2**20:.2f} MiB**). For a 7B model the
    ratio is the same order: 14 GB per merged copy against tens of MB per adapter. So the
    server keeps one base model and many adapters, and pays for the adapters at run time.
    """)
    return


@app.cell
def _(mo):
    mo.md(r"""
    ## Shrink, then expand

    The run-time cost is two matmuls per adapted layer, through a rank-$r$ bottleneck:
    **shrink** $x A^\top$ takes each token from $K$ numbers down to $r$, **expand** takes the
    $r$ numbers up to $N$ and adds them into the base output. For a batch in which every
    token may use a different adapter, kernels/lora.py stacks all slots in one tensor,
    `lora_a` $(S, R, K)$ and `lora_b` $(S, N, R)$, zero-padded to the largest rank $R$, and
    gives each token its slot: **BGMV** reads one slot index per token (decode: one token
    per sequence), **SGMV** one per segment of consecutive tokens (a prefill's hundreds of
    tokens become one tiled matmul). Slot $-1$ is the base model: nothing is added.
    """)
    return


@app.cell
def _(llm, np, plt):
    # The shapes for q_proj of this model, a batch of T tokens, rank r; and what they cost.
    _K, _N = llm.engine.runner.lora_manager.shapes["q_proj"][::-1]
    T_DRAW, R_DRAW = 8, 16
    lora_flop_share = (R_DRAW * (_K + _N)) / (_K * _N)
    _fig, _ax = plt.subplots(figsize=(8, 2.6))
    _boxes = [("x", T_DRAW, _K, 0), ("A\u1d40", _K, R_DRAW, 1), ("buf", T_DRAW, R_DRAW, 2),
              ("B\u1d40", R_DRAW, _N, 3), ("y +=", T_DRAW, _N, 4)]
    _scale = 1 / 120
    _x0 = 0.0
    for _name, _rows, _cols, _i in _boxes:
        _w, _h = _cols * _scale, _rows * _scale
        _ax.add_patch(plt.Rectangle((_x0, -_h / 2), _w, _h, color=f"C{_i}", alpha=0.6))
        _ax.text(_x0 + _w / 2, _h / 2 + 0.15, f"{_name}\n({_rows} x {_cols})", ha="center",
                 fontsize=8)
        _x0 += _w + 0.8
    _ax.set_xlim(-0.3, _x0)
    _ax.set_ylim(-3, 3)
    _ax.axis("off")
    _ax.set_title(f"q_proj, T={T_DRAW} tokens, r={R_DRAW}: shrink (x A\u1d40), then expand "
                  f"(buf B\u1d40) into y", fontsize=9)
    print(f"LoRA adds {lora_flop_share:.1%} of the base layer's FLOPs at r={R_DRAW} "
          f"(2 T r (K + N) vs 2 T K N with K={_K}, N={_N})")
    _fig
    return (lora_flop_share,)


@app.cell
def _(lora_flop_share, mo):
    mo.md(f"""
    A rank-16 adapter on `q_proj` adds **{lora_flop_share:.1%}** to its FLOPs. The catch is
    not arithmetic but shape: the matmuls are thin, and they differ per token. A naive
    server would loop over adapters and launch a tiny matmul for each; the grouped kernels
    do the whole step's tokens in one launch per layer. On this CPU, minivllm runs the torch
    reference (one matmul per adapter present in the step); on CUDA it runs the Triton
    kernels, BGMV for decode-only steps and SGMV when a step carries a prefill.
    """)
    return


@app.cell
def _(mo):
    mo.md(r"""
    ## One batch, five behaviours

    The same question goes to the base model and to each adapter, in **one** `generate`
    call: `lora_request` takes one `LoRARequest` per prompt (`None` is the base). The trace
    shows which adapters shared each step.
    """)
    return


@app.cell
def _(SamplingParams, chat_prompt, llm, loras, time):
    QUESTION = "What should I cook for dinner tonight?"
    GREEDY = SamplingParams(temperature=0, max_tokens=12)
    who = [None, *loras.values()]
    print("serving the base model and four adapters in one batch, then each alone ...",
          flush=True)
    _t0 = time.perf_counter()
    with llm.engine.trace() as _steps:
        mixed_outs = llm.generate([chat_prompt(QUESTION)] * len(who), GREEDY, lora_request=who,
                                  use_tqdm=False)
    mixed_s = time.perf_counter() - _t0
    mixed_steps = len(_steps)
    adapters_per_step = [len({s.lora_int_id for s in st.scheduled}) for st in _steps]
    for _r, _o in zip(who, mixed_outs):
        print(f"{_r.lora_name if _r else 'base':>7}: {_o.outputs[0].text!r}")
    # Each alone, to check that sharing a batch changed nothing.
    alone = [llm.generate(chat_prompt(QUESTION), GREEDY, lora_request=_r, use_tqdm=False)[0]
             for _r in who]
    mixed_equals_alone = ([o.outputs[0].token_ids for o in mixed_outs]
                          == [o.outputs[0].token_ids for o in alone])
    print(f"{mixed_steps} steps, adapters (base counted) per step: {adapters_per_step}; "
          f"{mixed_s:.1f} s; identical to each alone: {mixed_equals_alone}")
    return GREEDY, adapters_per_step, mixed_equals_alone, mixed_outs, mixed_steps, who


@app.cell
def _(mo):
    mo.md(r"""
    ## How many adapters fit, and what if they do not

    The engine has `max_loras` slots, each as large as `max_lora_rank` allows. The
    scheduler never runs more distinct adapters in one step than there are slots, so when
    more adapters are wanted, requests wait for a slot, and the least recently used
    adapter is evicted from its slot (it stays in host memory, up to `max_cpu_loras`, so
    coming back costs a copy, not a disk read). An adapter whose rank exceeds
    `max_lora_rank` cannot fit any slot: it is refused when the request is added. Move the
    controls and watch the steps, the evictions and the refusals.
    """)
    slots_ui = mo.ui.slider(1, 4, value=4, label="max_loras (slots)", show_value=True)
    rank_ui = mo.ui.dropdown(["2", "4", "8", "16"], value="16", label="max_lora_rank")
    mo.hstack([slots_ui, rank_ui])
    return rank_ui, slots_ui


@app.cell
def _(GREEDY, chat_prompt, llm, loras, rank_ui, slots_ui):
    def serve_with(max_loras: int, max_rank: int, n_per_adapter: int = 2) -> dict:
        """Two requests per adapter, all at once, with these slots; counts from the trace."""
        llm.reconfigure(enable_lora=True, max_loras=max_loras, max_lora_rank=max_rank)
        refused, served = {}, []
        for _r in loras.values():                 # the engine checks an adapter when added
            try:
                llm.engine.add_request(f"probe-{_r.lora_name}", chat_prompt("Hi"), GREEDY, _r)
                llm.engine.abort_request(f"probe-{_r.lora_name}")
                served.append(_r)
            except ValueError as e:
                refused[_r.lora_name] = str(e).split(": ", 1)[-1]
        prompts = [chat_prompt(f"Question {i}: name a colour.") for i in range(
            n_per_adapter * len(served))]
        per_prompt = [_r for _r in served for _ in range(n_per_adapter)]
        with llm.engine.trace() as steps:
            llm.generate(prompts, GREEDY, lora_request=per_prompt, use_tqdm=False)
        stats = llm.engine.runner.lora_manager.stats()
        return {"steps": len(steps), "evictions": stats["num_slot_evictions"],
                "slot_loads": stats["num_slot_loads"], "refused": refused,
                "most_adapters_in_a_step": max(
                    len({s.lora_int_id for s in st.scheduled} - {0}) for st in steps),
                "slot_mib": stats["slot_bytes"] / 2**20}

    widget_run = serve_with(slots_ui.value, int(rank_ui.value))
    print(widget_run)
    return serve_with, widget_run


@app.cell
def _(mo, widget_run):
    _refused = "".join(f"\n    * **{n}** refused: {msg}" for n, msg in
                       widget_run["refused"].items()) or " none"
    mo.md(f"""
    **{widget_run['steps']}** steps; at most **{widget_run['most_adapters_in_a_step']}**
    adapters in one step; **{widget_run['slot_loads']}** copies into a slot,
    **{widget_run['evictions']}** evictions; one slot is
    **{widget_run['slot_mib']:.1f} MiB**. Refused adapters:{_refused}

    With four slots, all the adapters run together and the batch finishes in the steps one
    adapter alone would need. With one slot, the same requests go adapter by adapter: close
    to four times the steps (the adapters stop at different lengths), each step less full.
    Lower the rank below 16 and the yoda adapter (r=16) no longer fits any slot, though the
    smaller ones still run.
    """)
    return


@app.cell
def _(serve_with):
    # The two ends of the slider, measured once for the findings (counts, not seconds).
    print("serving the mixed requests with 1 and 4 adapter slots, then rank 8 ...", flush=True)
    by_slots = {n: serve_with(n, 16) for n in (1, 4)}
    low_rank = serve_with(4, 8)
    print({n: (r["steps"], r["evictions"]) for n, r in by_slots.items()},
          sorted(low_rank["refused"]))
    return by_slots, low_rank


@app.cell
def _(mo):
    mo.md(r"""
    ## Exercise: size a slot

    A slot must hold, for every one of the 30 layers, A and B for all seven projections
    (q, k, v, o, gate, up, down) at `max_lora_rank` = 16, in fp32. SmolLM2-135M has hidden
    size 576, 9 query heads and 3 KV heads of dimension 64, and an MLP of width 1536. How
    many MiB is one slot? (The checker compares with the engine's own count.)
    """)
    slot_answer = mo.ui.number(start=0, stop=1000, step=0.1, value=0, label="MiB per slot")
    slot_answer
    return (slot_answer,)


@app.cell
def _(slot_bytes):
    def check_slot(mib: float) -> str:
        truth = slot_bytes / 2**20
        if not mib:
            return "Enter a number of MiB."
        if abs(mib - truth) / truth < 0.02:
            return f"Correct: {truth:.2f} MiB (30 layers x 16 x sum of (K + N) x 4 bytes)."
        if abs(mib - truth / 2) / truth < 0.05:
            return "Half of it: each projection needs A (r x K) *and* B (N x r)."
        if abs(mib - truth / 30) / truth < 0.05:
            return "That is one layer: multiply by the 30 layers."
        if abs(mib - truth * 1.048576) / truth < 0.02:
            return "That is megabytes (10^6); MiB is 2^20 bytes."
        if abs(mib - truth / 4 * 2) / truth < 0.05 or abs(mib - truth / 2 * 1) < 0.01:
            return "Check the bytes per number: fp32 is 4 bytes."
        return ("Not yet: k_proj and v_proj output only 3 x 64 = 192; gate and up map 576 to "
                "1536, down maps back. Add (K + N) over the seven, times r, 4 bytes, 30 layers.")
    return (check_slot,)


@app.cell
def _(check_slot, mo, slot_answer):
    _msg = check_slot(slot_answer.value)
    mo.callout(mo.md(_msg), kind="success" if _msg.startswith("Correct") else "neutral")
    return


@app.cell
def _(
    ADAPTERS,
    adapters_per_step,
    by_slots,
    check_slot,
    low_rank,
    merged_over_slot,
    mixed_equals_alone,
    mixed_outs,
    slot_bytes,
    who,
):
    def test_each_adapter_shows_its_behaviour_in_one_batch():
        assert max(adapters_per_step) == 1 + len(ADAPTERS)     # base + four in one step
        for _r, _o in zip(who, mixed_outs):
            if _r is not None:
                assert _o.outputs[0].text.startswith(ADAPTERS[_r.lora_name][0])
        assert mixed_equals_alone

    def test_fewer_slots_more_steps_and_evictions():
        assert by_slots[1]["most_adapters_in_a_step"] == 1
        assert by_slots[4]["most_adapters_in_a_step"] == 4
        assert by_slots[1]["steps"] > 2 * by_slots[4]["steps"]
        assert by_slots[1]["evictions"] >= 3 and by_slots[4]["evictions"] == 0

    def test_low_rank_refuses_only_the_big_adapter():
        assert sorted(low_rank["refused"]) == ["yoda"]
        assert "max_lora_rank=8" in low_rank["refused"]["yoda"]

    def test_merging_costs_far_more_than_a_slot():
        assert merged_over_slot > 20

    def test_exercise_checker():
        assert check_slot(slot_bytes / 2**20).startswith("Correct")
        assert "B (N x r)" in check_slot(slot_bytes / 2**21)
        assert "30 layers" in check_slot(slot_bytes / 2**20 / 30)
    return


@app.cell
def _(mo):
    # Shown at the end, under "Where the code lives".
    v1_box = mo.callout(mo.md(r"""
    **In vLLM V1** (as of vLLM 0.33). `LoRAModelManager` (`vllm/lora/model_manager.py`;
    `vllm/lora/models.py` in older releases) wraps each target linear in a layer of
    `vllm/lora/layers/` that stacks `max_loras` GPU slots, and keeps up to `max_cpu_loras`
    adapters in host memory, both LRU. The model runner's `LoRAModelRunnerMixin`
    (`vllm/v1/worker/lora_model_runner_mixin.py`) sets each step's adapters and token-to-slot
    map; the punica wrapper (`vllm/lora/punica_wrapper/punica_gpu.py`) then runs the Triton
    kernels `lora_shrink` and `lora_expand` (`vllm/lora/ops/triton_ops/`), and the scheduler
    lets at most `max_loras` adapters into a step. minivllm has the same slots, LRU and check,
    but keeps the older kernel pair, BGMV for decode and SGMV for prefill segments, to show
    both batch shapes.
    """), kind="info")
    return (v1_box,)


@app.cell
def _(
    adapter_bytes,
    adapters_per_step,
    by_slots,
    lora_flop_share,
    low_rank,
    merged_over_slot,
    mixed_steps,
    mo,
    slot_bytes,
    v1_box,
):
    findings = {
        "merged_copy_over_slot": round(merged_over_slot, 1),
        "slot_mib": round(slot_bytes / 2**20, 2),
        "adapter_mib": {n: round(b / 2**20, 3) for n, b in adapter_bytes.items()},
        "lora_flop_share_q_proj_r16": round(lora_flop_share, 4),
        "mixed_batch_steps": mixed_steps,
        "max_adapters_in_one_step": max(adapters_per_step),
        "steps_by_max_loras": {str(n): r["steps"] for n, r in by_slots.items()},
        "evictions_by_max_loras": {str(n): r["evictions"] for n, r in by_slots.items()},
        "refused_at_rank_8": sorted(low_rank["refused"]),
    }
    print("findings:", findings)
    mo.vstack([mo.md(f"""
    ## What we found

    * A merged copy of the model costs **{merged_over_slot:.0f}x** a rank-16 adapter slot;
      multi-tenant serving keeps one base and many adapters.
    * One batch served the base model and four adapters together
      (**{max(adapters_per_step)}** behaviours in one step), token for token as each alone.
    * With one slot instead of four, the same requests took
      **{by_slots[1]['steps']}** steps instead of **{by_slots[4]['steps']}**, with
      **{by_slots[1]['evictions']}** evictions.

    The adapters are small; the base model's weights are not, and every decode step reads all
    of them, whichever adapters ride along. Next, lesson 13: what do weights and KV stored in 8
    or 4 bits save in bytes and concurrent sequences, and what do they cost in perplexity?

    ## Where the code lives

    * `minivllm/lora/`: `LoRARequest` (request.py), `LoRALinear` (layers.py: base output
      plus shrink/expand over stacked slots), `load_adapter` (models.py: PEFT's files, scale
      `lora_alpha / r`), `LoRAManager.set_batch` (each token's slot, once per step) and its
      LRU slots.
    * `kernels/lora.py`: the BGMV and SGMV shrink/expand kernels and their torch reference.
    * `minivllm/core/scheduler.py`: `Scheduler._lora_fits`, at most `max_loras` adapters running.
    * `minivllm/engine/llm_engine.py`: `add_request(..., lora_request)` checks the adapter and puts its
      id into the prefix-cache key (`Request.extra_keys`).
    * `scripts/lora_adapters.py`: how the four adapters were trained with PEFT.
    """), v1_box])
    return (findings,)


if __name__ == "__main__":
    app.run()
