import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell
def _():
    import functools
    import json

    import marimo as mo
    import matplotlib.pyplot as plt
    import numpy as np
    import torch
    import xgrammar as xgr

    from minivllm import LLM, SamplingParams
    from minivllm.sampling_params import GuidedDecodingParams
    return GuidedDecodingParams, LLM, SamplingParams, functools, json, mo, np, plt, torch, xgr


@app.cell
def _(mo):
    mo.md(r"""
    # 16 · Structured output: a grammar as a token mask

    After this lesson you can explain why sampling breaks JSON even when the prompt asks for
    it, how a grammar turns into a mask over the vocabulary at every step (and why that mask
    is cheap), what the mask does and does not guarantee, and where in an engine the mask is
    applied. You will see the mask of one real step, follow the grammar's state token by
    token, and measure what it costs per step.

    Lesson 15 checked that splitting the model over three processes left every token as it was.
    This lesson changes the tokens on purpose: it restricts which ones the sampler may pick.
    """)
    return


@app.cell
def _(LLM, mo, torch):
    # One model for the lesson. num_kv_blocks is fixed so that, on a GPU, the pool is not
    # sized from free memory; 32 sequences of up to 512 tokens fit many times over.
    GPU = torch.cuda.is_available()
    llm = LLM(max_model_len=512, max_num_seqs=64, num_kv_blocks=512)
    so = llm.engine.structured_output          # the front end's StructuredOutputManager
    device = torch.cuda.get_device_name() if GPU else "CPU"
    mo.md(f"**running on:** {device} · **model:** SmolLM2-135M-Instruct "
          f"({str(llm.engine.dtype).removeprefix('torch.')}) · **guided decoding:** xgrammar"
          f"  \n`{llm.engine!r}`")
    return GPU, device, llm, so


@app.cell
def _(GPU, GuidedDecodingParams, SamplingParams, json, llm):
    # The request of this lesson: a person as JSON, with a schema that says exactly what.
    SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
              "properties": {"name": {"type": "string", "maxLength": 16},
                             "age": {"type": "integer", "minimum": 0, "maximum": 120}}}
    PROMPT = llm.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Describe a person as a JSON object with keys name and "
                                     "age."}], tokenize=False, add_generation_prompt=True)
    N = 64 if GPU else 24                    # samples per run
    MAX_TOKENS = 40

    def verdict(text: str) -> str:
        """'valid' if text is JSON matching SCHEMA (checked by hand, the two keys and their
        types and ranges), else 'not JSON' or 'wrong shape'."""
        try:
            obj = json.loads(text)
        except ValueError:
            return "not JSON"
        ok = (isinstance(obj, dict) and set(obj) == {"name", "age"}
              and isinstance(obj["name"], str) and len(obj["name"]) <= 16
              and type(obj["age"]) is int and 0 <= obj["age"] <= 120)
        return "valid" if ok else "wrong shape"

    def sample(guided: bool, temperature=1.0, n=N, max_tokens=MAX_TOKENS, strict_ws=False):
        """n samples of PROMPT, with or without the schema; -> their CompletionOutputs."""
        g = GuidedDecodingParams(json=SCHEMA, disable_any_whitespace=strict_ws) if guided else None
        params = SamplingParams(n=n, temperature=temperature, max_tokens=max_tokens, seed=0,
                                guided_decoding=g)
        return llm.generate(PROMPT, params, use_tqdm=False)[0].outputs
    return MAX_TOKENS, N, PROMPT, SCHEMA, sample, verdict


@app.cell
def _(N, mo):
    mo.md(f"""
    ## The problem, measured: asking nicely is not enough

    The prompt asks for a JSON object with keys `name` and `age`. We draw **{N}** samples at
    temperature 1, the way a chat service samples, and judge each with `json.loads` and the
    schema. Then the same {N} samples with the schema given to the engine as a constraint.
    """)
    return


