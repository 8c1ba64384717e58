import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell
def _():
    import minivllm.platforms  # noqa: F401  first: without CUDA, Triton's interpreter on

    import time
    from types import SimpleNamespace

    import marimo as mo
    import matplotlib.pyplot as plt
    import torch

    from minivllm import LLM, SamplingParams
    from minivllm.benchmarks.tp import (NVLINK4_BYTES_S, PCIE5_BYTES_S, measure_all_reduce,
                                   ring_all_reduce_seconds)
    from minivllm.core.kv_cache import REFERENCE_MODELS
    from minivllm.models import LlamaForCausalLM
    from minivllm.distributed.layers import parallelize
    from minivllm.distributed.parallel_state import check_tensor_parallel
    return (LLM, LlamaForCausalLM, NVLINK4_BYTES_S, PCIE5_BYTES_S, REFERENCE_MODELS,
            SamplingParams, SimpleNamespace, check_tensor_parallel, measure_all_reduce, mo,
            parallelize, plt, ring_all_reduce_seconds, time, torch)


@app.cell
def _(mo):
    mo.md(r"""
    # 15 · Tensor parallelism: one model, N processes, two all-reduces per layer

    After this lesson you can say how each matrix of a decoder layer is cut across N GPUs
    (which ones by output columns, which by input rows), why that costs exactly two
    all-reduces per layer, what each GPU then holds (1/N of the weights, 1/N of the KV
    heads, until there are fewer KV heads than GPUs), and when the communication eats the
    gain. You will run the default model split over three processes on this machine and
    check that it writes the same tokens as one process.

    Lesson 14 made one device's step cheaper, but no compiler makes Llama-3-70B's 140 GB of
    bf16 weights fit an 80 GB GPU.
    """)
    return


@app.cell
def _(LLM, mo, torch):
    llm = LLM(max_model_len=256, num_kv_blocks=64)
    cfg = llm.engine.model_config.hf_config
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    mo.md(f"**running on:** {device} · **model:** SmolLM2-135M-Instruct "
          f"({cfg.num_hidden_layers} layers, {cfg.num_attention_heads} query heads, "
          f"{cfg.num_key_value_heads} KV heads, hidden {cfg.hidden_size}, MLP "
          f"{cfg.intermediate_size}) · torch.distributed backend: "
          f"{'NCCL' if device != 'CPU' else 'gloo (TCP on this machine)'}  \n`{llm.engine!r}`")
    return cfg, device, llm


@app.cell
def _(mo):
    mo.md(r"""
    ## The problem: one device is not enough

    Llama-3-70B has 70 billion weights: 140 GB in bf16, more than the 80 GB of one H100,
    before a single token of KV cache. And even a model that fits is slow to decode on one
    device: every decode step reads every weight once, so at 3.35 TB/s an 8B model in bf16
    cannot go faster than ~16 GB / 3.35 TB/s = 4.8 ms per step. Split the weights across N
    GPUs and each one reads 1/N of them, with its own memory bandwidth. The price is that
    the GPUs must combine their partial results: that is what this lesson counts.
    (The numbers above are published specifications, not measured here.)
    """)
    return


@app.cell
def _(mo):
    mo.md(r"""
    ## How one layer splits (Megatron-LM's rule)

    A linear layer `y = x Wᵀ` can be cut two ways. **Column-parallel**: each rank keeps some
    rows of W, that is some *output* features, and computes its slice of y from the whole x:
    no communication. **Row-parallel**: each rank keeps some *input* features and computes a
    partial y from its slice of x; the true y is the sum of the N partials, an
    **all-reduce**. The trick is to chain them: q/k/v are column-parallel by head, so each
    rank holds whole heads, and attention needs nothing from other ranks; o_proj is
    row-parallel over exactly those heads, and one all-reduce restores the full hidden state.
    The MLP repeats the pattern: gate and up column-parallel, SiLU on the local slice,
    down row-parallel, all-reduce. Below are the real shapes of rank 0's shard, produced by
    `minivllm.distributed.layers.parallelize` on the meta device (no memory used).
    """)
    return


