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
    from minivllm.workloads import Request, serve
    return LLM, Request, SamplingParams, mo, np, plt, serve, torch


@app.cell
def _(mo):
    mo.md(r"""
    # 07 · Speculative decoding: several tokens from one forward, exactly

    After this lesson you can explain why checking five guessed tokens costs about as much
    as producing one, state the rule that accepts or rejects each guess so that the output
    is *exactly* what the model alone would have produced, predict the tokens a step yields
    from the acceptance rate, and say when speculation wins and when it loses. You will run
    the engine's n-gram proposer (prompt lookup) on the real model and read every
    verification from the step trace.

    Lesson 06 left every stream paced by the engine's step: one token per sequence per step,
    and at batch 1 that step reads every weight of the model for a single token. This lesson
    asks whether one forward pass can give a sequence several tokens and still write exactly
    what the model alone would.
    """)
    return


@app.cell
def _(LLM, mo, torch):
    # One loaded model. Each run below calls llm.reconfigure(...) with its own settings (a
    # fresh KV pool over the same weights). Prefix caching is off so that every run of the
    # same prompt costs the same; speculation is switched on and off per run.
    llm = LLM(max_model_len=512, num_kv_blocks=128, enable_prefix_caching=False)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    mo.md(f"**running on:** {device} · **model:** SmolLM2-135M-Instruct "
          f"({str(llm.engine.dtype).removeprefix('torch.')})  \n`{llm.engine!r}`")
    return device, llm


@app.cell
def _(mo):
    mo.md(r"""
    ## The asymmetry: checking k tokens costs about one step

    A decode step computes one new token per sequence, and to do it reads every weight of
    the model (lesson 01). At batch 1 that read sets the time: the arithmetic for one token is
    tiny next to it. Feed the same forward pass 5 tokens of one sequence instead of 1 and the
    weights are still read once; only the arithmetic, which was idle, grows.

    So if someone handed us k plausible next tokens, one forward over
    `[last token, guess 1, ..., guess k]` would give the model's own prediction after each of
    them, and we could keep every guess the model agrees with. A verification is nothing
    more than a small prefill chunk of k + 1 tokens on top of the cached context.

    We measure that directly: the same 48-token prompt prefilled in chunks of T tokens (the
    engine's chunked prefill with a budget of T tokens per step), so each step is one forward
    of T new tokens over a growing cached context, exactly the shape of a verification. Each
    T is timed over at least 24 forwards (the prompt served again until there are that many),
    and the median kept: one run's handful of steps on a shared machine gave a cost per draft
    token that jumped up and down with k. If the medians still do not grow with T, the lesson
    refuses to fit a cost model to them and says so.
    """)
    return