@app.cell
def _(N, np, plt, sample, verdict):
    print(f"sampling {N} answers unconstrained, then {N} guided ...", flush=True)
    free = sample(guided=False)
    guided = sample(guided=True)
    KINDS = ("valid", "wrong shape", "not JSON")
    counts = {name: {k: sum(verdict(c.text) == k for c in outs) for k in KINDS}
              for name, outs in (("unconstrained", free), ("guided", guided))}
    _fig, _ax = plt.subplots(figsize=(7, 2.6))
    _left = np.zeros(2)
    for _k, _color in zip(KINDS, ("tab:green", "tab:orange", "tab:red")):
        _vals = np.array([counts[_n][_k] for _n in counts])
        _ax.barh(list(counts), _vals, left=_left, color=_color, label=_k)
        _left += _vals
    _ax.set_xlabel(f"samples (of {N}), temperature 1")
    _ax.legend(fontsize=8, loc="lower right")
    _fig.tight_layout()
    unconstrained_failure_rate = 1 - counts["unconstrained"]["valid"] / N
    for _n, _c in counts.items():
        print(f"{_n:>13}: {_c}")
    print("unconstrained, a few failures:")
    for _c in [_c for _c in free if verdict(_c.text) != "valid"][:3]:
        print(f"   {_c.text[:70]!r} ({_c.finish_reason})")
    _fig
    return counts, free, guided, unconstrained_failure_rate


@app.cell
def _(counts, mo, unconstrained_failure_rate):
    mo.md(f"""
    Unconstrained, **{unconstrained_failure_rate:.0%}** of the samples fail: a code fence
    before the object, a third key the schema forbids, an age written as a string, or text
    that runs on until `max_tokens` cuts it. A bigger model fails less often, but every
    token is a draw from a distribution in which the wrong characters never have probability
    zero; over thousands of requests, some break. With the constraint,
    **{counts['guided']['valid']}** of the samples are valid. The model did not get better:
    the engine stopped it from choosing any token that would break the schema.
    """)
    return


@app.cell
def _(mo):
    mo.md(r"""
    ## The mechanism: one mask per step

    xgrammar compiles the schema into a grammar (a pushdown automaton over characters).
    For each position of that automaton it sorts the 49,152 vocabulary tokens in advance:
    most are **context-independent**, accepted or rejected by the position alone, and their
    bits are precomputed once per schema (its adaptive token mask cache); the few
    **context-dependent** ones, whose fate depends on the stack below (which brackets are
    open, which rule called this one), are checked at run time against the matcher's
    actual stack. Each guided sequence keeps a **matcher**, the automaton's current state
    with its stack. At every
    step the engine asks each matcher for a bitmask (one bit per token, 1,536 int32 words),
    sets the logits of the 0 bits to `-inf`, and samples as usual from what is left:
    temperature, top-k, top-p and the random draw are untouched.

    Here is the mask of one step: the model has written `{"name":` and must continue.
    On the left, the model's 15 most likely next tokens, coloured by the mask; on the right,
    what the mask lets through.
    """)
    return


@app.cell
def _(GuidedDecodingParams, PROMPT, SCHEMA, llm, so, torch, xgr):
    def allowed_ids(matcher) -> torch.Tensor:
        """The token ids the matcher allows next: its bitmask unpacked, bit i of word w is
        token 32 * w + i."""
        bitmask = xgr.allocate_token_bitmask(1, so.vocab_size)
        matcher.fill_next_token_bitmask(bitmask)
        bits = (bitmask[0, :, None] >> torch.arange(32)) & 1         # (words, 32)
        return bits.flatten()[:so.vocab_size].nonzero().flatten()

    def fresh_matcher(guided_params=None):
        """A matcher at the start of the schema (the engine's cached compiled grammar)."""
        return xgr.GrammarMatcher(so.compile(guided_params or GuidedDecodingParams(json=SCHEMA)))

    PREFIX = '{"name":'
    _prompt_ids = llm.tokenizer.encode(PROMPT, add_special_tokens=False)
    prefix_ids = llm.tokenizer.encode(PREFIX, add_special_tokens=False)
    _m = fresh_matcher()
    assert all(_m.accept_token(_t) for _t in prefix_ids)
    allowed_after_name = allowed_ids(_m)
    _logits = llm.engine.prompt_logits(_prompt_ids + prefix_ids)[-1]
    probs_after_name = _logits.softmax(-1)
    allowed_mask = torch.zeros(so.vocab_size, dtype=torch.bool)
    allowed_mask[allowed_after_name] = True
    mass_removed = float(probs_after_name[~allowed_mask].sum())
    # How many of the model's 15 favourites the mask let through (counted token by token).
    top_allowed = int(allowed_mask[probs_after_name.topk(15).indices].sum())
    argmax_allowed = bool(allowed_mask[probs_after_name.argmax()])
    return (PREFIX, allowed_after_name, allowed_ids, allowed_mask, argmax_allowed,
            fresh_matcher, mass_removed, prefix_ids, probs_after_name, top_allowed)