@app.cell
def _(LlamaForCausalLM, SimpleNamespace, cfg, parallelize, torch):
    def shard_shapes(config, tp, rank=0):
        """{layer name: (full shape, rank's shape)} of one decoder layer plus embeddings."""
        with torch.device("meta"):
            full = LlamaForCausalLM(config)
            split = LlamaForCausalLM(config)
            local = parallelize(split, config, SimpleNamespace(rank=rank, size=tp))
        out = {}
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            out[name] = (tuple(getattr(full.model.layers[0].self_attn, name).weight.shape),
                         tuple(getattr(split.model.layers[0].self_attn, name).weight.shape))
        for name in ("gate_proj", "up_proj", "down_proj"):
            out[name] = (tuple(getattr(full.model.layers[0].mlp, name).weight.shape),
                         tuple(getattr(split.model.layers[0].mlp, name).weight.shape))
        out["embed_tokens"] = (tuple(full.model.embed_tokens.weight.shape),
                               tuple(split.model.embed_tokens.weight.shape))
        return out, local

    TP = 3                       # SmolLM2's 9 heads split in 3 (not in 2: see below)
    smol_shapes, smol_local = shard_shapes(cfg, TP)
    layer_rows = "\n".join(f"| {_n} | {_f} | {_s} | "
                      f"{'column (output)' if _f[0] != _s[0] else 'row (input)'} |"
                      for _n, (_f, _s) in smol_shapes.items())
    print({k: v[1] for k, v in smol_shapes.items()})
    return TP, layer_rows, shard_shapes, smol_local, smol_shapes


@app.cell
def _(TP, layer_rows, mo, plt, smol_shapes):
    # Each weight matrix as a rectangle of its real (out, in) proportions, rank 0's part shaded.
    _fig, _ax = plt.subplots(1, 7, figsize=(11, 2.6))
    for _a, _name in zip(_ax, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                               "up_proj", "down_proj"]):
        (_o, _i), (_so, _si) = smol_shapes[_name]
        _a.add_patch(plt.Rectangle((0, 0), _i, _o, fill=False))
        for _r in range(TP):
            if _so != _o:       # column-parallel: a band of output rows per rank
                _a.add_patch(plt.Rectangle((0, _o - (_r + 1) * _so), _i, _so,
                                           alpha=0.25 + 0.25 * _r, color=f"C{_r}"))
            else:               # row-parallel: a band of input columns per rank
                _a.add_patch(plt.Rectangle((_r * _si, 0), _si, _o,
                                           alpha=0.25 + 0.25 * _r, color=f"C{_r}"))
        _a.set_xlim(0, max(_i, _o))
        _a.set_ylim(0, max(_i, _o))
        _a.set_aspect("equal")
        _a.set_xticks([])
        _a.set_yticks([])
        _a.set_title(f"{_name}\n{_o}x{_i}", fontsize=8)
    _fig.suptitle(f"SmolLM2's layer over tp={TP} ranks (colour = rank): bands of rows are "
                  "column-parallel, bands of columns row-parallel", fontsize=9)
    _fig.tight_layout()
    mo.vstack([_fig, mo.md("| layer | full (out, in) | rank 0 | split |\n|---|---|---|---|\n"
                           + layer_rows)])
    return


@app.cell
def _(mo):
    mo.md(r"""
    ## Live: the same model over three processes

    `LLM(tensor_parallel_size=3)` starts two worker processes (rank 1 and 2) next to this
    one (rank 0). Every rank builds the model, swaps its layers for their shards, and loads
    only its slice of each weight. The scheduler and the block manager exist once, in the
    `EngineCore`, and no rank's worker owns them: each step the core's `MultiprocExecutor`
    puts the same `SchedulerOutput` (a few KB of ints) on every rank's queue, all three
    `Worker`s run the same `ModelRunner.execute_model` on it, meeting in the all-reduces
    (gloo over TCP here, NCCL on GPUs), and rank 0's sampled tokens go back to the scheduler.

    That is vLLM V1's layout, with one difference in where rank 0 sits. In V1 the
    `EngineCore` process holds the scheduler, and its `MultiprocExecutor` starts a worker
    process for *every* rank, rank 0 included, broadcasting each `SchedulerOutput` over a
    shared-memory message queue. Here rank 0's worker lives in the core's process (one copy
    of its output saved; a plain multiprocessing queue per worker instead of shared memory).
    vLLM V0 had a different layout again: the scheduler ran beside a *driver* worker on rank
    0, which prepared the batch's tensors and broadcast them to the other ranks. First, the
    size that does *not* work:
    """)
    return