@app.cell
def _(Request, SamplingParams, llm, np, serve):
    # Text that the model will be asked to copy: the case where prompt lookup shines.
    PASSAGE = (
        "Serving a language model is mostly a memory problem. Each request keeps the keys and "
        "values of its context, and the engine decides where they live, which requests share "
        "a step, and what to do when memory runs out. Paged attention cuts that memory into "
        "blocks, so no request reserves more than it uses. Continuous batching lets a new "
        "request join the batch as soon as another one finishes.")
    _ids = llm.tokenizer.encode(PASSAGE)
    CHUNKS = [1, 2, 3, 5, 9, 17]              # T = k + 1 for k = 0, 1, 2, 4, 8, 16

    def time_per_forward(T, prompt_len=48, min_forwards=24):
        """Median seconds of a step that computes T new tokens of one sequence, over at least
        min_forwards such steps (the prompt served again, one request at a time)."""
        llm.reconfigure(enable_chunked_prefill=True, max_num_batched_tokens=max(T, 1),
                        max_num_seqs=1, speculative_config=None)
        _repeats = -(-min_forwards // (prompt_len // T))
        res = serve(llm, [Request(_ids[:prompt_len], SamplingParams(temperature=0, max_tokens=1))
                          for _ in range(_repeats)])
        full = [s.duration for s in res.steps if s.num_batched_tokens == T]
        return float(np.median(full)), len(full)

    serve(llm, [Request(_ids[:8], SamplingParams(max_tokens=2))])      # warm-up
    chunk_s = {}
    for _T in CHUNKS:
        print(f"timing forwards of T = {_T} tokens ...", flush=True)    # progress, ~5 s each
        chunk_s[_T] = time_per_forward(_T)
    cost_ratio = {T: chunk_s[T][0] / chunk_s[1][0] for T in CHUNKS}
    # A cost model is fitted only to medians that grow with T (5% slack for noise); otherwise
    # it is refused (c_of_k None) and every verdict below rests on counts alone.
    cost_monotone = all(cost_ratio[b] >= 0.95 * cost_ratio[a]
                        for a, b in zip(CHUNKS, CHUNKS[1:]))
    # c for each k: the extra cost of each draft token in a verifying forward, as a fraction
    # of a one-token step, t(k + 1) / t(1) = 1 + c k.
    c_of_k = ({T - 1: (cost_ratio[T] - 1) / (T - 1) for T in CHUNKS if T > 1}
              if cost_monotone else None)
    return CHUNKS, PASSAGE, c_of_k, chunk_s, cost_monotone, cost_ratio


@app.cell
def _(CHUNKS, c_of_k, chunk_s, cost_ratio, device, mo, plt):
    _fig, _ax = plt.subplots(figsize=(7, 3.2))
    _ax.plot(CHUNKS, [1000 * chunk_s[T][0] for T in CHUNKS], "o-", label="measured")
    _ax.plot(CHUNKS, [1000 * chunk_s[1][0] * T for T in CHUNKS], "--", color="gray",
             label="if each token cost a whole step")
    _ax.set_xlabel("tokens of one sequence in the forward (T = k + 1)")
    _ax.set_ylabel("ms per forward")
    _ax.set_title(f"Forward time vs tokens in it ({device}, batch 1)")
    _ax.legend()
    _fig.tight_layout()
    _fit = (f"each extra token costs **c = {c_of_k[4]:.2f}** of a step at k = 4 "
            f"(c = {c_of_k[1]:.2f} at k = 1, {c_of_k[16]:.2f} at k = 16)" if c_of_k else
            "**no cost model fitted**: the medians did not grow with T (a loaded machine), so "
            "the lesson refuses to derive c from them")
    mo.vstack([_fig, mo.md(
        f"Medians over {min(n for _, n in chunk_s.values())} or more forwards each. A forward "
        f"of 5 tokens cost **{cost_ratio[5]:.2f}x** a one-token step, and 17 tokens "
        f"**{cost_ratio[17]:.2f}x**: {_fit}. If tokens were "
        "paid for one by one, the dashed line would be the bill.  \n"
        "Measured on this machine. On a CPU the first extra token is the dearest: one token "
        "per forward multiplies each weight matrix by a vector (a bandwidth-bound *gemv*), "
        "two or more switch to the matrix-matrix routine (*gemm*), which at a handful of rows "
        "spends time packing the weights instead of streaming them. On a GPU at batch 1 the "
        "curve stays flat much longer: its arithmetic idles while weights stream from HBM.")])
    return


@app.cell
def _(mo):
    mo.md(r"""
    ## Where the guesses come from: prompt lookup

    Guesses must be cheap, or the saving is spent making them. The cheapest proposer uses no
    model at all: take the last n tokens of the sequence (n from 4 down to 1), find the
    earliest place they occurred before, and propose the k tokens that followed there. When
    the output copies its input (editing, summarising, quoting retrieved documents, rewriting
    code) the guesses are often right; for free-form writing they rarely are.

    Then the rule, in one forward per step (`minivllm/spec_decode/decoder.py`):

    ```
    sequence  ... a b c        proposer: d e f          (k = 3)
    forward   [c d e f]     -> the model's choice after c, d, e and f
    greedy    d == choice after c?  yes, keep d
              e == choice after d?  no: the model says x; keep x, drop e and f
    result    c d x            two tokens from one forward; the KV slots of e and f roll back
    ```

    If all k agree, the model's choice after the last guess is a free extra token (the
    *bonus*), so a step yields between 1 and k + 1 tokens and never fewer than a plain step.
    With sampling, guess i is kept with probability min(1, p(d_i) / q(d_i)), p the model's
    probability and q the proposer's, and at the first rejection the replacement is drawn
    from the normalised max(p - q, 0). Every token then follows p exactly, whatever q was
    (tests/test_spec_decode.py checks this with a chi-square test over thousands of draws).

    Below, the engine copies a passage with and without speculation (k = 4), greedy.
    """)
    return


@app.cell
def _(mo):
    # Headless, the right answer is filled in so that the checker's verdict is tested below.
    _headless = mo.app_meta().mode == "script" or "headless" in mo.cli_args()
    forwards_guess = mo.ui.number(start=0, stop=100, value=11 if _headless else 0,
                                  label="forwards for 48 tokens, copying, k = 4")
    mo.vstack([mo.md(r"""
    ### Predict, then the engine checks

    Without speculation, 48 output tokens take 48 forwards: the prefill (which samples the
    first token), then one decode per token. The request below asks the model to repeat a
    passage that is in its prompt, so prompt lookup can propose the very tokens the model
    will choose. With k = 4, how many forwards will the engine need for the same 48 tokens?
    Write your number first; the engine's step trace decides (within one forward).
    """), forwards_guess])
    return (forwards_guess,)


@app.cell
def _(PASSAGE, Request, SamplingParams, llm, serve):
    OUTPUT_LEN = 48

    def chat(message):
        text = llm.tokenizer.apply_chat_template([{"role": "user", "content": message}],
                                                 add_generation_prompt=True, tokenize=False)
        return llm.tokenizer.encode(text, add_special_tokens=False)

    PROMPTS = {
        "copy a passage": chat("Repeat the following text exactly:\n\n" + PASSAGE),
        "free-form story": chat("Write a short story about a lighthouse keeper."),
    }

    def run(prompt, k, temperature=0.0, seed=0):
        """Serve one request with speculation off (k = 0) or on with k drafts per step."""
        llm.reconfigure(enable_chunked_prefill=True, max_num_batched_tokens=512, max_num_seqs=8,
                        speculative_config=None if k == 0 else
                        {"method": "ngram", "num_speculative_tokens": k})
        params = SamplingParams(temperature=temperature, max_tokens=OUTPUT_LEN, ignore_eos=True,
                                seed=seed)
        print(f"serving '{prompt}', k = {k}, temperature {temperature} ...", flush=True)
        res = serve(llm, [Request(PROMPTS[prompt], params)])
        decode = [s for s in res.steps if not s.scheduled[0].is_prefill]
        stats = res.steps[-1].stats
        return {
            "tokens": res.outputs[0].outputs[0].token_ids,
            "text": res.outputs[0].outputs[0].text,
            "forwards": len(res.steps),
            "drafts": [s.num_draft_tokens for s in decode],
            "accepted": [s.num_accepted_tokens for s in decode],
            "acceptance": stats.spec_decode_acceptance_rate,      # accepted / drafted
            "alpha_per_pos": stats.spec_decode_acceptance_per_pos,  # accept i | 0..i-1 kept
            "per_forward": stats.spec_decode_mean_acceptance_length,
            # The work: token rows computed by the decode forwards (k + 1 for a verification,
            # 1 for a plain step) per token they produced. Plain decoding: exactly 1.
            "rows_per_token": sum(s.num_batched_tokens for s in decode) / (OUTPUT_LEN - 1),
            "drafted": stats.spec_decode_num_draft_tokens,
            # vLLM's logged "per-position acceptance rate": accepted at i / verifications.
            "vllm_per_pos": [a / stats.spec_decode_num_drafts if stats.spec_decode_num_drafts
                             else 0.0 for a in stats.spec_decode_num_accepted_tokens_per_pos],
            "seconds": sum(s.duration for s in res.steps),
        }

    base = run("copy a passage", 0)
    spec = run("copy a passage", 4)
    same_tokens = base["tokens"] == spec["tokens"]

    def check_forwards_guess(value):
        """The learner's forward count against the engine's, for the copy request at k = 4."""
        truth, verifications = spec["forwards"], len(spec["drafts"])
        if not value:
            return "Enter a number of forwards."
        if abs(value - truth) <= 1:
            return (f"Correct: the engine took {truth} forwards, the prefill and "
                    f"{verifications} verifications of {spec['per_forward']:.2f} tokens each "
                    "on average (5 at most: four accepted drafts and the model's own token).")
        if value == base["forwards"]:
            return (f"That is decoding without speculation. The engine took {truth}: each "
                    "verification kept every draft the model agreed with.")
        if value == 1 + -(-(OUTPUT_LEN - 1) // 4):
            return (f"That counts 4 tokens per verification. Each also yields the model's own "
                    f"token after the last accepted draft: the engine took {truth}.")
        return (f"{'Too many' if value > truth else 'Too few'}: the engine took {truth} "
                f"forwards, {spec['per_forward']:.2f} tokens per verification.")
    return OUTPUT_LEN, PROMPTS, base, check_forwards_guess, run, same_tokens, spec


@app.cell
def _(check_forwards_guess, forwards_guess, mo):
    _msg = check_forwards_guess(forwards_guess.value)
    mo.callout(mo.md(f"Your prediction: **{forwards_guess.value}** forwards. {_msg}"),
               kind="success" if _msg.startswith("Correct") else "neutral")
    return


@app.cell
def _(OUTPUT_LEN, base, mo, np, plt, same_tokens, spec):
    _d, _a = np.array(spec["drafts"]), np.array(spec["accepted"])
    _x = np.arange(1, len(_d) + 1)
    _fig, _ax = plt.subplots(figsize=(8, 3))
    _ax.bar(_x, _a, color="tab:green", label="draft accepted")
    _ax.bar(_x, _d - _a, bottom=_a, color="tab:red", label="draft rejected")
    _ax.bar(_x, np.ones_like(_d), bottom=_d, color="tab:blue",
            label="the model's own token (bonus or correction)")
    _ax.set_xlabel("decode step (one forward each)")
    _ax.set_ylabel("tokens in the forward")
    _ax.set_title("Every verification of the copy request, k = 4")
    _ax.legend(fontsize=8, loc="lower right")
    _fig.tight_layout()
    mo.vstack([_fig, mo.md(
        f"Without speculation, {OUTPUT_LEN} output tokens took **{base['forwards']}** forwards "
        f"(one prefill, then one per token, the last token sampled in the prefill's step "
        f"counting as the first). With k = 4 they took **{spec['forwards']}**: "
        f"acceptance **{spec['acceptance']:.0%}**, **{spec['per_forward']:.2f}** tokens per "
        f"verifying forward. Wall clock: {base['seconds']:.2f} s vs {spec['seconds']:.2f} s. "
        f"Identical tokens: **{same_tokens}**.  \n"
        f"Output: *{spec['text'][:160]!s}...*")])
    return


@app.cell
def _(mo):
    mo.md(r"""
    ## How many tokens per step, and when it pays

    Leviathan et al. (2023) model a step like this: draft i is accepted with probability
    $\alpha$ *given that drafts 1..i-1 were* (the per-position acceptance), the same at every
    position, and a step stops at the first rejection. The step yields 1 + (number of leading
    accepted drafts) tokens, and its expected value, the *mean acceptance length*, is

    $$E[\text{tokens per forward}] = 1 + \alpha + \alpha^2 + \dots + \alpha^k =
    \frac{1 - \alpha^{k+1}}{1 - \alpha}.$$

    The easy number to log is not $\alpha$: accepted / drafted (vLLM's "draft acceptance
    rate" and our `acceptance_rate`) divides by drafts that were never judged on their own,
    because an earlier rejection ended the step. At $\alpha$ = 0.8, k = 4, with perfectly
    independent guesses, accepted / drafted is (0.8 + 0.64 + 0.51 + 0.41) / 4 = 0.59, and the
    formula at 0.59 predicts 2.27 tokens per forward where the truth is 3.36.

    Per position, the engine keeps two counters. Like vLLM it counts the drafts accepted at
    position i (`spec_decode_num_accepted_tokens_per_pos`, vLLM's counter of that name);
    unlike vLLM it also counts the drafts *judged* there, proposed with every draft before
    them accepted (`spec_decode_num_judged_tokens_per_pos`). Their ratio is Leviathan's
    conditional $\alpha_i$ (`EngineStats.spec_decode_acceptance_per_pos`). vLLM logs a
    different per-position rate (`vllm/v1/spec_decode/metrics.py`, `SpecDecodingLogging`):
    accepted at i / number of verifications, the share of verifications that got i drafts in.
    When every proposal has k drafts that is the product $\alpha_1 \alpha_2 \cdots
    \alpha_i$, which falls with i even when every $\alpha_i$ is the same; a proposal
    shorter than k lowers it too, with no draft rejected. Both give the same mean acceptance
    length, 1 + (sum of the accepted counts) / verifications.

    A forward of k + 1 tokens costs 1 + c k plain steps (c measured above for each k), so the
    expected speedup in time is

    $$S(\alpha, k, c) = \frac{1 - \alpha^{k+1}}{(1 - \alpha)(1 + c\,k)}.$$

    Below we feed the formula both numbers, accepted / drafted and $\alpha_1$ (the first
    position, where no earlier draft selects anything), and set both beside the measured mean
    acceptance length. What remains between $\alpha_1$'s prediction and the measurement is
    the proposer's own doing: prompt lookup's guesses are not independent (inside a copied
    span $\alpha_i$ rises with i, every draft right; outside, all wrong) and it proposes
    fewer than k tokens, or none, when no match exists.
    """)
    return


@app.cell
def _(PROMPTS, base, c_of_k, np, run, spec):
    def expected_tokens(a, k):
        return k + 1 if a >= 1 else (1 - a ** (k + 1)) / (1 - a)

    def speedup(a, k, c):
        return expected_tokens(a, k) / (1 + c * k)

    def cost_of(k):
        """c at k, interpolated between the measured k; None if the fit was refused."""
        return float(np.interp(k, list(c_of_k), list(c_of_k.values()))) if c_of_k else None

    KS = [1, 2, 4, 8]
    ladder = {"copy a passage": {0: base, 4: spec}, "free-form story": {}}
    for _prompt in PROMPTS:
        for _k in [0] + KS:
            if _k not in ladder[_prompt]:
                ladder[_prompt][_k] = run(_prompt, _k)
    rows = []
    for _prompt, _runs in ladder.items():
        for _k in KS:
            _r, _b = _runs[_k], _runs[0]
            _alpha1 = _r["alpha_per_pos"][0] if _r["alpha_per_pos"] else 0.0
            rows.append({
                "workload": _prompt, "k": _k, "acceptance": _r["acceptance"],
                "alpha_per_pos": _r["alpha_per_pos"], "alpha_1": _alpha1,
                "tokens/forward": _r["per_forward"],
                "formula at accepted/drafted": expected_tokens(_r["acceptance"], _k),
                "formula at alpha_1": expected_tokens(_alpha1, _k),
                "forwards": _r["forwards"], "forwards without": _b["forwards"],
                "rows/token": _r["rows_per_token"],
                "step speedup": _b["forwards"] / _r["forwards"],
                "formula speedup": speedup(_alpha1, _k, c_of_k[_k]) if c_of_k else None,
                "wall speedup": _b["seconds"] / _r["seconds"],
                "identical": _r["tokens"] == _b["tokens"]})
    all_identical = all(r["identical"] for r in rows)
    free_acceptance = float(np.mean([r["acceptance"] for r in rows
                                     if r["workload"] == "free-form story"]))
    copy_k4 = next(r for r in rows if r["workload"] == "copy a passage" and r["k"] == 4)
    free_k4 = next(r for r in rows if r["workload"] == "free-form story" and r["k"] == 4)
    free_k8 = next(r for r in rows if r["workload"] == "free-form story" and r["k"] == 8)
    return (KS, all_identical, copy_k4, cost_of, expected_tokens, free_acceptance, free_k4,
            free_k8, ladder, rows, speedup)


@app.cell
def _(KS, c_of_k, free_k8, ladder, mo, np, plt, rows, speedup):
    _gap_a1 = abs(free_k8["formula at alpha_1"] - free_k8["tokens/forward"])
    _gap_ad = abs(free_k8["formula at accepted/drafted"] - free_k8["tokens/forward"])
    _copy4 = ladder["copy a passage"][4]
    _fig, _axes = plt.subplots(1, 2, figsize=(10, 3.4))
    _a = np.linspace(0, 0.99, 100)
    for _k in KS:
        _axes[0].plot(_a, [speedup(x, _k, c_of_k[_k] if c_of_k else 0) for x in _a],
                      label=f"k = {_k}")
    for _r in rows:
        _axes[0].plot(_r["alpha_1"], _r["step speedup"] if not c_of_k else _r["wall speedup"],
                      "o" if _r["workload"] == "copy a passage" else "s", color="black",
                      ms=4)
    _axes[0].axhline(1, color="gray", lw=0.8)
    _axes[0].set_xlabel("per-position acceptance alpha (dots: alpha_1)")
    _axes[0].set_ylabel("speedup")
    _axes[0].set_title("S(alpha, k, c measured per k); dots: measured (wall)" if c_of_k else
                       "S(alpha, k, c = 0): cost fit refused; dots: forwards saved")
    _axes[0].legend(fontsize=8)
    for _prompt, _marker in [("copy a passage", "o-"), ("free-form story", "s-")]:
        _axes[1].plot(KS, [ladder[_prompt][0]["forwards"] / ladder[_prompt][_k]["forwards"]
                           for _k in KS], _marker, label=_prompt)
    _axes[1].axhline(1, color="gray", lw=0.8)
    _axes[1].set_xlabel("k (draft tokens per step)")
    _axes[1].set_ylabel("forwards saved (x)")
    _axes[1].set_title("Forwards without / with speculation")
    _axes[1].legend(fontsize=8)
    _fig.tight_layout()
    _table = "\n".join(
        f"| {r['workload']} | {r['k']} | {r['acceptance']:.0%} | "
        f"{' '.join(f'{a:.2f}' for a in r['alpha_per_pos'])} | {r['tokens/forward']:.2f} | "
        f"{r['formula at accepted/drafted']:.2f} | {r['formula at alpha_1']:.2f} | "
        f"{r['forwards']} / {r['forwards without']} | {r['rows/token']:.2f} | "
        + (f"{r['formula speedup']:.2f}x" if r["formula speedup"] else "refused")
        + f" | {r['wall speedup']:.2f}x | {r['identical']} |"
        for r in rows)
    mo.vstack([_fig, mo.md(
        "| workload | k | accepted / drafted | alpha_1 .. alpha_k | mean acceptance length "
        "(measured) | formula at accepted / drafted | formula at alpha_1 | forwards (spec / "
        "plain) | token rows per output token | formula speedup | wall speedup | identical |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|\n"
        + _table + "\n\nOn the free-form story, fed accepted / drafted, the formula "
        "under-predicts the tokens per forward: that gap is the metric, not the guesses. Fed "
        f"alpha_1 it comes closer (k = 8: off by {_gap_a1:.3f}, against {_gap_ad:.3f}). On "
        "the copy task every judged draft was accepted (alpha_i = 1 at every position), and "
        "the measured length falls short of k + 1 only because prompt lookup proposed fewer "
        "than k tokens near the end of the passage, which the formula does not model. vLLM's "
        "logged per-position rate (accepted at i / verifications) for the copy task at k = 4 "
        f"would read {', '.join(f'{_v:.2f}' for _v in _copy4['vllm_per_pos'])}: those short "
        "proposals, counted as if rejected. "
        "Wall-clock speedups on a shared machine move from run to run; the forward and row "
        "counts do not.")])
    return


@app.cell
def _(mo):
    k_slider = mo.ui.slider(0, 12, value=8, step=1, label="k (draft tokens)", show_value=True)
    temperature = mo.ui.dropdown({"0 (greedy)": 0.0, "0.7": 0.7, "1.0": 1.0, "1.5": 1.5},
                                 value="0 (greedy)", label="temperature")
    workload = mo.ui.dropdown(["copy a passage", "free-form story"], value="free-form story",
                              label="workload")
    mo.vstack([mo.md(r"""
    ## Try it: make speculation lose

    Speculation is a bet: each forward pays for k guesses whether or not they are right.
    Raise k on the free-form story and the guesses are mostly wrong: the engine computes k + 1
    token rows per forward and saves almost no forwards. The verdict is a count: token rows
    computed per output token (plain decoding: 1) against forwards per output token. With a
    forward of k + 1 rows costing 1 + c k steps, speculation costs
    (forwards + c x drafted rows) / plain forwards of plain decoding's time, and loses above 1.
    Raise the temperature on the copy task and the sampled text leaves the passage
    sooner, so prompt lookup finds less to propose. The output stays *exact* either way:
    greedy tokens never change, and sampled tokens follow the model's distribution.
    """), mo.hstack([k_slider, temperature, workload])])
    return k_slider, temperature, workload


@app.cell
def _(cost_of, k_slider, ladder, mo, run, temperature, workload):
    _t = temperature.value
    _plain = ladder[workload.value][0] if _t == 0 else run(workload.value, 0, _t)
    _try = run(workload.value, k_slider.value, _t)
    # The cost in plain steps, from counts: each forward is a step, each draft row adds c of
    # one (c = 1, a row as dear as a step, where the fit was refused).
    _c = cost_of(k_slider.value) if k_slider.value else 0.0
    _cost = (_try["forwards"] + (1.0 if _c is None else _c) * _try["drafted"]) / _plain["forwards"]
    widget_result = {"plain": _plain, "spec": _try, "cost": _cost}
    mo.callout(mo.md(
        f"**{workload.value}**, k = {k_slider.value}, temperature {_t}: "
        f"**{_try['forwards']}** forwards vs **{_plain['forwards']}** without speculation; "
        f"**{_try['rows_per_token']:.2f}** token rows computed per output token (plain: 1.00); "
        f"acceptance {_try['acceptance']:.0%}, {_try['per_forward']:.2f} tokens per "
        f"verifying forward. Cost from these counts at c = "
        + ("1 (fit refused)" if _c is None else f"{_c:.2f}")
        + f": **{_cost:.2f}x** plain decoding's time, so speculation "
        + ("**loses**" if _cost > 1 else "**wins**")
        + f" (wall clock, beside: {_try['seconds']:.2f} s vs {_plain['seconds']:.2f} s). "
        + ("Same tokens as without speculation." if _try["tokens"] == _plain["tokens"]
           else "Different tokens: with sampling each run draws its own text (same seed, "
                "but speculation consumes random numbers in another order).")),
        kind="success" if _cost <= 1 else "danger")
    return (widget_result,)


@app.cell
def _(mo):
    mo.md(r"""
    ## The family

    Prompt lookup is the simplest member of a family that differs only in where the guesses
    come from; the verification and the acceptance rule are shared:

    * **A draft model** (Leviathan et al., Chen et al. 2023): a small model with the same
      tokenizer runs k cheap decode steps; q is its distribution. vLLM runs it with its own
      KV cache. Good acceptance on any text, at the cost of a second model.
    * **Medusa** (2024): extra heads on the target's last hidden state guess tokens t+2,
      t+3, ... in the same forward; several candidates per position are checked at once as a
      tree with a tree-shaped attention mask.
    * **EAGLE** (2024) and **MTP** (DeepSeek-V3): a one-layer head that continues the target's
      own features autoregressively; today's highest acceptance rates.
    * **Lookahead decoding** (2024): Jacobi iterations produce n-grams on the fly, with no
      draft model, then verify them like prompt lookup does.

    All of them shine at small batch, where a step is bound by reading weights. At large
    batch the step is already compute-bound (many sequences share one weight read), the
    extra tokens are no longer free, and speculation's gain shrinks or turns into a loss:
    `minivllm bench spec` measures batch 1 against batch 8.
    """)
    return


@app.cell
def _(mo):
    answer = mo.ui.number(start=0, stop=20, step=0.01, value=0,
                          label="expected tokens per forward")
    mo.vstack([mo.md(r"""
    ## Exercise

    A proposer's guesses are each accepted with probability **a = 0.8**, independently, and
    it always proposes **k = 4** tokens. How many tokens does one verifying forward yield on
    average (accepted guesses plus the model's own token)? Give two decimals.
    """), answer])
    return (answer,)


@app.cell
def _(expected_tokens):
    def check_tokens_per_forward(value, a=0.8, k=4):
        truth = expected_tokens(a, k)
        if not value:
            return "Enter a number."
        if abs(value - truth) < 0.01:
            return (f"Correct: 1 + a + a^2 + a^3 + a^4 = {truth:.2f}. The step stops at the "
                    "first rejected guess, so guess i counts only if all before it were kept.")
        if abs(value - (1 + a * k)) < 0.01:
            return ("Not quite: 1 + a k counts every accepted guess, but a rejection ends the "
                    "step: guess 3 is kept only if guesses 1 and 2 were too (probability a^3).")
        if abs(value - truth + 1) < 0.01:
            return ("Close: you counted the accepted guesses. The forward also yields the "
                    "model's own token (the correction, or the bonus when all are kept).")
        if abs(value - (k + 1)) < 0.01:
            return "That is the best case, when every guess is accepted; a = 0.8 is not 1."
        return ("Not yet: guess i is kept only if guesses 1..i are all right (probability "
                "a^i); add those up, then add the model's own token.")
    return (check_tokens_per_forward,)


@app.cell
def _(answer, check_tokens_per_forward, mo):
    _msg = check_tokens_per_forward(answer.value)
    mo.callout(mo.md(_msg), kind="success" if _msg.startswith("Correct") else "neutral")
    return


@app.cell
def _(
    OUTPUT_LEN,
    all_identical,
    base,
    check_forwards_guess,
    check_tokens_per_forward,
    copy_k4,
    cost_ratio,
    forwards_guess,
    free_acceptance,
    free_k4,
    free_k8,
    ladder,
    rows,
    same_tokens,
    spec,
    widget_result,
):
    def test_verifying_five_tokens_costs_far_less_than_five_steps():
        assert cost_ratio[5] < 3.5 and cost_ratio[17] < 10     # medians; 5 and 17 if paid per token

    def test_speculation_never_changes_greedy_tokens():
        assert same_tokens and all_identical

    def test_copying_takes_far_fewer_forwards():
        assert base["forwards"] == OUTPUT_LEN              # a prefill, then 47 decodes
        assert spec["forwards"] <= base["forwards"] // 2
        assert sum(spec["accepted"]) + len(spec["accepted"]) + 1 == OUTPUT_LEN

    def test_each_step_yields_between_one_and_k_plus_one_tokens():
        for _r in rows:
            assert 1 <= _r["tokens/forward"] <= _r["k"] + 1
        assert all(a <= d <= 4 for a, d in zip(spec["accepted"], spec["drafts"]))

    def test_free_form_text_is_hard_to_guess():
        assert free_acceptance < 0.5
        _copy = ladder["copy a passage"]
        assert all(_copy[k]["acceptance"] > free_acceptance for k in _copy if k)

    def test_accepted_over_drafted_is_not_leviathans_alpha():
        # Free-form, k = 4 and 8: fed accepted/drafted the formula under-predicts the measured
        # mean acceptance length; fed the per-position alpha_1 it comes closer.
        for _r in (free_k4, free_k8):
            _measured = _r["tokens/forward"]
            assert _r["formula at accepted/drafted"] < _measured, _r
            assert (abs(_r["formula at alpha_1"] - _measured)
                    < abs(_r["formula at accepted/drafted"] - _measured)), _r
            assert _r["alpha_1"] > _r["acceptance"], _r
        # Copying: every judged draft accepted; the length lost is short proposals.
        assert copy_k4["alpha_per_pos"] == [1.0] * 4
        assert copy_k4["tokens/forward"] < 5

    def test_speculation_loses_by_count_on_free_form_text_at_large_k():
        # Free-form, k = 8: several token rows computed per output token, few forwards saved;
        # copying at k = 4: fewer rows than tokens saved forwards.
        assert free_k8["rows/token"] >= 2.5 and free_k8["step speedup"] < 1.25
        assert copy_k4["rows/token"] < 2 and copy_k4["step speedup"] > 2
        assert all(r["rows/token"] >= 1 for r in rows)

    def test_the_widget_run_is_exact_at_its_default_greedy_setting():
        assert widget_result["spec"]["tokens"] == widget_result["plain"]["tokens"]

    def test_exercise_checker():
        assert check_tokens_per_forward(3.36).startswith("Correct")
        assert "1 + a k" in check_tokens_per_forward(4.2)
        assert "own token" in check_tokens_per_forward(2.36)
        assert "best case" in check_tokens_per_forward(5)

    def test_the_engine_checks_the_forward_prediction():
        # The headless run answered 11 (1 + 47 / 5, rounded up: every draft accepted); the
        # engine's trace decides, and plain decoding's count is turned down.
        assert check_forwards_guess(forwards_guess.value).startswith("Correct")
        assert check_forwards_guess(base["forwards"]).startswith("That is decoding without")
        assert not check_forwards_guess(forwards_guess.value + 3).startswith("Correct")
    return


@app.cell
def _(mo):
    # Shown at the end, under "Where the code lives".
    v1_box = mo.callout(mo.md(r"""
    **In vLLM V1** (as of vLLM 0.33). Two GPU model runners live side by side. The default
    one, Model Runner V2, is `GPUModelRunner` in `vllm/v1/worker/gpu/model_runner.py`; its
    speculators sit in `vllm/v1/worker/gpu/spec_decode/`, where prompt lookup is
    `NgramGPUSpeculator.propose` (`ngram/speculator.py`, the n-gram match run as Triton
    kernels on the GPU), beside EAGLE, MTP and draft-model speculators, and the acceptance
    rule is `RejectionSampler` in `spec_decode/rejection_sampler.py`. The older runner,
    which vLLM falls back to for features V2 lacks (or with `VLLM_USE_V2_MODEL_RUNNER=0`), is
    `vllm/v1/worker/gpu_model_runner.py`, with `NgramProposer.propose` in
    `vllm/v1/spec_decode/ngram_proposer.py` and `RejectionSampler` in
    `vllm/v1/sample/rejection_sampler.py`. Either way the runner proposes drafts after
    sampling, the engine core collects them (`take_draft_token_ids`) and hands them to the
    scheduler (`Scheduler.update_draft_token_ids`, `vllm/v1/core/sched/scheduler.py`), which
    puts a request's drafts into the next step, reserves their slots through
    `KVCacheManager.allocate_slots`, and in `update_from_output` keeps the accepted ones and
    records `SpecDecodingStats` (`vllm/v1/spec_decode/metrics.py`). minivllm follows the
    same path (proposer in the runner, drafts scheduled as lookahead slots, one rejection
    sampler) in plain torch on Python lists, with n-gram and draft-model proposers only.
    `SpecDecodingStats` now also counts the drafts *proposed* at each position
    (`num_draft_tokens_per_pos`), but a draft proposed after a rejected one is counted there
    too, and nothing logs that count; minivllm counts the drafts *judged* at each position,
    so that the conditional alpha above can be read.
    """), kind="info")
    return (v1_box,)


@app.cell
def _(
    base,
    c_of_k,
    copy_k4,
    cost_ratio,
    free_acceptance,
    free_k8,
    mo,
    rows,
    same_tokens,
    spec,
    v1_box,
):
    findings = {
        "forward_cost_ratio": {str(T): round(r, 3) for T, r in cost_ratio.items()},
        "cost_per_draft_token": ({str(k): round(c, 3) for k, c in c_of_k.items()} if c_of_k
                                 else "refused: medians not monotone in T"),
        "copy_forwards": {"plain": base["forwards"], "k4": spec["forwards"]},
        "copy_acceptance_k4": round(spec["acceptance"], 3),
        "copy_tokens_per_forward_k4": round(spec["per_forward"], 3),
        "copy_alpha_per_pos_k4": [round(a, 3) for a in copy_k4["alpha_per_pos"]],
        "free_k8_mean_acceptance_length": round(free_k8["tokens/forward"], 3),
        "free_k8_formula": {"accepted/drafted": round(free_k8["formula at accepted/drafted"], 3),
                            "alpha_1": round(free_k8["formula at alpha_1"], 3)},
        "rows_per_output_token": {f"{r['workload']} k={r['k']}": round(r["rows/token"], 2)
                                  for r in rows},
        "free_form_acceptance": round(free_acceptance, 3),
        "step_speedup": {f"{r['workload']} k={r['k']}": round(r["step speedup"], 2)
                         for r in rows},
        "wall_speedup": {f"{r['workload']} k={r['k']}": round(r["wall speedup"], 2)
                         for r in rows},
        "identical_greedy_tokens": same_tokens,
    }
    print("findings:", findings)
    _fit = (f"c = {c_of_k[4]:.2f} of a step per draft token at k = 4" if c_of_k
            else "cost fit refused: not monotone")
    mo.vstack([mo.md(f"""
    ## What we found

    * One forward of 5 tokens cost **{cost_ratio[5]:.2f}x** a one-token step on this
      device (medians over 24+ forwards; {_fit}):
      verification costs far less than the steps it replaces.
    * Copying a passage, k = 4: **{spec['forwards']}** forwards instead of
      **{base['forwards']}**, greedy tokens identical, mean acceptance length
      **{spec['per_forward']:.2f}** tokens per verifying forward; alpha by position
      {', '.join(f'{a:.2f}' for a in copy_k4['alpha_per_pos'])} (short proposals, not
      rejections, keep it under 5).
    * Leviathan's formula on the free-form story, k = 8: measured mean acceptance length
      **{free_k8['tokens/forward']:.3f}**; the formula predicts
      {free_k8['formula at accepted/drafted']:.3f} fed accepted / drafted
      ({free_k8['acceptance']:.1%}, the wrong number) and
      **{free_k8['formula at alpha_1']:.3f}** fed alpha_1 = {free_k8['alpha_1']:.2f}.
    * Free-form text, k = 8: acceptance {free_acceptance:.0%} (mean over k), and
      **{free_k8['rows/token']:.2f}** token rows computed per output token to save
      {free_k8['step speedup']:.2f}x the forwards: speculation loses by the count (copying at
      k = 4: {copy_k4['rows/token']:.2f} rows per token for {copy_k4['step speedup']:.2f}x).

    Verifying was cheap because a decode step leaves the arithmetic idle while it waits on the
    weights; a prefill is the opposite, and both kinds of step share one engine. Next, lesson
    08: how much does a long prompt's prefill slow the requests already decoding beside it, and
    does a separate prefill engine pay for the KV it must send?

    ## Where the code lives

    * `minivllm/spec_decode/`: `NgramProposer.propose` (prompt lookup, ngram_proposer.py) and
      `SpeculativeDecoder` (decoder.py: the model runner's drafter, which proposes each
      sample's drafts right after sampling; the core hands them to the scheduler for the
      next step). `minivllm/sample/rejection_sampler.py`: `greedy_accept` and
      `rejection_sample` (the acceptance rule).
    * `minivllm/core/scheduler.py`: drafts fit into the token budget and get lookahead slots
      (`BlockManager.append_slots`); `minivllm/core/block_manager.py`: `free_lookahead_slots`.
    * `minivllm/worker/model_runner.py`: a sequence with k drafts returns k + 1 logits rows.
    * `minivllm/config/speculative.py`: `SpeculativeConfig` (vLLM's `speculative_config` dict).
    * `minivllm/benchmarks/spec.py`: `minivllm bench spec`, batch 1 against batch 8.
    """), v1_box])
    return (findings,)


if __name__ == "__main__":
    app.run()
