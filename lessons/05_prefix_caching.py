import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell
def _():
    import marimo as mo
    import matplotlib.pyplot as plt
    import numpy as np
    import torch
    from matplotlib.colors import LogNorm

    from minivllm import LLM, SamplingParams
    from minivllm.core.block_manager import BlockManager
    from minivllm.core.request import Request

    return (BlockManager, LLM, LogNorm, SamplingParams, Request, mo, np, plt, torch)


@app.cell
def _(mo):
    mo.md(r"""
    # 05 · Prefix caching

    After this lesson you can explain why two requests that start with the same tokens have
    exactly the same keys and values for those tokens, predict to the token how much of a
    prompt vLLM's automatic prefix caching will skip, and read the chain of block hashes
    that makes the lookup cheap. You will measure it on the real model with an agent whose
    every turn resends its whole history, and with many users behind one long system prompt.

    *Terms: TTFT, ITL, E2E latency, throughput and goodput are defined once for the course,
    in seconds and in engine steps, on the Glossary page (docs/glossary.md).*
    """)
    return


@app.cell
def _(LLM, SamplingParams, mo, torch):
    # One loaded model; each experiment below starts with llm.reconfigure(enable_prefix_caching=
    # ...): a fresh KV pool and an empty prefix cache over the same weights. A step carries at
    # most 256 tokens (CPU-sized), so long prompts are prefilled in chunks.
    BLOCK_SIZE = 16
    llm = LLM(max_model_len=1024, block_size=BLOCK_SIZE, max_num_batched_tokens=256,
              num_kv_blocks=512, enable_prefix_caching=True)
    llm.generate("Warm-up. " * 40, SamplingParams(max_tokens=2), use_tqdm=False)  # one-time setup
    BIG = torch.cuda.is_available()          # a GPU runs the larger settings below
    mo.md(f"**running on:** {torch.cuda.get_device_name() if BIG else 'CPU'} · **model:** "
          f"SmolLM2-135M-Instruct ({str(llm.engine.dtype).removeprefix('torch.')})  \n"
          f"`{llm.engine!r}`, prefix caching switched on and off with "
          "`llm.reconfigure(enable_prefix_caching=...)`")
    return BIG, BLOCK_SIZE, llm


@app.cell
def _(mo):
    mo.md(r"""
    ## The problem, measured: an agent resends its history every turn

    A chat API is stateless: every request carries the whole conversation so far, and each
    tool call of an agent is a new request (system prompt, tool descriptions, every earlier
    message and tool result, a few new tokens). Without help from the engine, each turn
    prefills all of it again. Below, a travel agent serves a traveller for several turns,
    answering greedily; the same conversation runs with prefix caching on, then off.
    """)
    return