@app.cell
def _(LLM, SamplingParams, TP, llm, mo, time):
    try:
        LLM(tensor_parallel_size=2)
        refusal = "(accepted?)"
    except ValueError as _e:
        refusal = str(_e)
    PROMPTS = ["The capital of France is", "def fibonacci(n):\n    ",
               "Once upon a time, in a small village by the sea,"]
    NEW_TOKENS = 12
    _params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    _t0 = time.perf_counter()
    tp1_tokens = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, _params, use_tqdm=False)]
    tp1_s = time.perf_counter() - _t0
    print(f"starting {TP - 1} worker processes for tensor_parallel_size={TP} (each loads "
          "the model: tens of seconds on a CPU) ...", flush=True)
    _t0 = time.perf_counter()
    llm_tp = LLM(tensor_parallel_size=TP, max_model_len=256, num_kv_blocks=64)
    tp_start_s = time.perf_counter() - _t0
    runner = llm_tp.engine.runner
    _before = runner.tp.num_all_reduce
    _bytes_before = runner.tp.all_reduce_bytes
    with llm_tp.engine.trace() as _steps:
        _t0 = time.perf_counter()
        _outs = llm_tp.generate(PROMPTS, _params, use_tqdm=False)
        tpn_s = time.perf_counter() - _t0
    tpn_tokens = [o.outputs[0].token_ids for o in _outs]
    num_steps = len(_steps)
    all_reduce_per_step = (runner.tp.num_all_reduce - _before) / num_steps
    # Bytes rank 0 handed to its all-reduces, counted by the group, and the tokens the steps
    # computed (prompt tokens in prefill steps, one per sequence in decode steps).
    all_reduce_bytes = runner.tp.all_reduce_bytes - _bytes_before
    tokens_computed = sum(_s.num_batched_tokens for _s in _steps)
    dtype_bytes = llm_tp.engine.dtype.itemsize
    same_tokens = tpn_tokens == tp1_tokens
    rank_bytes = llm_tp.engine.model_executor.rank_weight_bytes
    kv_heads_per_rank = runner.kv_cache.shape[4]
    _text = _outs[0].outputs[0].text
    mo.md(f"""
    `LLM(tensor_parallel_size=2)` → **refused**: *{refusal}*

    With `tensor_parallel_size={TP}`: started in {tp_start_s:.1f} s; {len(PROMPTS)} greedy
    requests of {NEW_TOKENS} tokens in **{num_steps} steps**; the tokens are
    **{'identical to' if same_tokens else 'DIFFERENT from'}** the single-process run's
    ("{PROMPTS[0]}" → "{_text}"). Rank 0 made **{all_reduce_per_step:.0f} all-reduces per
    step**, handing them **{all_reduce_bytes:,} bytes** for the {tokens_computed} tokens the
    steps computed: {all_reduce_bytes // tokens_computed:,} bytes per token, one hidden
    vector ({llm_tp.engine.model_config.hf_config.hidden_size} x {dtype_bytes} bytes) per all-reduce.
    The traffic follows the tokens of a step, not the weights: a prefill step of 40 tokens
    moves 40 times what a one-token decode step moves. Wall time: {tpn_s:.2f} s at tp={TP}
    against {tp1_s:.2f} s in one process
    (on one CPU the three ranks share the same cores and memory, so splitting cannot win
    here; see the benchmark in docs/benchmarks.md).
    """)
    return (PROMPTS, all_reduce_bytes, all_reduce_per_step, dtype_bytes, kv_heads_per_rank,
            llm_tp, num_steps, rank_bytes, refusal, runner, same_tokens, tokens_computed,
            tp1_tokens, tpn_tokens)