@app.cell
def _(
    PREFIX,
    allowed_after_name,
    allowed_mask,
    llm,
    mass_removed,
    plt,
    probs_after_name,
    so,
):
    _top = probs_after_name.topk(15)
    _kept = probs_after_name * allowed_mask
    _kept_top = (_kept / _kept.sum()).topk(8)
    _fig, (_a, _b) = plt.subplots(1, 2, figsize=(11, 3.6))
    _colors = ["tab:green" if allowed_mask[_i] else "tab:red" for _i in _top.indices]
    _a.bar(range(15), _top.values, color=_colors)
    _a.set_xticks(range(15), [repr(llm.tokenizer.decode([_i])) for _i in _top.indices],
                  rotation=60, fontsize=7)
    _a.set_ylabel("probability")
    _a.set_title(f"model after {PREFIX!r}: green allowed, red masked", fontsize=10)
    _b.bar(range(8), _kept_top.values, color="tab:green")
    _b.set_xticks(range(8), [repr(llm.tokenizer.decode([_i])) for _i in _kept_top.indices],
                  rotation=60, fontsize=7)
    _b.set_title("after the mask, renormalized", fontsize=10)
    _fig.tight_layout()
    allowed_texts = sorted({llm.tokenizer.decode([_i]) for _i in allowed_after_name.tolist()},
                           key=lambda _s: (not _s.strip(), _s))      # quotes first, whitespace last
    print(f"after {PREFIX!r}: {len(allowed_after_name)} of {so.vocab_size} tokens allowed; "
          f"the mask removes {mass_removed:.1%} of the model's probability; allowed tokens "
          f"(text): {allowed_texts[:12]}")
    _fig
    return (allowed_texts,)


@app.cell
def _(allowed_after_name, argmax_allowed, mass_removed, mo, so, top_allowed):
    mo.md(f"""
    After `{{"name":` a JSON string must follow, perhaps after some whitespace: only
    **{len(allowed_after_name)}** of {so.vocab_size} tokens qualify (a quote, a quote with
    the first letters of a name, whitespace). **{top_allowed}** of the model's 15 most likely
    tokens were among them, its favourite {'included' if argmax_allowed else 'NOT'}; the
    mask removed **{mass_removed:.1%}** of its probability here. That is the
    common case for a model that already understands the request: the mask rarely
    overrides it, it only removes the tail where the breakage lives.
    """)
    return


@app.cell
def _(mo):
    mo.md(r"""
    ## The grammar as a state machine, token by token

    One guided sample from above, replayed through a fresh matcher: before each token, the
    number of tokens the grammar allowed. Inside the JSON structure (`{`, the keys, `:`,
    `,`) the choice is forced or nearly; inside the name string tens of thousands of tokens
    are fine; inside the integer only digits (and the end of the number) are.
    """)
    return