@app.cell
def _(BLOCK_SIZE, llm):
    _tok = llm.tokenizer
    IM_END = _tok.convert_tokens_to_ids("<|im_end|>")

    def chat(role, text):
        """One message in SmolLM2's chat format, as token ids."""
        return _tok.encode(f"<|im_start|>{role}\n{text}<|im_end|>\n")

    ASSISTANT, NEWLINE = _tok.encode("<|im_start|>assistant\n"), _tok.encode("\n")
    SYSTEM_AGENT = (
        "You are TripPlanner, an assistant that plans and books travel by calling tools. "
        "To call a tool, answer with a single line of JSON: {\"tool\": name, \"args\": {...}}. "
        "The tool's result comes back in the next message.\n"
        "Tools:\n"
        "- search_flights(origin, destination, date): flights with id, departure, arrival, "
        "price in euros.\n"
        "- search_hotels(city, check_in, nights, max_price): hotels with id, rating, price "
        "per night.\n"
        "- get_weather(city, date): forecast with temperature range and rain probability.\n"
        "- convert_currency(amount, source, target): the amount in the target currency.\n"
        "- book(item_id, traveller): a booking reference.\n"
        "Rules: call one tool per message. Quote prices in the traveller's currency. If a "
        "tool fails, say so and try another way. Never invent a booking reference. Ask "
        "before booking anything that costs more than 500 euros. Keep answers under three "
        "sentences unless the traveller asks for details.")
    TURNS = [  # (result of the previous tool call, the traveller's next message)
        (None, "I live in Lisbon. Find me a flight to Oslo on 14 March; I'll stay four "
               "nights."),
        ('{"flights": [{"id": "TP1204", "dep": "07:10", "price": 189}, '
         '{"id": "SK832", "dep": "13:05", "price": 142}]}',
         "The cheaper one, please. What will the weather be like?"),
        ('{"city": "Oslo", "date": "14 March", "low": -4, "high": 3, "rain": 0.2, '
         '"snow": true}', "Cold! Find a hotel near the centre for under 150 euros a night."),
        ('{"hotels": [{"id": "H-OSL-77", "name": "Fjord Inn", "price": 138}, '
         '{"id": "H-OSL-12", "price": 119}]}', "Book the Fjord Inn for Ana Costa."),
        ('{"booking": "FJ-55821", "hotel": "H-OSL-77", "nights": 4, "total": 552}',
         "How much is the whole trip in US dollars?"),
    ]

    def common_prefix(a, b):
        """How many leading tokens two token lists share."""
        return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))

    def seen_before(prompt, earlier):
        """The longest prefix `prompt` shares with a token list computed earlier."""
        return max((common_prefix(prompt, e) for e in earlier), default=0)

    def predicted_hit(prompt, earlier):
        """Tokens of `prompt` that prefix caching should skip, by hand: what it shares with an
        earlier sequence, cut down to whole blocks, and never the prompt's last token (its
        logits are needed, so it is always computed)."""
        shared = seen_before(prompt, earlier)
        return BLOCK_SIZE * min(shared // BLOCK_SIZE, (len(prompt) - 1) // BLOCK_SIZE)

    def conversation(caching, params):
        """Play the agent's conversation with prefix caching on or off; a row per turn.
        `earlier` collects the token lists whose K/V the engine has computed."""
        engine = llm.reconfigure(enable_prefix_caching=caching).engine
        history, earlier, rows = chat("system", SYSTEM_AGENT), [], []
        for tool_result, user_text in TURNS:
            if tool_result is not None:
                history = history + chat("tool", tool_result)
            prompt = history + chat("user", user_text) + ASSISTANT
            hits_before = engine.stats().prefix_cache_hit_tokens
            out = llm.generate([prompt], params, use_tqdm=False)[0]
            answer = list(out.outputs[0].token_ids)
            rows.append({"prompt_tokens": len(prompt),
                         "hit_tokens": engine.stats().prefix_cache_hit_tokens - hits_before,
                         "predicted_hit_tokens": predicted_hit(prompt, earlier),
                         "seen_before": seen_before(prompt, earlier),
                         "ttft_s": out.metrics.ttft, "answer": answer})
            earlier.append(prompt + answer[:-1])   # all but the last sampled token have K/V
            history = prompt + answer + ([] if answer[-1] == IM_END else [IM_END]) + NEWLINE
        return rows

    return ASSISTANT, SYSTEM_AGENT, chat, common_prefix, conversation, predicted_hit


@app.cell
def _(BIG, SamplingParams, conversation, llm, mo):
    _params = SamplingParams(temperature=0, max_tokens=24 if BIG else 12)
    conv_cached, conv_uncached = conversation(True, _params), conversation(False, _params)
    turn_hit_rate = [r["hit_tokens"] / r["prompt_tokens"] for r in conv_cached]
    print("turn  prompt  hit (predicted)  hit rate  TTFT cached / uncached")
    for _i, (_a, _b) in enumerate(zip(conv_cached, conv_uncached)):
        print(f"{_i + 1:4d}  {_a['prompt_tokens']:6d}  {_a['hit_tokens']:4d} "
              f"({_a['predicted_hit_tokens']:4d})    {turn_hit_rate[_i]:7.1%}   "
              f"{1000 * _a['ttft_s']:6.0f} ms / {1000 * _b['ttft_s']:6.0f} ms")
    print("last answer:", repr(llm.tokenizer.decode(conv_cached[-1]["answer"])))
    # Without caching: how much of the prefill an earlier turn had already sent.
    _old = sum(r["seen_before"] for r in conv_uncached)
    _all = sum(r["prompt_tokens"] for r in conv_uncached)
    print(f"without caching the engine prefilled {_all} prompt tokens; {_old} "
          f"({_old / _all:.0%}) had been sent in an earlier turn")
    mo.md(f"""
    Without caching, **{_old / _all:.0%}** of the {_all} prompt tokens the engine prefilled
    had been sent, and computed, in an earlier turn (the red bars in the figure further down).
    The TTFT (time to first token) grows with the history, from
    {1000 * conv_uncached[0]['ttft_s']:.0f} ms on turn 1 to
    {1000 * conv_uncached[-1]['ttft_s']:.0f} ms on turn {len(conv_uncached)}, although each
    new message is a dozen words. Real agents run dozens of turns over tens of thousands of
    tokens: quadratic work for linear information.
    """)
    return conv_cached, conv_uncached, turn_hit_rate


@app.cell
def _(mo):
    mo.md(r"""
    ## Why the history's K/V can be reused at all

    Attention in a decoder-only transformer is causal: position *t* attends to positions
    *1..t* only. So in every layer the hidden state of token *t*, and its key and value, are a
    function of tokens *1..t* alone: two prompts that agree on their first *t* tokens have the
    same K/V there, whatever follows. The same numbers, not close ones.

    Here it is in the real cache. With prefix caching **off** (each request computes
    everything itself) we send two prompts: blocks 0-3 (tokens 0-63) the same system text,
    block 4 different words, blocks 5-6 the same words again at the same positions. While
    both decode, we read their block tables (`engine.requests[id].block_table`) and
    compare their blocks in `engine.runner.kv_cache`
    (`[layers, 2, num_blocks, block_size, kv_heads, head_dim]`), block by block and layer by
    layer.
    """)
    return


@app.cell
def _(BLOCK_SIZE, LogNorm, SYSTEM_AGENT, SamplingParams, chat, llm, np, plt, torch):
    _tok = llm.tokenizer
    _shared = chat("system", SYSTEM_AGENT)[:4 * BLOCK_SIZE]
    _own_a = _tok.encode(" Which flights leave Lisbon for Oslo on the morning of 14 March, "
                         "and how long do they take?")[:BLOCK_SIZE]
    _own_b = _tok.encode(" Show me hotels near the harbour with a view of the fjord, under "
                         "150 euros a night.")[:BLOCK_SIZE]
    _tail = _tok.encode(" Answer in one sentence, then list every tool you called, what you "
                        "asked it and what it returned, in the order you called them, with "
                        "prices in euros.")[:2 * BLOCK_SIZE]
    assert len(_own_a) == len(_own_b) == BLOCK_SIZE and len(_tail) == 2 * BLOCK_SIZE
    kv_prompts = {"kv-a": _shared + _own_a + _tail, "kv-b": _shared + _own_b + _tail}

    _engine = llm.reconfigure(enable_prefix_caching=False).engine
    for _rid, _ids in kv_prompts.items():
        _engine.add_request(_rid, _ids, SamplingParams(temperature=0, max_tokens=8,
                                                       ignore_eos=True))
    _seqs = {_rid: _engine.requests[_rid] for _rid in kv_prompts}
    while not all(_s.num_output_tokens for _s in _seqs.values()):   # both sampled a token
        _engine.step()
    _ta, _tb = _seqs["kv-a"].block_table, _seqs["kv-b"].block_table
    _kv = _engine.runner.kv_cache              # [layers, 2, num_blocks, block_size, kv_heads, hd]
    _num_blocks = len(kv_prompts["kv-a"]) // BLOCK_SIZE           # 7 full blocks each
    # kv_diff[layer, block]: largest |difference| over K and V of that block in that layer.
    kv_diff = torch.stack([
        (_kv[:, :, _ta[_i]] - _kv[:, :, _tb[_i]]).abs().amax(dim=(1, 2, 3, 4))
        for _i in range(_num_blocks)], dim=1).cpu()
    kv_block_equal = [bool(torch.equal(_kv[:, :, _ta[_i]], _kv[:, :, _tb[_i]]))
                      for _i in range(_num_blocks)]
    for _rid in kv_prompts:
        _engine.abort_request(_rid)
    print("block:              ", " ".join(f"{_i:>5d}" for _i in range(_num_blocks)))
    print("bit-identical K/V:  ", " ".join(f"{str(_e):>5}" for _e in kv_block_equal))
    print("identical at layer 0:", " ".join(f"{str(bool(_d == 0)):>5}"
                                           for _d in kv_diff[0]))
    print(f"physical blocks: a {list(_ta[:_num_blocks])}, b {list(_tb[:_num_blocks])}")
    _d = kv_diff.numpy()
    _fig, _ax = plt.subplots(figsize=(8, 4.2))
    _shown = np.where(_d == 0, np.nan, _d)          # exact zeros stay white
    _im = _ax.imshow(_shown, aspect="auto", cmap="magma_r",
                     norm=LogNorm(vmin=max(np.nanmin(_shown), 1e-3), vmax=np.nanmax(_shown)))
    for _b in range(_d.shape[1]):
        _ax.text(_b, -0.9, "equal" if kv_block_equal[_b] else "differ", ha="center",
                 fontsize=8, color="tab:green" if kv_block_equal[_b] else "tab:red")
    _ax.set_xticks(range(7), [f"{_i}\n{_w}" for _i, _w in
                              enumerate(["shared"] * 4 + ["own"] + ["repeated"] * 2)])
    _ax.set_xlabel("block (16 tokens)")
    _ax.set_ylabel("layer")
    _ax.set_ylim(_d.shape[0] - 0.5, -1.5)
    _fig.colorbar(_im, label="max |K or V difference| (white: exactly 0)")
    _ax.set_title("Two requests, K/V compared in the real cache", fontsize=10)
    _fig.tight_layout()
    _fig
    return kv_block_equal, kv_diff


@app.cell
def _(mo):
    mo.md(r"""
    The four shared blocks are **bit-identical in all 30 layers**: one request could have
    used the other's. Block 4, where the words differ, differs everywhere. Blocks 5 and 6 hold
    the same tokens at the same positions, yet differ from layer 1 on: at layer 0 a token's K/V
    come from its embedding and position alone; every later layer mixes in what came before.
    A cached block is reusable only by a request whose **whole prefix** up to the end of that
    block is the same, and the cache's key must say so.

    ## The mechanism: a chain of block hashes

    minivllm names each *full* block by a hash of its parent block's name and its own tokens
    (`hash_block_tokens` in `minivllm/core/prefix_cache.py`), so a name stands for everything from
    token 0 to the end of its block, the condition the heatmap showed:

    ```
    name(block 0) = hash(NONE_HASH,       tokens 0..15,      extra keys)
    name(block i) = hash(name(block i-1), tokens of block i, extra keys)
    ```

    So blocks 5 and 6 above, the same tokens after other words, get other names; and a prompt
    made of a served prompt's blocks moved one block earlier finds none of them (the
    "Try it" cell below counts its hits: 0).

    * **As each step is scheduled**, `cache_computed_blocks` names every block the step will
      fill, in the block manager's dictionary from name to physical block (as vLLM V1 does: the
      step writes all its K/V before attention reads any, so a request admitted later in the
      same step may already share them).
    * **At admission**, `allocate` walks the prompt's blocks from the first and stops at the
      first name it does not find (`_cached_prefix`). The hits join the block table with their
      reference count raised and their tokens count as computed; the scheduler schedules the
      rest. The walk stops one token short: the last prompt token's logits give the first
      output token, so it is always computed.

    A finished request's blocks keep their names at the back of the free list, so they are
    reused (and forgotten) last: LRU. Each entry also stores its tokens and parent, checked on
    a hit, so a hash collision costs a miss, never a wrong answer. Back to the agent:
    """)
    return


@app.cell
def _(conv_cached, conv_uncached, mo, np, plt, turn_hit_rate):
    _turns = np.arange(1, len(conv_cached) + 1)
    _prompt = np.array([r["prompt_tokens"] for r in conv_cached])
    _computed = _prompt - np.array([r["hit_tokens"] for r in conv_cached])
    _prompt_u = np.array([r["prompt_tokens"] for r in conv_uncached])
    conv_computed_cached, conv_computed_uncached = int(_computed.sum()), int(_prompt_u.sum())
    conv_outputs_identical = ([r["answer"] for r in conv_cached]
                              == [r["answer"] for r in conv_uncached])
    _ttft_c = np.array([r["ttft_s"] for r in conv_cached])
    _ttft_u = np.array([r["ttft_s"] for r in conv_uncached])
    # Turn 1 is cold either way: medians over the turns with a history. The checks assert on
    # the work (prompt tokens computed, counted by the engine); the time it buys is shown
    # beside it, since a shared machine can slow one run several-fold.
    conv_work_ratio = float(np.median(_prompt_u[1:] / _computed[1:]))
    conv_ttft_ratio = float(np.median(_ttft_u[1:] / _ttft_c[1:]))
    _old = np.array([r["seen_before"] for r in conv_uncached])   # sent in an earlier turn
    _fig, (_a, _b) = plt.subplots(1, 2, figsize=(10, 3.4))
    _a.bar(_turns - 0.2, _old, 0.4, color="tab:red", alpha=0.7,
           label="without caching: sent in an earlier turn")
    _a.bar(_turns - 0.2, _prompt_u - _old, 0.4, bottom=_old, color="tab:gray",
           label="without caching: new this turn")
    _a.bar(_turns + 0.2, _computed, 0.4, color="tab:blue", label="with caching")
    for _t, _r in zip(_turns, turn_hit_rate):
        _a.text(_t + 0.2, _prompt[_t - 1] * 0.05 + 5, f"{_r:.0%}\nhit", ha="center", fontsize=7)
    _a.set(xlabel="turn", ylabel="prompt tokens computed", title="prefill work per turn")
    _b.plot(_turns, 1000 * _ttft_u, "o-", color="tab:gray", label="without caching")
    _b.plot(_turns, 1000 * _ttft_c, "o-", color="tab:blue", label="with caching")
    _b.set(xlabel="turn", xticks=_turns, ylabel="ms", ylim=(0, None), title="TTFT")
    for _ax in (_a, _b):
        _ax.legend(fontsize=8, loc="upper left")
    _fig.tight_layout()
    _match = all(r["hit_tokens"] == r["predicted_hit_tokens"] for r in conv_cached)
    print(f"prompt tokens computed over {len(_turns)} turns: {conv_computed_uncached} without "
          f"caching, {conv_computed_cached} with; turns 2-{len(_turns)}: median "
          f"{conv_work_ratio:.1f}x fewer, TTFT median {conv_ttft_ratio:.1f}x lower; identical "
          f"answers: {conv_outputs_identical}")
    mo.vstack([_fig, mo.md(f"""
    After the cold first turn almost the whole prompt is found in the cache, and the share
    grows with the history. The engine computed **{conv_computed_cached}** prompt tokens
    instead of **{conv_computed_uncached}**: a turn with a history computed
    **{conv_work_ratio:.1f}x** fewer and had a **{conv_ttft_ratio:.1f}x** lower TTFT on this
    machine (medians over turns 2 on). The answers were
    {"identical, token for token" if conv_outputs_identical else "NOT identical"}: reused K/V
    changes the cost, not the result. Every hit count
    {"matched" if _match else "did NOT all match"} the hand prediction (`predicted` above):
    the previous turn's prompt and answer minus the last sampled token (never fed back, so it
    has no K/V), rounded down to whole blocks.
    """)])
    return (conv_computed_cached, conv_computed_uncached, conv_outputs_identical, conv_ttft_ratio,
            conv_work_ratio)


@app.cell
def _(mo):
    mo.md(r"""
    ## Many users, one system prompt

    The other common shape: one long system prompt, or a reference document, in front of
    every user's question. A documentation bot's first question runs alone and fills the
    cache; the others then arrive together. The same questions run with caching on and off.
    """)
    return


@app.cell
def _(ASSISTANT, BIG, BLOCK_SIZE, SamplingParams, chat, common_prefix, llm, mo, predicted_hit):
    SYSTEM_DOCS = (
        "You answer questions about minivllm, a small LLM serving engine. Use only the "
        "reference below; if the answer is not there, say you do not know.\n"
        "Reference.\n"
        "LLMEngine.step runs one iteration: the scheduler picks sequences and a number of new "
        "tokens for each under max_num_batched_tokens, the model runner builds input_ids, "
        "positions and slot_mapping, runs the model once and samples one token for every "
        "sequence that finished its prompt. The KV cache is a pool of blocks of block_size "
        "tokens; a sequence's block table maps its logical blocks to physical ones. "
        "BlockManager.allocate reserves blocks when a sequence is admitted, append_slots adds "
        "one when the last block is full, and free returns them. With enable_prefix_caching, "
        "allocate first looks up the longest cached prefix of the prompt, block by block, and "
        "marks those tokens as computed. A block is named by a hash of its parent's hash and "
        "its tokens, so equal hashes mean equal prefixes. Freed blocks stay in the cache "
        "until the pool needs them again, least recently used first. SamplingParams holds "
        "temperature, top_p, top_k, max_tokens, stop strings and a seed. RequestOutput "
        "carries the text, the token ids and metrics such as the time to first token.")
    QUESTIONS = [
        "What does LLMEngine.step do in one iteration?", "When does a sequence get a new block?",
        "How is a cached block named?", "Which freed blocks are reused first?",
        "Where do I find the time to first token?", "Can I stop generation at a string?",
        "What is a block table?", "Who decides how many tokens a sequence computes in a step?",
        "What does allocate do when prefix caching is on?", "What is in SamplingParams?",
    ][:10 if BIG else 5]
    docs_prefix = chat("system", SYSTEM_DOCS)
    docs_prompts = [docs_prefix + chat("user", _q) + ASSISTANT for _q in QUESTIONS]
    _params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    # With caching, the first question runs alone and fills the cache, then the others arrive
    # together. Without, only those later questions run (the first costs the same either way).
    _engine = llm.reconfigure(enable_prefix_caching=True).engine   # an empty prefix cache
    llm.generate(docs_prompts[:1], _params, use_tqdm=False)
    _first_hits = _engine.stats().prefix_cache_hit_tokens
    _cached = llm.generate(docs_prompts[1:], _params, use_tqdm=False)
    docs_hit_tokens = _engine.stats().prefix_cache_hit_tokens - _first_hits
    _uncached = llm.reconfigure(enable_prefix_caching=False).generate(docs_prompts[1:], _params,
                                                                      use_tqdm=False)
    docs_outputs_identical = ([o.outputs[0].token_ids for o in _cached]
                              == [o.outputs[0].token_ids for o in _uncached])
    # By hand: a later question finds what the first one computed (the other later questions
    # were prefilled in the same steps as it, too late to help).
    docs_predicted_hits = sum(predicted_hit(_p, [docs_prompts[0]]) for _p in docs_prompts[1:])
    docs_prefix_len, _later = len(docs_prefix), len(docs_prompts) - 1
    docs_prefix_skip = docs_hit_tokens / (_later * docs_prefix_len)
    _total = sum(len(_p) for _p in docs_prompts)
    _per_question, _with = docs_hit_tokens // _later, _total - _first_hits - docs_hit_tokens
    # What a token-level index (a radix tree) would reuse: every token all questions share.
    _shared = min(common_prefix(docs_prompts[0], _p) for _p in docs_prompts[1:])
    _ttft = [sum(o.metrics.ttft for o in _outs) / _later for _outs in (_uncached, _cached)]
    print(f"{len(docs_prompts)} questions behind a {docs_prefix_len}-token system prompt; "
          f"the first found {_first_hits} tokens cached; the later ones {docs_hit_tokens} "
          f"(predicted {docs_predicted_hits}): {docs_prefix_skip:.1%} of their system-prompt "
          f"tokens skipped; {_shared} tokens shared by all questions")
    print(f"prompt tokens computed: {_total} without caching, {_with} with; mean TTFT of the "
          f"later questions: {1000 * _ttft[0]:.0f} ms without, {1000 * _ttft[1]:.0f} ms with; "
          f"identical answers: {docs_outputs_identical}")
    mo.md(f"""
    Each later question found **{_per_question}** tokens ({_per_question // BLOCK_SIZE}
    blocks, as predicted) in the cache: **{docs_prefix_skip:.0%}** of the system prompt was
    not computed again, the prompts cost {_with} tokens of prefill instead of {_total}, and a
    later question's TTFT was {1000 * _ttft[1]:.0f} ms instead of
    {1000 * _ttft[0]:.0f} ms on this machine (a mean, and noisy), with
    {"identical" if docs_outputs_identical else "NOT identical"} answers. The questions share
    **{_shared}** tokens (the system prompt and the opening of a user message), but the last
    {_shared - _per_question} sit in a block that also holds each question's own words, so
    its name differs. SGLang's RadixAttention indexes tokens in a radix tree and reuses every
    shared token, at the price of a tree walk per lookup; vLLM's chain of block names costs
    one hash per block and leaves at most `block_size - 1` tokens per request on the table.
    """)
    return (docs_hit_tokens, docs_outputs_identical, docs_predicted_hits, docs_prefix,
            docs_prefix_len, docs_prefix_skip, docs_prompts)


@app.cell
def _(mo):
    shared_len = mo.ui.slider(0, 160, value=100, label="tokens the second prompt shares",
                              show_value=True)
    block_pick = mo.ui.slider(steps=[1, 2, 4, 8, 16, 32, 64, 128], value=16,
                              label="block_size", show_value=True)
    stamp = mo.ui.switch(label="prompts start with the request's timestamp")
    mo.md(f"""
    ## Try it: what does the second request find?

    Two 160-token prompts share their first tokens, then differ; the first has been served.
    How many tokens of the second does the cache skip? The cells below ask the real
    `BlockManager` (no model needed: which blocks hit depends only on tokens). Move the
    sliders, then find the one switch that turns a 95% hit rate into nothing at all.

    {shared_len}

    {block_pick}

    {stamp}
    """)
    return block_pick, shared_len, stamp


@app.cell
def _(BlockManager, SamplingParams, Request, docs_prefix, llm):
    PROMPT_LEN = 160
    _other = list(reversed(docs_prefix))               # different tokens for the tail
    _stamps = [llm.tokenizer.encode(f"Now: 09:41:{_s:02d}, 14 March 2025. ")
               for _s in (7, 9)]
    assert len(_stamps[0]) == len(_stamps[1])

    def hits_for(shared, block_size, timestamp=False):
        """Prompt A, then prompt B: A's first `shared` tokens, then others."""
        a = docs_prefix[:PROMPT_LEN]
        b = a[:shared] + [t for t in _other if t != a[min(shared, PROMPT_LEN - 1)]][
            :PROMPT_LEN - shared]
        if timestamp:                  # two seconds apart, in front of everything
            a, b = _stamps[0] + a, _stamps[1] + b
        return cached_hits(a, b, block_size)

    def cached_hits(a, b, block_size):
        """Serve prompt a, then allocate prompt b on a fresh BlockManager; return how many of
        b's tokens its prefix cache supplies."""
        bm = BlockManager(2 * (max(len(a), len(b)) // block_size + 1), block_size,
                          enable_prefix_caching=True)
        first = Request("a", a, SamplingParams())
        bm.allocate(first)
        first.num_computed_tokens = len(a)    # as the engine records after the model ran
        bm.cache_computed_blocks(first)
        bm.free(first)
        second = Request("b", b, SamplingParams())
        bm.allocate(second)
        return second.num_computed_tokens

    # B = A without its first block: every full block of B is in the cache, but one block
    # earlier, after other tokens. A block's name covers its whole prefix, so none may hit.
    shifted_hits = cached_hits(docs_prefix[:PROMPT_LEN], docs_prefix[16:PROMPT_LEN], 16)
    print(f"A's blocks moved one block earlier: {shifted_hits} tokens hit")
    return PROMPT_LEN, hits_for, shifted_hits


@app.cell
def _(PROMPT_LEN, block_pick, hits_for, mo, plt, shared_len, stamp):
    _bs, _n, _stamp = block_pick.value, shared_len.value, stamp.value
    _xs = list(range(PROMPT_LEN + 1))
    _ys = [hits_for(_x, _bs, _stamp) for _x in _xs]
    _hit = hits_for(_n, _bs, _stamp)
    _fig, _ax = plt.subplots(figsize=(8, 3.2))
    _ax.plot(_xs, _xs, "--", color="0.6", label="every shared token")
    _ax.step(_xs, _ys, where="post", color="tab:blue", label=f"hits, block_size {_bs}")
    _ax.plot([_n], [_hit], "o", color="tab:red")
    _ax.set(xlabel="tokens the second prompt shares with the first",
            ylabel="tokens found in the cache", title=f"{_n} shared tokens -> {_hit} hit "
            f"({_hit / PROMPT_LEN:.0%} of the prompt)" + (", timestamped" if _stamp else ""))
    _ax.legend(fontsize=8, loc="upper left")
    _fig.tight_layout()
    if _stamp:
        _note = ("The timestamp, a few tokens at the very start, differs per request: block "
                 "0's name differs, so every later name does too and nothing hits. Put "
                 "per-request data (dates, user ids) **after** the shared part, never before.")
    elif _n == PROMPT_LEN:
        _note = (f"The prompts are identical, yet {PROMPT_LEN - _hit} tokens are computed: the "
                 "lookup stops one token short (the last token's logits give the first output "
                 "token), and the block holding it is computed whole.")
    else:
        _note = (f"Only whole blocks are reused: {_n - _hit} of {_n} shared tokens are "
                 "recomputed, their block also holds tokens that differ. Slide to 160 "
                 "(identical prompts) and switch on the timestamp.")
    mo.vstack([_fig, mo.md(_note)])
    return


@app.cell
def _(docs_prefix_len, mo):
    mo.md(f"""
    ## Exercise: predict the hits

    The documentation bot's system message ({docs_prefix_len} tokens) is in the cache from its
    first question, with `block_size = 16`. A client keeps only its **first 203 tokens** and
    appends **30 tokens** of its own. How many of these 233 prompt tokens does the engine find
    cached? The next cell prefills the first question again with caching on, then sends
    exactly this request, so the checker compares you with the real thing.
    """)
    hits_answer = mo.ui.number(start=0, stop=10_000, value=0, label="tokens found cached")
    hits_answer
    return (hits_answer,)


@app.cell
def _(SamplingParams, docs_prefix, docs_prompts, llm, predicted_hit):
    _tok = llm.tokenizer
    _own = [t for t in _tok.encode(" Summarise the reference above in three short bullet "
                                   "points, for a reader who has never served a language "
                                   "model, and say which part matters most for speed.")
            if t != docs_prefix[203]][:30]
    exercise_prompt = docs_prefix[:203] + _own
    assert len(exercise_prompt) == 233

    # With caching on, prefill the first question (its full blocks get names), then the
    # exercise's prompt, and count the hits between the two.
    _engine = llm.reconfigure(enable_prefix_caching=True).engine
    _one = SamplingParams(temperature=0, max_tokens=1)
    llm.generate([docs_prompts[0]], _one, use_tqdm=False)
    _before = _engine.stats().prefix_cache_hit_tokens
    llm.generate([exercise_prompt], _one, use_tqdm=False)
    exercise_hits = _engine.stats().prefix_cache_hit_tokens - _before
    exercise_by_hand = predicted_hit(exercise_prompt, [docs_prompts[0]])
    print(f"exercise: the engine found {exercise_hits} of {len(exercise_prompt)} tokens "
          f"cached; by hand {exercise_by_hand}")
    return exercise_by_hand, exercise_hits


@app.cell
def _(exercise_hits, hits_answer, mo):
    def check_hits_answer(value):
        truth = exercise_hits
        hints = {
            0: "Enter a number of tokens. (If you meant 0: the first request ended long ago, "
               "but freed blocks keep their names until the pool needs them.)",
            203: "203 would reuse a partly shared block. Only whole blocks have names: tokens "
                 "192-202 live in block 12 next to tokens that differ, so block 12 misses. "
                 "Round down to a multiple of 16.",
            208: "That rounds up. A block that is only partly shared is a miss: round down.",
            272: "That is the whole system message's full blocks; the client kept only its "
                 "first 203 tokens.",
            **dict.fromkeys((224, 232, 233), "The client's own 30 tokens were never sent "
                            "before, so nothing after token 203 can be cached; count the whole "
                            "blocks of the shared part only."),
        }
        if value == truth:
            return (f"Correct: {truth} tokens, {truth // 16} whole blocks. Tokens 192-202 are "
                    "shared too, but they share block 12 with the client's own tokens, so "
                    "block 12 has another name and the walk stops there.")
        return hints.get(value or 0, f"{value} is not it: find where the two prompts part "
                         "(token 203), divide by block_size, round down, multiply back.")

    _msg = check_hits_answer(hits_answer.value)
    mo.callout(mo.md(_msg), kind="success" if _msg.startswith("Correct") else "neutral")
    return (check_hits_answer,)


@app.cell
def _(mo):
    tier_answer = mo.ui.number(start=0, stop=10_000, value=0,
                               label="prompt tokens the second pass computes, with the tier")
    mo.md(f"""
    ## A second tier: when the prefixes outgrow the GPU pool

    A GPU pool holds a few hundred thousand tokens; host memory, ten or a hundred times
    more. With `kv_offloading_size` (GiB of host memory, vLLM's setting and unit) every full
    block a step computes is also stored in a **CPU tier**, under the same name the prefix
    cache gives it, and it stays there after the GPU pool evicts it (least recently used
    first when the tier is full). At admission a prompt's blocks are looked up in the GPU
    pool first, then in the tier: the tier's hits are copied into the blocks just allocated
    and count as computed.

    The experiment: six manuals of about 95 tokens each, one per request, on a GPU pool of
    16 blocks (256 tokens, about two manuals), then the same six again. With the cache
    alone, the second pass finds nothing: a cyclic pass through more prefixes than the pool
    holds is the worst case of LRU, each manual evicted just before it is asked for again.

    **Predict first**: with the tier on (room for all of them), how many prompt tokens does
    the second pass compute, all six requests together? The engine runs both passes and
    counts.

    {tier_answer}
    """)
    return (tier_answer,)


@app.cell
def _(BLOCK_SIZE, SamplingParams, docs_prefix, llm):
    manuals = [llm.tokenizer.encode(f"Manual {_i}:") + docs_prefix[:90] for _i in range(6)]
    _pool_before = llm.engine.vllm_config.cache_config.num_kv_blocks

    def two_passes(tier_gib):
        """The six manuals, then the six again, one request at a time; -> the second pass's
        prompt tokens computed, its hits from each tier, its TTFT (ms) and its answers."""
        _engine = llm.reconfigure(num_kv_blocks=16, enable_prefix_caching=True,
                                  kv_offloading_size=tier_gib, max_num_seqs=1).engine
        _one = SamplingParams(temperature=0, max_tokens=4)
        llm.generate(manuals, _one, use_tqdm=False)
        _before = _engine.stats()
        with _engine.trace() as _steps:
            _outs = llm.generate(manuals, _one, use_tqdm=False)
        _after = _engine.stats()
        _gpu = _after.prefix_cache_hit_tokens - _before.prefix_cache_hit_tokens
        _cpu = _after.external_prefix_cache_hit_tokens - _before.external_prefix_cache_hit_tokens
        return {"computed": sum(_x.num_tokens for _s in _steps for _x in _s.scheduled
                                if _x.is_prefill),
                "prompt": sum(len(_m) for _m in manuals), "gpu_hits": _gpu, "cpu_hits": _cpu,
                "cached": [_o.num_cached_tokens for _o in _outs],
                "ttft_ms": [1000 * _o.metrics.ttft for _o in _outs],
                "answers": [_o.outputs[0].token_ids for _o in _outs]}
    second_pass = {"off": two_passes(None), "on": two_passes(0.05)}   # 0.05 GiB: ~70 blocks
    llm.reconfigure(num_kv_blocks=_pool_before, kv_offloading_size=None, max_num_seqs=64)
    # By hand: each manual's full blocks before its last token, from one tier or the other.
    tier_by_hand = sum(len(_m) - BLOCK_SIZE * ((len(_m) - 1) // BLOCK_SIZE) for _m in manuals)
    for _k, _r in second_pass.items():
        print(f"second pass, tier {_k}: {_r['computed']} of {_r['prompt']} prompt tokens "
              f"computed; {_r['gpu_hits']} from the GPU pool, {_r['cpu_hits']} from the CPU "
              f"tier; TTFT mean {sum(_r['ttft_ms']) / len(_r['ttft_ms']):.0f} ms")
    return manuals, second_pass, tier_by_hand


@app.cell
def _(BLOCK_SIZE, manuals, mo, plt, second_pass, tier_answer, tier_by_hand):
    def check_tier_answer(value):
        truth = second_pass["on"]["computed"]
        if value == truth:
            return (f"Correct: {truth} tokens. Every full block of every manual came back from "
                    "one tier or the other; what is left is each manual's last block, partly "
                    f"full, which holds the token whose logits are needed ({len(manuals[0])} "
                    f"tokens a manual: {len(manuals[0]) % BLOCK_SIZE or BLOCK_SIZE} of them).")
        if value == 0:
            return "Enter a number. (Nothing at all computed? The last token never is cached.)"
        if value == second_pass["off"]["computed"]:
            return ("That is the second pass without the tier: every manual computed again. "
                    "With it, the blocks the GPU pool dropped are in host memory.")
        return (f"{value} is not it: per manual, count the tokens after its last full block "
                f"of {BLOCK_SIZE}, and add them up.")
    _fig, _ax = plt.subplots(figsize=(7, 2.6))
    for _y, _k in enumerate(("off", "on")):
        _r, _left = second_pass[_k], 0
        for _part, _color in (("gpu_hits", "tab:green"), ("cpu_hits", "tab:purple"),
                              ("computed", "tab:orange")):
            _ax.barh(_y, _r[_part], left=_left, color=_color,
                     label=_part.replace("_", " ") if _y else None)
            _left += _r[_part]
    _ax.set_yticks([0, 1], ["tier off", "tier on"])
    _ax.set_xlabel("prompt tokens of the second pass")
    _ax.legend(fontsize=8, loc="lower right")
    _fig.tight_layout()
    _msg = check_tier_answer(tier_answer.value)
    mo.vstack([_fig, mo.callout(mo.md(f"Your prediction: **{tier_answer.value:g}**. {_msg}"),
                                kind="success" if _msg.startswith("Correct") else "neutral"),
               mo.md(f"""
    The same answers both ways ({second_pass["off"]["answers"] == second_pass["on"]["answers"]}):
    a loaded block holds the bits its request computed. The tier's price is the copies: each
    full block went to host memory once, and came back once per reuse; on a GPU they cross
    PCIe, beside the forward pass, and a load of 16 tokens' K/V is far cheaper than their
    prefill once prompts are long. The counts are exact: by hand, {tier_by_hand} tokens.
    """)])
    return (check_tier_answer,)


@app.cell
def _(check_hits_answer, check_tier_answer, conv_cached, conv_computed_cached,
      conv_computed_uncached, conv_outputs_identical, conv_work_ratio, docs_hit_tokens,
      docs_outputs_identical, docs_predicted_hits, docs_prefix_skip, exercise_by_hand,
      exercise_hits, hits_for, kv_block_equal, kv_diff, second_pass, shifted_hits,
      tier_by_hand, turn_hit_rate):
    def test_shared_prefix_kv_is_bit_identical():
        assert kv_block_equal[:4] == [True] * 4          # the 4 shared blocks, all layers
        assert not any(kv_block_equal[4:])

    def test_same_tokens_in_another_context_match_only_at_layer_0():
        assert float(kv_diff[0, 5:].max()) == 0.0
        assert bool((kv_diff[1:, 4:] > 0).all())

    def test_hit_rate_grows_over_the_conversation():
        assert turn_hit_rate[0] == 0.0
        assert turn_hit_rate[1] > 0.6
        assert all(b > a for a, b in zip(turn_hit_rate[1:], turn_hit_rate[2:]))

    def test_hits_exactly_as_predicted_from_block_size_and_shared_prefix():
        assert [r["hit_tokens"] for r in conv_cached] == [r["predicted_hit_tokens"]
                                                         for r in conv_cached]
        assert docs_hit_tokens == docs_predicted_hits > 0
        assert exercise_hits == exercise_by_hand == 192
        assert (hits_for(100, 16), hits_for(160, 16), hits_for(100, 16, True)) == (96, 144, 0)

    def test_cached_blocks_after_another_prefix_never_hit():
        # The tokens of every block are cached, in another context: the chained name misses.
        assert shifted_hits == 0

    def test_identical_greedy_outputs_with_and_without_caching():
        assert conv_outputs_identical and docs_outputs_identical

    def test_caching_skips_the_shared_prefix_and_saves_work():
        # Counted by the engine, not timed: the TTFT ratio is printed beside it, but wall time
        # on a shared machine can swing several-fold between two runs.
        assert docs_prefix_skip >= 0.9
        assert conv_computed_cached < conv_computed_uncached / 2
        assert conv_work_ratio > 3

    def test_the_cpu_tier_serves_what_the_gpu_pool_dropped():
        _off, _on = second_pass["off"], second_pass["on"]
        assert _off["cpu_hits"] == 0 and _off["computed"] > _off["prompt"] * 0.9   # LRU thrash
        assert _on["cpu_hits"] > 0 and _on["computed"] == tier_by_hand < _off["computed"]
        assert _on["answers"] == _off["answers"]
        assert sum(_on["cached"]) == _on["gpu_hits"] + _on["cpu_hits"]
        assert check_tier_answer(tier_by_hand).startswith("Correct")
        assert not check_tier_answer(_off["computed"]).startswith("Correct")

    def test_exercise_checker():
        assert check_hits_answer(192).startswith("Correct")
        assert "round down" in check_hits_answer(203).lower()
        assert "rounds up" in check_hits_answer(208)
        assert "freed blocks keep their names" in check_hits_answer(0)
    return


@app.cell
def _(mo):
    # Shown at the end, under "Where the code lives".
    v1_box = mo.callout(mo.md(r"""
    **In vLLM V1** (as of vLLM 0.33). At admission `KVCacheManager.get_computed_blocks`
    (`vllm/v1/core/kv_cache_manager.py`) walks the request's block hashes, chained by
    `hash_block_tokens` (`vllm/v1/core/kv_cache_utils.py`), to the first miss; `allocate_slots`
    adds the new blocks, and `BlockPool.cache_full_blocks` (`vllm/v1/core/block_pool.py`) names
    each block a step fills. A freed block keeps its hash in the pool's `free_block_queue`,
    oldest at the head, until `get_new_blocks` hands it out again: the free list is the LRU, as
    here. minivllm also checks a hit's tokens and parent, not only its hash, and puts unnamed
    blocks at the front of its free list, so that named ones are the last reused. The second
    tier is a KV connector, `OffloadingConnector`
    (`vllm/distributed/kv_transfer/kv_connector/v1/offloading_connector.py`, with its scheduler
    and worker halves in `offloading/` beside it, over `vllm/v1/kv_offload/`):
    `get_num_new_matched_tokens` counts the tier's hits after the GPU's, and by default the
    copies run on a CUDA stream while the request waits in `WAITING_FOR_REMOTE_KVS`; minivllm's
    copies run before the step's forward.
    """), kind="info")
    return (v1_box,)


@app.cell
def _(
    conv_computed_cached,
    conv_computed_uncached,
    conv_ttft_ratio,
    conv_work_ratio,
    docs_prefix_skip,
    mo,
    second_pass,
    turn_hit_rate,
    v1_box,
):
    findings = {
        "turn_hit_rate": [round(_r, 4) for _r in turn_hit_rate],
        "conversation_prompt_tokens_computed": (conv_computed_uncached, conv_computed_cached),
        "conversation_work_ratio": conv_work_ratio,
        "conversation_ttft_ratio": conv_ttft_ratio,
        "docs_prefix_skipped": docs_prefix_skip,
        "second_pass_computed_tier_off_on": (second_pass["off"]["computed"],
                                             second_pass["on"]["computed"]),
    }
    print("findings:", findings)
    mo.vstack([mo.md(f"""
    ## What we found

    * A shared prefix's K/V is bit-identical in every layer of two requests; the same tokens
      after a difference match only in layer 0. Reuse holds for whole prefixes: the chain.
    * The agent's hit rate per turn went {", ".join(f"{_r:.0%}" for _r in turn_hit_rate)}:
      {conv_computed_cached} prompt tokens computed instead of {conv_computed_uncached}
      (TTFT {conv_ttft_ratio:.1f}x lower on this machine), same answers.
    * Behind one system prompt, **{docs_prefix_skip:.0%}** of the later requests'
      system-prompt tokens were never computed; every hit count matched the prediction.
    * Six manuals through a pool that holds two, twice: the second pass computed
      {second_pass["off"]["computed"]} prompt tokens with the GPU cache alone and
      **{second_pass["on"]["computed"]}** with a CPU tier under it
      ({second_pass["on"]["cpu_hits"]} tokens loaded from host memory).

    ## Where the code lives

    * `minivllm/core/prefix_cache.py`: `hash_block_tokens` (a block's name), `PrefixCache`
      (name -> block, verified by tokens and parent; eviction of a block and its descendants).
    * `minivllm/core/block_manager.py`: `_cached_prefix` (the walk at admission, one token short),
      `allocate` (hits join the block table as computed), `cache_computed_blocks` (naming
      the blocks a step fills, as it is scheduled), `_release` (named blocks go to the back of the free list: LRU).
    * `minivllm/core/scheduler.py`: `_run` calls `cache_computed_blocks` as it schedules a sequence;
      `EngineCore.stats()` (`minivllm/engine/core.py`) reports `prefix_cache_queried_tokens` and
      `prefix_cache_hit_tokens`.
    * `minivllm/config/cache.py`: `enable_prefix_caching` (on by default, as in vLLM) and
      `kv_offloading_size` (the CPU tier, off by default, as in vLLM).
    * `minivllm/kv_offload/`: the CPU tier: `CPUOffloadingManager` (hash -> host block, LRU)
      and the KV connector's two sides (`connector.py`), which look the tier up after the GPU
      pool at admission and store each full block a step computes.
    * `minivllm bench prefix`: the same two workloads at a larger size, with and without
      caching, side by side.

    The site's Optimization catalog ranks prefix caching beside the other lessons' findings.
    """), v1_box])
    return


if __name__ == "__main__":
    app.run()