@app.cell
def _(TP, cfg, kv_heads_per_rank, llm, mo, rank_bytes):
    _full = sum(p.numel() * p.element_size() for p in llm.engine.runner.model.parameters())
    _split_share = [b["split"] / (_full - (b["total"] - b["split"])) for b in rank_bytes]
    _rows = "\n    ".join(f"| {_r} | {b['total'] / 2**20:.1f} | {b['split'] / 2**20:.1f} | "
                      f"{(b['total'] - b['split']) / 2**20:.3f} | {_s:.3f} |"
                      for _r, (b, _s) in enumerate(zip(rank_bytes, _split_share)))
    split_share = _split_share
    mo.md(f"""
    ## Memory per rank

    One process holds {_full / 2**20:.1f} MiB of weights (fp32). Each rank of the tp={TP}
    engine holds:

    | rank | weights MiB | split layers MiB | replicated (norms) MiB | share of the split layers |
    |---|---|---|---|---|
    {_rows}

    The norms are copied on every rank (a few KiB); everything else is cut in {TP}. Each
    rank's KV pool holds **{kv_heads_per_rank}** of the {cfg.num_key_value_heads} KV heads,
    so a token's cache costs each rank 1/{TP} of the single-process figure, and the pool
    holds {TP}x more tokens in the same memory.
    """)
    return (split_share,)


@app.cell
def _(mo):
    mo.md(r"""
    ## What the communication costs

    Each all-reduce moves one (tokens, hidden) activation: 2 per layer, plus one for the
    vocabulary-split embedding (and an all-gather of the logits). Below, gloo's all-reduce
    between two processes of this machine, measured, beside what a ring all-reduce of the
    same message would take on NVLink 4 (450 GB/s per direction) and PCIe 5.0 x16
    (64 GB/s), **computed** from bandwidth alone (real links add several microseconds of
    latency per call, which dominates the small messages of a decode step).
    """)
    return


@app.cell
def _(NVLINK4_BYTES_S, PCIE5_BYTES_S, measure_all_reduce, mo, plt, ring_all_reduce_seconds):
    SIZES = [1 << k for k in (10, 13, 16, 19, 22)]          # 1 KiB .. 4 MiB
    print("timing gloo all-reduces between two processes ...", flush=True)
    gloo_s = measure_all_reduce(SIZES, tp=2, repeats=5)
    _fig, _ax = plt.subplots(figsize=(6.5, 3.4))
    _ax.loglog(SIZES, [1e6 * gloo_s[s] for s in SIZES], "o-", label="gloo here (measured)")
    for _bw, _name in ((NVLINK4_BYTES_S, "NVLink 4 (computed)"),
                       (PCIE5_BYTES_S, "PCIe 5.0 x16 (computed)")):
        _ax.loglog(SIZES, [1e6 * ring_all_reduce_seconds(s, 2, _bw) for s in SIZES], "--",
                   label=_name)
    _ax.axvline(576 * 4, color="gray", lw=0.8)
    _ax.text(576 * 4, 2e-2, " SmolLM2 decode, 1 token (fp32)", fontsize=7, rotation=90)
    _ax.set_xlabel("message, bytes")
    _ax.set_ylabel("all-reduce, us")
    _ax.legend(fontsize=7)
    _fig.tight_layout()
    gloo_us_small = 1e6 * gloo_s[SIZES[0]]
    mo.vstack([_fig, mo.md(f"A 1 KiB all-reduce took **{gloo_us_small:.0f} us** here: "
                           "almost all of it fixed cost (system calls, TCP, waking the other "
                           "process), not bandwidth. That fixed cost, paid 2 x layers times "
                           "per step, is why tensor parallelism wants NVLink and small N.")])
    return SIZES, gloo_s, gloo_us_small