@app.cell
def _(allowed_ids, fresh_matcher, guided, llm, np, plt, so):
    _sample = next(_c for _c in guided if _c.finish_reason == "stop")
    replay_tokens = list(_sample.token_ids)
    _m = fresh_matcher()
    allowed_per_step = []
    for _t in replay_tokens:
        allowed_per_step.append(len(allowed_ids(_m)))
        assert _m.accept_token(_t), "the engine's token broke the grammar"
    replay_terminated = _m.is_terminated()
    _fig, _ax = plt.subplots(figsize=(10, 3.2))
    _ax.bar(range(len(replay_tokens)), allowed_per_step, color="tab:purple")
    _ax.set_yscale("log")
    _ax.axhline(so.vocab_size, color="k", ls="--", lw=1, label="vocabulary")
    _ax.set_xticks(range(len(replay_tokens)),
                   [repr(llm.tokenizer.decode([_t])) for _t in replay_tokens],
                   rotation=70, fontsize=7)
    _ax.set_ylabel("tokens allowed")
    _ax.legend(fontsize=8)
    _ax.set_title(f"sample: {_sample.text!r}", fontsize=9)
    _fig.tight_layout()
    forced_steps = int(np.sum(np.array(allowed_per_step) <= 2))
    print(f"{len(replay_tokens)} tokens; allowed per step {allowed_per_step}; steps with at "
          f"most 2 choices: {forced_steps}; grammar finished: {replay_terminated}")
    _fig
    return allowed_per_step, forced_steps, replay_terminated, replay_tokens


@app.cell
def _(mo):
    mo.md(r"""
    The last token is EOS: once the object is closed, the grammar allows nothing but the
    end of the sequence, so a guided request finishes with `finish_reason="stop"` the
    moment its JSON is complete. The matcher lives in the engine by sequence and advances
    with the sequence's own tokens; a preempted sequence (lesson 11) keeps its tokens, so
    its matcher picks up where it stopped, whether its KV cache was recomputed or swapped.

    ## What it costs

    Two runs of the same batch at temperature 1: unconstrained, and under the schema. The
    engine core's manager keeps the time its matchers spent filling the bitmasks; the trace
    has each step's duration.
    """)
    return


@app.cell
def _(GPU, GuidedDecodingParams, PROMPT, SCHEMA, SamplingParams, llm, so):
    def timed_run(batch, guided, max_tokens=24):
        """One batch of `batch` samples; -> steps, mean step ms, mask ms per step, masked
        rows, and the tokens generated."""
        core_so = llm.engine.core.structured_output     # the core's: matchers, bitmasks
        mask0, rows0 = core_so.mask_seconds, core_so.num_masked_rows
        params = SamplingParams(n=batch, temperature=1.0, max_tokens=max_tokens, seed=1,
                                ignore_eos=not guided,
                                guided_decoding=GuidedDecodingParams(json=SCHEMA)
                                if guided else None)
        with llm.engine.trace() as _steps:
            _out = llm.generate(PROMPT, params, use_tqdm=False)[0]
        return {"steps": len(_steps),
                "step_ms": 1e3 * sum(_s.duration for _s in _steps) / len(_steps),
                "mask_ms": 1e3 * (core_so.mask_seconds - mask0) / len(_steps),
                "rows": core_so.num_masked_rows - rows0,
                "tokens": sum(len(_c.token_ids) for _c in _out.outputs)}

    BATCHES = (1, 32) if GPU else (1, 16)
    print(f"timing batches {BATCHES}, free and guided ...", flush=True)
    timed_run(1, True, 4)                                       # warm-up
    cost = {(_b, _g): timed_run(_b, _g) for _b in BATCHES for _g in (False, True)}
    compile_ms = 1e3 * so.compile_seconds / max(so.num_compiled, 1)
    _rows = "\n".join(
        f"| {_b} | {'schema' if _g else 'none'} | {_r['steps']} | {_r['step_ms']:.1f} | "
        + (f"{_r['mask_ms']:.2f} | {_r['mask_ms'] / _r['step_ms']:.1%} |" if _g else "- | - |")
        for (_b, _g), _r in cost.items())
    cost_table = ("| batch | constraint | steps | ms per step | mask ms per step | share |\n"
                  "|---|---|---|---|---|---|\n" + _rows)
    for (_b, _g), _r in cost.items():
        print(f"batch {_b:3d} {'guided' if _g else 'free':6s}: {_r}")
    print(f"grammars compiled: {so.num_compiled}, {compile_ms:.0f} ms each on average")
    return BATCHES, compile_ms, cost, cost_table, timed_run