@app.cell
def _(REFERENCE_MODELS, mo):
    model_pick = mo.ui.dropdown(["Llama-3-8B", "Llama-3-70B", "Qwen3-32B", "SmolLM2-135M"],
                                value="Llama-3-70B", label="model")
    tp_pick = mo.ui.dropdown(["1", "2", "3", "4", "8", "16"], value="8", label="tp size")
    mo.md(f"""
    ## Widget: pick a model and a tp size

    Shapes from the models' config files ({', '.join(REFERENCE_MODELS)}); bf16 weights, an
    80 GB GPU per rank, one decoded token. Try Llama-3-70B at tp 2, any model at tp 3, and
    Llama-3-8B at tp 16.

    {model_pick} {tp_pick}
    """)
    return model_pick, tp_pick


@app.cell
def _(REFERENCE_MODELS, check_tensor_parallel, ring_all_reduce_seconds, NVLINK4_BYTES_S,
      PCIE5_BYTES_S):
    # Published intermediate sizes and vocabularies (config.json), for the weight count.
    MLP_VOCAB = {"SmolLM2-135M": (1536, 49152), "Qwen3-0.6B": (3072, 151936),
                 "Qwen3-8B": (12288, 151936), "Llama-3-8B": (14336, 128256),
                 "Qwen3-32B": (25600, 151936), "Llama-3-70B": (28672, 128256)}
    TIED = {"SmolLM2-135M", "Qwen3-0.6B"}

    def tp_plan(name: str, tp: int) -> dict:
        """Per-rank weights and KV per token, and the all-reduce traffic of one token."""
        from minivllm.core.kv_cache import reference_config
        layers, nh, nkv, hd, h = REFERENCE_MODELS[name]
        inter, vocab = MLP_VOCAB[name]
        import dataclasses
        config = dataclasses.replace(reference_config(name), intermediate_size=inter,
                                     vocab_size=vocab)
        try:
            check_tensor_parallel(config, tp)
        except ValueError as e:
            return {"error": str(e)}
        attn = h * hd * (2 * nh + 2 * nkv)                 # q, o + k, v
        heads = 1 if name in TIED else 2                   # embedding (+ lm_head if untied)
        weights = layers * (attn + 3 * h * inter) + heads * vocab * h
        kv_heads = max(1, nkv // tp)
        per_token = 2 * (2 * layers + 1) * h               # bf16 bytes all-reduced per token
        return {"weights_gb": 2 * weights / tp / 1e9, "kv_heads": kv_heads,
                "kv_kib_per_token": 2 * layers * kv_heads * hd * 2 / 1024,
                "all_reduces": 2 * layers + 1, "bytes_per_token": per_token,
                "nvlink_us": (2 * layers + 1) * 1e6 * ring_all_reduce_seconds(
                    2 * h, tp, NVLINK4_BYTES_S) if tp > 1 else 0.0,
                "pcie_us": (2 * layers + 1) * 1e6 * ring_all_reduce_seconds(
                    2 * h, tp, PCIE5_BYTES_S) if tp > 1 else 0.0}
    return (tp_plan,)


@app.cell
def _(mo, model_pick, tp_pick, tp_plan):
    _p = tp_plan(model_pick.value, int(tp_pick.value))
    if "error" in _p:
        _out = mo.callout(mo.md(f"**Refused**: {_p['error']}"), kind="danger")
    else:
        _fits = _p["weights_gb"] < 80
        _out = mo.callout(mo.md(
            f"**{_p['weights_gb']:.1f} GB** of weights per rank "
            f"({'fits' if _fits else '**does not fit**'} an 80 GB GPU, before any KV cache); "
            f"{_p['kv_heads']} KV head(s) per rank: **{_p['kv_kib_per_token']:.0f} KiB** of KV "
            f"per token per rank; **{_p['all_reduces']}** all-reduces per step of "
            f"{_p['bytes_per_token'] // _p['all_reduces']} bytes each for one token, "
            f"{_p['nvlink_us']:.1f} us of pure transfer on NVLink 4, {_p['pcie_us']:.1f} us "
            f"on PCIe 5.0 (bandwidth only)."), kind="success" if _fits else "warn")
    _out
    return


@app.cell
def _(mo):
    mo.md(r"""
    What the widget shows: at tp 2, Llama-3-70B still needs 70 GB per GPU and leaves
    almost nothing for the cache; at tp 3 every model but SmolLM2 is refused (32 or 64
    query heads do not split in 3 whole shares; SmolLM2's 9 and 3 do, and its 2 does not);
    and past tp 8 the 8 KV heads of Llama-3 can no longer be split, so each one is copied
    onto several ranks: the KV per token per rank stops shrinking while the weights keep
    shrinking.

    ## Exercise: count the all-reduces

    In one decode step of SmolLM2 (30 layers) at `tensor_parallel_size=3`, how many
    all-reduces does rank 0 make? (The logits' all-gather is not an all-reduce.)
    """)
    answer = mo.ui.number(start=0, stop=1000, value=0, label="all-reduces per step")
    answer
    return (answer,)


@app.cell
def _(all_reduce_per_step, cfg):
    def check_all_reduces(value):
        truth = int(all_reduce_per_step)
        if not value:
            return "Enter a number."
        if value == truth:
            return (f"Correct: {truth} = 2 per layer x {cfg.num_hidden_layers} layers + 1 for "
                    "the embedding, measured on rank 0 above.")
        if value == 2 * cfg.num_hidden_layers:
            return ("Close: the embedding is split over the vocabulary too, and each rank "
                    "only embeds the tokens of its range; one more all-reduce fills the rest.")
        if value == 3 * cfg.num_hidden_layers or value == 3 * cfg.num_hidden_layers + 1:
            return "Too many: q, k and v need none, each rank holds whole heads."
        if value == cfg.num_hidden_layers or value == cfg.num_hidden_layers + 1:
            return "Too few: attention's o_proj and the MLP's down_proj each need one."
        return "Count the row-parallel layers per decoder layer, then the embeddings."
    return (check_all_reduces,)


@app.cell
def _(answer, check_all_reduces, mo):
    _msg = check_all_reduces(answer.value)
    mo.callout(mo.md(_msg), kind="success" if _msg.startswith("Correct") else "neutral")
    return


@app.cell
def _(TP, all_reduce_bytes, all_reduce_per_step, cfg, check_all_reduces, dtype_bytes,
      kv_heads_per_rank, num_steps, rank_bytes, refusal, same_tokens, split_share,
      tokens_computed, tp_plan):
    def test_tp_matches_one_process():
        assert same_tokens

    def test_two_all_reduces_per_layer_plus_the_embedding():
        assert all_reduce_per_step == 2 * cfg.num_hidden_layers + 1
        assert num_steps > 0

    def test_each_rank_holds_a_third():
        assert len(rank_bytes) == TP
        assert all(abs(s - 1 / TP) < 1e-6 for s in split_share)
        assert kv_heads_per_rank == cfg.num_key_value_heads // TP

    def test_tp2_refused_for_nine_heads():
        assert "9 attention heads" in refusal

    def test_widget_plans():
        assert "error" in tp_plan("Llama-3-70B", 3)
        assert tp_plan("Llama-3-70B", 2)["weights_gb"] > 60 > tp_plan("Llama-3-70B", 4)[
            "weights_gb"]
        assert tp_plan("Llama-3-8B", 16)["kv_heads"] == tp_plan("Llama-3-8B", 8)["kv_heads"]

    def test_all_reduce_bytes_follow_the_tokens():
        # Counted by rank 0's group: each all-reduce sums one hidden vector per token computed.
        per_token = (2 * cfg.num_hidden_layers + 1) * cfg.hidden_size * dtype_bytes
        assert all_reduce_bytes == tokens_computed * per_token > 0

    def test_exercise():
        assert check_all_reduces(61).startswith("Correct")
        assert "embedding" in check_all_reduces(60)
    return


@app.cell
def _(TP, all_reduce_bytes, all_reduce_per_step, gloo_us_small, kv_heads_per_rank, llm_tp,
      mo, same_tokens, split_share, tokens_computed):
    findings = {
        "tp": TP,
        "tp_tokens_identical": same_tokens,
        "all_reduce_per_step": int(all_reduce_per_step),
        "all_reduce_bytes": all_reduce_bytes,
        "all_reduce_bytes_per_token": all_reduce_bytes // tokens_computed,
        "split_share_per_rank": [round(s, 6) for s in split_share],
        "kv_heads_per_rank": kv_heads_per_rank,
        "gloo_all_reduce_1kib_us": round(gloo_us_small, 1),
    }
    llm_tp.engine.shutdown()             # the worker processes end here
    print("findings:", findings)
    mo.md(f"""
    ## What we found

    * Split over {TP} processes, SmolLM2 wrote **{'the same' if same_tokens else 'different'}**
      tokens as in one process: the split changes where the arithmetic happens, not what it
      computes (up to the order of a few float additions).
    * Rank 0 made **{int(all_reduce_per_step)}** all-reduces per step: two per layer and one
      for the embedding, and handed them **{all_reduce_bytes // tokens_computed:,} bytes per
      token computed** ({all_reduce_bytes:,} in all, counted): the link's load grows with
      the batch's tokens. Each rank held 1/{TP} of the split weights and
      **{kv_heads_per_rank}** KV head.
    * Over gloo on this machine, even a 1 KiB all-reduce cost **{gloo_us_small:.0f} us**: on
      one CPU, tensor parallelism only adds work. It pays where each rank has its own
      memory bandwidth and a fast link between them.

    Split three ways, the model wrote the same tokens: like speculative decoding (07), chunked
    prefill (10) and preemption (11), tensor parallelism changes where and when tokens are
    computed, never which. Next, lesson 16: how does the engine restrict which tokens may be
    sampled, so that a reply is valid JSON, and what does that mask cost per step?

    ## Where the code lives

    * `minivllm/distributed/layers.py`: `parallelize` (the split of every layer),
      `ColumnParallelLinear`, `RowParallelLinear` (the all-reduce), `VocabParallelEmbedding`,
      `ParallelLMHead` (the all-gather).
    * `minivllm/distributed/parallel_state.py`: `TensorParallelGroup` (the collectives),
      `check_tensor_parallel`, `kv_head_range`.
    * `minivllm/executor/multiproc_executor.py`: `MultiprocExecutor` (starts ranks 1..N-1,
      keeps rank 0's worker as the driver, and `collective_rpc` sends every call, a step's
      `SchedulerOutput` included, to every rank) and `_worker_main` (ranks 1..N-1).
    * `minivllm/worker/worker.py` and `minivllm/worker/model_runner.py`: the same `Worker` and
      `ModelRunner.execute_model` on every rank; the KV pool sized from this rank's heads
      (`kv_config`) and the same block count on every rank (`Worker.determine_num_blocks`).
    * `minivllm/models/loader.py`: `load_weights` asks a split layer for its `shard` of each tensor.
    * `minivllm/benchmarks/tp.py`: `minivllm bench tp` (all-reduce sizes, tp=1 against tp=3).
    """)
    return (findings,)


@app.cell
def _(mo):
    mo.callout(mo.md(r"""
    **In vLLM V1** (as of vLLM 0.33). Open `vllm/v1/executor/multiproc_executor.py`:
    `MultiprocExecutor` starts a `WorkerProc` for every rank, and `collective_rpc` enqueues
    each call on `rpc_broadcast_mq`, a shared-memory `MessageQueue`
    (`vllm/distributed/device_communicators/shm_broadcast.py`); `execute_model` waits only
    for the output rank's `ModelRunnerOutput`. The split layers are in
    `vllm/model_executor/layers/linear.py` (`ColumnParallelLinear`, `QKVParallelLinear`,
    `MergedColumnParallelLinear`, `RowParallelLinear`) and `vocab_parallel_embedding.py`;
    the groups in `vllm/distributed/parallel_state.py`. minivllm differs in three ways, each
    to stay small and run on a CPU: rank 0 shares the core's process, the messages go over
    plain multiprocessing queues, and the all-reduce is `torch.distributed`'s (gloo or NCCL)
    where vLLM has its own custom all-reduce kernel for NVLink
    (`device_communicators/custom_all_reduce.py`). Pipeline stages and data-parallel replicas
    are lesson 18's.
    """), kind="info")
    return


if __name__ == "__main__":
    app.run()