@app.cell
def _(BATCHES, compile_ms, cost, cost_table, device, mo):
    _big = cost[(BATCHES[-1], True)]
    mo.md(f"""
    {cost_table}

    Every sampled token of a guided sequence had its row masked: at batch {BATCHES[-1]},
    {_big['rows']} masked rows for {_big['tokens']} tokens. The mask cost
    **{_big['mask_ms']:.2f} ms** a step there, **{_big['mask_ms'] / _big['step_ms']:.1%}** of
    a step on this device ({device}; on a loaded machine the milliseconds wander, the counts
    do not). That is the core's matchers filling their rows, one by one on the host; the
    worker's part, turning the bits into -inf, is one vectorized call. Compiling the schema took about {compile_ms:.0f} ms,
    once: the second request with the same schema finds it in the cache. On a GPU the
    forward pass is much shorter, so the same host-side mask is a larger share of the step;
    vLLM fills the bitmasks while the GPU runs the forward pass for exactly that reason.
    """)
    return


@app.cell
def _(functools, sample, verdict):
    @functools.cache
    def break_run(temp, ws):
        """16 guided samples -> (valid, cut off by max_tokens, an example text)."""
        _outs = sample(guided=True, temperature=temp, n=16, max_tokens=32, strict_ws=ws)
        return (sum(verdict(_c.text) == "valid" for _c in _outs),
                sum(_c.finish_reason == "length" for _c in _outs),
                next((_c.text for _c in _outs if _c.finish_reason == "length"), _outs[0].text))
    return (break_run,)


@app.cell
def _(mo):
    temperature = mo.ui.slider(steps=[0.7, 1.0, 1.5, 2.0], value=2.0, show_value=True,
                               label="temperature")
    strict_ws = mo.ui.switch(value=False, label="disable_any_whitespace")
    mo.md(f"""
    ### Try it: can you break a guided request?

    The mask guarantees that every prefix of the output can still become valid JSON. It
    does not guarantee that the output ever ends. The slider starts hot, at temperature 2
    (16 guided samples, `max_tokens=32`): watch the finish reasons. Then switch off free
    whitespace between JSON tokens (vLLM's `disable_any_whitespace`), or cool the model down.

    {temperature} {strict_ws}
    """)
    return strict_ws, temperature


@app.cell
def _(break_run, mo, strict_ws, temperature):
    _valid, _cut, _example = break_run(temperature.value, strict_ws.value)
    mo.md(f"""
    temperature **{temperature.value}**, any whitespace **{'off' if strict_ws.value else 'on'}**:
    **{_valid}/16** valid, **{_cut}** cut off by `max_tokens`. Example: `{_example[:90]!r}`
    """)
    return


@app.cell
def _(break_run, mo):
    # The widget's two corners, measured in every mode (the docs page and the test read them).
    hot_free_ws = break_run(2.0, False)
    hot_strict_ws = break_run(2.0, True)
    print(f"temperature 2.0: whitespace free -> {hot_free_ws[:2]} (valid, cut off); "
          f"whitespace off -> {hot_strict_ws[:2]}")
    mo.md(f"""
    At temperature 2 with free whitespace, **{hot_free_ws[1]}** of 16 samples were cut off
    by `max_tokens` ({hot_free_ws[0]} valid): the flattened distribution wanders into
    newlines and spaces, which the grammar allows between any two JSON tokens, and never
    closes the object. Without free whitespace, **{hot_strict_ws[0]}**/16 were valid. A
    guided request still needs a `max_tokens` that leaves room to finish, and a schema that
    bounds its strings (`maxLength`) and its whitespace.
    """)
    return hot_free_ws, hot_strict_ws


@app.cell
def _(mo):
    # Headless, the right answer is filled in so that the checker's verdict is tested below.
    _headless = mo.app_meta().mode == "script" or "headless" in mo.cli_args()
    first_mask_guess = mo.ui.number(start=0, stop=49152, value=5 if _headless else 0,
                                    label="tokens the first mask allows")
    mo.vstack([mo.md(r"""
    ## Predict, then the engine checks: the first mask of a choice

    `GuidedDecodingParams(choice=["yes", "no"])` allows exactly two outputs. At the first
    step of such a request, how many of the 49,152 vocabulary tokens does the engine's mask
    let through? Write a number; the grammar the engine compiles for that request
    (`StructuredOutputManager.compile`, the same cached object its matchers use every step)
    decides, by its bitmask.
    """), first_mask_guess])
    return (first_mask_guess,)


@app.cell
def _(mo):
    mo.md(r"""
    ## Exercise: which tokens the first mask lets through

    You predicted *how many* tokens that first mask lets through; now write the rule that
    picks *which*. Fill in `allowed_first_tokens`: given the text of every token
    (`token_texts[i]` is token i decoded on its own) and the choices, return the set of ids
    the grammar allows first. The checker compares it with xgrammar's real bitmask. (Hint: a
    token is allowed if it begins some choice; EOS is not, the output may not be empty.)
    """)
    return


@app.function
def allowed_first_tokens(token_texts: list[str], choices: list[str]) -> set[int]:
    # Your code here: return the ids of the tokens that can start one of `choices`.
    return set()


@app.cell
def _(GuidedDecodingParams, allowed_ids, fresh_matcher, llm, so):
    CHOICES = ["yes", "no"]
    token_texts = [llm.tokenizer.decode([_i]) for _i in range(so.vocab_size)]
    choice_truth = set(allowed_ids(fresh_matcher(GuidedDecodingParams(choice=CHOICES))).tolist())

    def check_allowed_first_tokens(fn) -> str:
        got = set(fn(token_texts, CHOICES))
        if not got:
            return "Not yet: the function returns no token."
        if got == choice_truth:
            return (f"Correct: {len(got)} tokens, "
                    f"{sorted(token_texts[_i] for _i in got)}.")
        missing, extra = choice_truth - got, got - choice_truth
        return (f"Not quite: missing {sorted(token_texts[_i] for _i in missing)[:8]}, "
                f"not allowed {sorted(token_texts[_i] for _i in extra)[:8]}. A token is "
                "allowed if its whole text is a prefix of a choice (not the other way round).")

    def check_first_mask_guess(value):
        """The learner's count against the engine's compiled grammar's first bitmask."""
        truth = len(choice_truth)
        shown = sorted(token_texts[_i] for _i in choice_truth)
        if not value:
            return "Enter a number of tokens."
        if value == truth:
            return (f"Correct: {truth} tokens, {shown}. Every token whose text begins a "
                    "choice may come first; the grammar then allows only its continuation.")
        if value == len(CHOICES):
            return (f"That counts the choices, not the tokens. The mask allowed {truth}: "
                    f"{shown}. The tokenizer also has pieces of the words, and a first token "
                    "that is only a piece still leads to a valid output.")
        return (f"{'Too many' if value > truth else 'Too few'}: the mask allowed {truth}, "
                f"{shown}.")
    return (CHOICES, check_allowed_first_tokens, check_first_mask_guess, choice_truth,
            token_texts)


@app.cell
def _(check_first_mask_guess, first_mask_guess, mo):
    _msg = check_first_mask_guess(first_mask_guess.value)
    mo.callout(mo.md(f"Your prediction: **{first_mask_guess.value}** tokens. {_msg}"),
               kind="success" if _msg.startswith("Correct") else "neutral")
    return


@app.cell
def _(check_allowed_first_tokens, mo):
    _msg = check_allowed_first_tokens(allowed_first_tokens)
    mo.callout(mo.md(_msg), kind="success" if _msg.startswith("Correct") else "neutral")
    return


@app.cell
def _(
    CHOICES,
    N,
    allowed_after_name,
    allowed_per_step,
    argmax_allowed,
    check_allowed_first_tokens,
    check_first_mask_guess,
    choice_truth,
    cost,
    first_mask_guess,
    counts,
    forced_steps,
    hot_free_ws,
    hot_strict_ws,
    mass_removed,
    replay_terminated,
    replay_tokens,
    so,
    top_allowed,
):
    def test_the_constraint_does_the_work():
        assert counts["guided"]["valid"] == N
        assert counts["unconstrained"]["valid"] <= N * 3 // 4

    def test_one_mask_lets_few_tokens_through():
        assert 1 < len(allowed_after_name) < so.vocab_size // 100
        # The model mostly agrees with the grammar here: its favourite token is allowed and
        # the mask removes a tail, not the bulk (an inverted or shifted mask fails both).
        assert argmax_allowed and 1 <= top_allowed < 15
        assert 0 < mass_removed < 0.5

    def test_the_grammar_forces_structure_and_ends():
        assert len(allowed_per_step) == len(replay_tokens) and forced_steps >= 3
        assert max(allowed_per_step) > 1000 and replay_terminated

    def test_every_guided_token_was_masked():
        for (_b, _g), _r in cost.items():
            assert _r["rows"] == (_r["tokens"] if _g else 0)

    def test_the_widget_breaks_and_the_fix_holds():
        assert hot_free_ws[1] > hot_strict_ws[1]
        assert hot_strict_ws[0] > hot_free_ws[0]

    def test_exercise_checker():
        def reference(texts, choices):
            return {_i for _i, _s in enumerate(texts) if _s and any(_c.startswith(_s)
                                                                     for _c in choices)}
        assert check_allowed_first_tokens(reference).startswith("Correct")
        assert len(choice_truth) >= len(CHOICES)
        assert check_allowed_first_tokens(lambda t, c: set()).startswith("Not yet")
        # Whole choices only: the mask also allows the tokens that begin one ('y', 'n', ...).
        _whole = check_allowed_first_tokens(lambda t, c: {_i for _i, _s in enumerate(t)
                                                          if _s in c})
        assert _whole.startswith("Not quite") and "missing []" not in _whole, _whole
        # The other way round (a choice is a prefix of the token): 'yesterday' is not allowed.
        assert check_allowed_first_tokens(
            lambda t, c: {_i for _i, _s in enumerate(t) if _s and any(_s.startswith(_c)
                                                                     for _c in c)}
        ).startswith("Not quite")

    def test_the_engine_checks_the_first_mask_prediction():
        # The headless run answered 5 ('y', 'ye', 'yes', 'n', 'no' for SmolLM2's tokenizer);
        # the engine's compiled grammar decides, and the count of whole choices is turned down.
        assert check_first_mask_guess(first_mask_guess.value).startswith("Correct")
        assert check_first_mask_guess(len(CHOICES)).startswith("That counts the choices")
    return


@app.cell
def _(mo):
    # Shown at the end, under "Where the code lives".
    v1_box = mo.callout(mo.md(r"""
    **In vLLM V1** (as of vLLM 0.33). A request asks for a constraint with
    `SamplingParams.structured_outputs`, a `StructuredOutputsParams` (`vllm/sampling_params.py`):
    vLLM's new name for what it used to call `GuidedDecodingParams` / `guided_decoding`, the
    names minivllm still uses. `StructuredOutputManager` (`vllm/v1/structured_output/__init__.py`)
    compiles each request's grammar on a thread pool while the request waits in the scheduler
    (status `WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR`), with one backend per library
    (`backend_xgrammar.py`, `backend_guidance.py`, `backend_outlines.py`,
    `backend_lm_format_enforcer.py` beside it). The engine core hands the step to the
    executor without waiting, then asks `Scheduler.get_grammar_bitmask` for a `GrammarOutput`
    (the guided requests' ids and their rows of one bitmask) while the forward pass runs, and
    passes it to the model runner's `sample_tokens` (`vllm/v1/worker/gpu_model_runner.py`),
    which masks the logits before sampling; `update_from_output` advances each request's
    matcher with its new tokens. minivllm keeps the same shape with xgrammar only:
    `AsyncLLMEngine` compiles in a child process bounded in CPU time and memory (a schema can
    take minutes and gigabytes), the core fills the bitmask
    (`StructuredOutputManager.grammar_bitmask`, the matcher on the core's `Request`) before the
    forward pass and sends it in the `SchedulerOutput`, and the sampler applies it through
    `apply_logits_processors`.
    """), kind="info")
    return (v1_box,)


@app.cell
def _(
    BATCHES,
    allowed_after_name,
    compile_ms,
    cost,
    counts,
    hot_free_ws,
    hot_strict_ws,
    mass_removed,
    mo,
    unconstrained_failure_rate,
    v1_box,
):
    _big = cost[(BATCHES[-1], True)]
    findings = {
        "unconstrained_failure_rate": unconstrained_failure_rate,
        "guided_valid": counts["guided"]["valid"],
        "unconstrained_valid": counts["unconstrained"]["valid"],
        "allowed_after_name": len(allowed_after_name),
        "mass_removed_after_name": mass_removed,
        "mask_ms_per_step": {str(_b): cost[(_b, True)]["mask_ms"] for _b in BATCHES},
        "mask_share_of_step": {str(_b): cost[(_b, True)]["mask_ms"] / cost[(_b, True)]["step_ms"]
                               for _b in BATCHES},
        "compile_ms": compile_ms,
        "hot_cut_off": {"any_whitespace": hot_free_ws[1], "no_whitespace": hot_strict_ws[1]},
    }
    print("findings:", findings)
    mo.vstack([mo.md(f"""
    ## What we found

    * Unconstrained at temperature 1, **{unconstrained_failure_rate:.0%}** of the samples
      were not the JSON asked for; guided, **{counts['guided']['valid']}** of
      {counts['guided']['valid'] + counts['guided']['wrong shape'] + counts['guided']['not JSON']}
      were valid.
    * One step's mask after `{{"name":` allowed **{len(allowed_after_name)}** tokens and
      removed {mass_removed:.1%} of the model's probability.
    * The mask cost {_big['mask_ms']:.2f} ms per step at batch {BATCHES[-1]}
      ({_big['mask_ms'] / _big['step_ms']:.1%} of the step, on this device); compiling the
      schema about {compile_ms:.0f} ms, once.
    * A guided output is always a valid prefix, not always a finished one: at temperature 2
      with free whitespace, {hot_free_ws[1]} of 16 ran out of tokens.

    Every number from lesson 07 to here came from a 135M model on the machine running the page.
    Next, lesson 17: how many requests per second does Llama-3-70B on eight H100s take before
    its latency breaks, and do chunked prefill, NVLink, prefix caching and disaggregation pay
    there, answered by the engine's own scheduler on a simulated clock?

    ## Where the code lives

    * `minivllm/structured_output/manager.py`: `StructuredOutputManager.compile` (xgrammar, cached by
      constraint), `.matcher` (one per request, kept on the core's `Request`, fed its new
      tokens) and `.grammar_bitmask` (the step's bitmask, built in the core, sent with the
      `SchedulerOutput`).
    * `minivllm/sample/logits_processor.py`: the seam: `apply_logits_processors` runs min_tokens,
      the repetition / frequency / presence penalties, then the grammar's mask
      (`apply_grammar_bitmask`, torch alone), on the rows that ask for them.
    * `minivllm/sample/sampler.py`: `Sampler.__call__` calls the seam after reading raw logprobs
      and before temperature, top-k and top-p.
    * `minivllm/sampling_params.py`: `GuidedDecodingParams` (json, regex, choice, grammar,
      json_object), vLLM's shape under its older name (vLLM now calls it
      `StructuredOutputsParams`); `minivllm/entrypoints/openai/protocol.py`: `response_format` and the
      `guided_*` extras of the OpenAI server.
    * `minivllm/benchmarks/guided.py`: `minivllm bench guided`, compile time and mask cost at
      batch 1 and 32.
    """), v1_box])
    return (findings,)


if __name__ == "__main__":
    app.run()
