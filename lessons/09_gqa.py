import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell
def _():
    import minivllm.platforms  # noqa: F401  first: without CUDA, Triton's interpreter on

    import dataclasses
    import json
    import shutil
    import tempfile
    import time
    from pathlib import Path

    import marimo as mo
    import matplotlib.pyplot as plt
    import torch
    from safetensors.torch import load_file, save_file

    from kernels.paged_attention import paged_decode_attention
    from kernels.paged_batch import random_paged_batch
    from minivllm import LLM, SamplingParams
    from minivllm.attention.metadata import AttentionMetadata
    from minivllm.attention.torch_attention import paged_attention
    from minivllm.core.block_manager import BlockManager
    from minivllm.core.kv_cache import kv_bytes_per_token, reference_config
    from minivllm.core.request import Request
    return (AttentionMetadata, BlockManager, LLM, Path, SamplingParams, Request,
            dataclasses, json, kv_bytes_per_token, load_file, mo, paged_attention,
            paged_decode_attention, plt, random_paged_batch, reference_config, save_file,
            shutil, tempfile, time, torch)


@app.cell
def _(mo):
    mo.md(r"""
    # 09 · GQA and MQA: fewer KV heads, a smaller cache

    After this lesson you can compute how the number of KV heads sets a model's cache size,
    how many sequences a block pool holds, and how many bytes each decode step must read; you
    will have seen that grouped-query attention is a property of the *model* (the engine
    only stores fewer heads), and that it cannot be switched on after training for free.

    Lesson 08 sent each prompt token's KV from one engine to the other, and the bytes per token
    are lesson 01's formula, with the model's number of KV heads as a factor. This lesson
    changes that factor.

    Multi-head attention (MHA) gives every query head its own key and value head.
    Multi-query attention (MQA) shares one K/V head among all query heads.
    Grouped-query attention (GQA, Ainslie et al. 2023) sits between: query heads are split into
    groups, one K/V head per group. SmolLM2-135M, the default model here, has 9 query heads
    and 3 KV heads: groups of 3.
    """)
    return


@app.cell
def _(LLM, mo, torch):
    KV_BUDGET = 256 << 20           # the same KV memory for every engine in this lesson
    llm = LLM(max_model_len=512, kv_cache_memory=KV_BUDGET)
    cfg = llm.engine.model_config.hf_config
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    kv_dtype = llm.engine.dtype
    mo.md(f"**running on:** {device} · **model:** SmolLM2-135M-Instruct "
          f"({cfg.num_attention_heads} query heads, {cfg.num_key_value_heads} KV heads, head "
          f"dim {cfg.head_dim}, {cfg.num_hidden_layers} layers) · "
          f"{str(kv_dtype).removeprefix('torch.')}  \n`{llm.engine!r}`")
    return KV_BUDGET, cfg, device, kv_dtype, llm


@app.cell
def _(mo):
    mo.md(r"""
    ## The problem, measured: bytes per token

    The cache stores K and V for every KV head, layer and token; query heads are not stored
    at all. So the KV head count is a direct multiplier (lesson 01's formula):
    $2 \times \text{layers} \times \text{KV heads} \times \text{head dim} \times
    \text{bytes}$. The same two models with all three choices:
    """)
    return


@app.cell
def _(cfg, dataclasses, kv_bytes_per_token, kv_dtype, mo, reference_config, torch):
    def variants(config):
        """num_kv_heads for MHA, the model's own GQA, and MQA."""
        return {"MHA": config.num_attention_heads, "GQA": config.num_key_value_heads, "MQA": 1}

    def bytes_per_token(config, num_kv_heads, dtype):
        return kv_bytes_per_token(dataclasses.replace(config, num_key_value_heads=num_kv_heads),
                                  dtype)

    _rows = []
    smol_bytes = {}
    for _name, _c, _dt in (("SmolLM2-135M", cfg, kv_dtype),
                           ("Llama-3-8B", reference_config("Llama-3-8B"), torch.bfloat16)):
        for _kind, _n in variants(_c).items():
            _b = bytes_per_token(_c, _n, _dt)
            if _name == "SmolLM2-135M":
                smol_bytes[_kind] = _b
            _rows.append(f"| {_name} ({str(_dt).removeprefix('torch.')}) | {_kind} | "
                         f"{_c.num_attention_heads} / {_n} | {_b:,} B | "
                         f"{_b * 8192 / 2**30:.2f} GiB |")
    print("SmolLM2 KV bytes per token:", smol_bytes)
    mo.md("| model | attention | query / KV heads | KV per token | one 8k-token sequence |\n"
          "|---|---|---|---|---|\n" + "\n".join(_rows))
    return bytes_per_token, smol_bytes, variants


@app.cell
def _(cfg, kv_bytes_per_token, kv_dtype, llm, mo):
    _pool = llm.engine.runner.kv_cache                # [layers, 2, blocks, block_size, Hkv, D]
    _tokens = _pool.shape[2] * _pool.shape[3]
    pool_bytes_per_token = _pool.numel() * _pool.element_size() // _tokens
    print(f"engine KV pool {tuple(_pool.shape)}: {pool_bytes_per_token:,} bytes per token "
          f"(formula: {kv_bytes_per_token(cfg, kv_dtype):,})")
    mo.md(f"""
    The engine's real pool has shape `{tuple(_pool.shape)}`: layers, K and V, blocks, slots
    per block, **{_pool.shape[4]} KV heads**, head dim. Its bytes divided by its slots give
    **{pool_bytes_per_token:,} bytes per token**, the formula's number.
    """)
    return (pool_bytes_per_token,)


@app.cell
def _(mo):
    mo.md(r"""
    ## The mechanism: query heads share K/V heads

    Query head $h$ reads KV head $\lfloor h / g \rfloor$ where $g$ = query heads / KV heads:
    consecutive query heads form a group. Attention itself is unchanged; each group's query
    heads simply look at the same keys and values. In the decode kernel
    (`kernels/paged_attention.py`) the $g$ query heads of a group become the rows of one tile,
    so each K/V byte is read once per group.

    Pick a KV head count for SmolLM2's 9 query heads and watch what it does to the cache, the
    pool, and the bytes a decode step reads (batch 32, 1,024-token contexts); further down,
    the same choice shows what the engine answers when it serves that checkpoint:
    """)
    return


@app.cell
def _(mo):
    kv_pick = mo.ui.dropdown(["9 (MHA)", "3 (GQA, the model's own)", "1 (MQA)"],
                             value="3 (GQA, the model's own)", label="num_kv_heads")
    kv_pick
    return (kv_pick,)


@app.cell
def _(BlockManager, Request, SamplingParams):
    def pool_capacity(kv_budget, bytes_per_token, block_size=16, seq_len=1024):
        """Sequences of seq_len tokens a block pool of kv_budget bytes admits, found by asking
        the engine's BlockManager until it says no."""
        bm = BlockManager(kv_budget // (bytes_per_token * block_size), block_size)
        n = 0
        while True:
            seq = Request(f"r{n}", [0] * seq_len, SamplingParams())
            if not bm.can_allocate(seq):
                return n, bm.num_blocks
            bm.allocate(seq)
            n += 1
    return (pool_capacity,)


@app.cell
def _(KV_BUDGET, bytes_per_token, cfg, kv_dtype, kv_pick, plt, pool_capacity):
    _n_kv = int(kv_pick.value.split()[0])
    _H = cfg.num_attention_heads
    _bpt = bytes_per_token(cfg, _n_kv, kv_dtype)
    _cap, _blocks = pool_capacity(KV_BUDGET, _bpt)
    _decode_mb = 32 * 1024 * _bpt / 2**20
    _fig, (_a, _b) = plt.subplots(1, 2, figsize=(10, 3.2), width_ratios=[3, 2])
    for _h in range(_H):
        _kvh = _h // (_H // _n_kv)
        _a.plot([_h, (_kvh + 0.5) * _H / _n_kv - 0.5], [1, 0], color=f"C{_kvh}", lw=1.5)
        _a.scatter([_h], [1], s=300, color=f"C{_kvh}", zorder=3)
        _a.text(_h, 1.12, f"q{_h}", ha="center", fontsize=8)
    for _j in range(_n_kv):
        _x = (_j + 0.5) * _H / _n_kv - 0.5
        _a.scatter([_x], [0], s=600, marker="s", color=f"C{_j}", zorder=3)
        _a.text(_x, -0.22, f"KV{_j}", ha="center", fontsize=8)
    _a.set_ylim(-0.4, 1.3)
    _a.axis("off")
    _a.set_title(f"{_H} query heads -> {_n_kv} KV head(s)")
    _vals = [_bpt / 1024, max(_cap, 0.5), _decode_mb]
    _b.barh(["KV bytes / token (KiB)", "1k-token sequences\nin the pool",
             "MiB of K/V per decode step\n(batch 32 x 1k, all layers)"], _vals, color="C0")
    for _i, _v in enumerate([_bpt / 1024, _cap, _decode_mb]):
        _b.text(_vals[_i], _i, f" {_v:,.0f}", va="center")
    _b.set_xscale("log")
    _b.set_xlim(0.4, 40 * max(_vals))
    _b.set_title(f"{KV_BUDGET >> 20} MiB pool = {_blocks} blocks of 16")
    _fig.tight_layout()
    print(f"num_kv_heads={_n_kv}: {_bpt:,} B/token, {_blocks} blocks, {_cap} sequences of 1,024 "
          f"tokens, {_decode_mb:,.0f} MiB of K/V per decode step at batch 32")
    _fig
    return


@app.cell
def _(KV_BUDGET, bytes_per_token, cfg, kv_dtype, pool_capacity, variants):
    capacity = {_k: pool_capacity(KV_BUDGET, bytes_per_token(cfg, _n, kv_dtype))[0]
                for _k, _n in variants(cfg).items()}
    print("sequences of 1,024 tokens in the same pool:", capacity)
    return (capacity,)


@app.cell
def _(mo):
    mo.md(r"""
    ## Live: the same model as MHA, and squeezed to MQA

    GQA is MHA with tied K/V heads. So SmolLM2 can be rewritten as an exact MHA model: give
    each query head its own copy of its group's K and V projections (9 KV heads, each
    repeated from one of the 3). The engine then stores 3x the bytes per token for the same
    outputs. Going the other way, averaging the 3 KV heads into 1 gives an MQA model, but not
    the same function: the model was trained with 3 distinct K/V heads. That averaging is
    only the first half of how the GQA paper (Ainslie et al., 2023) converts a checkpoint: it
    mean-pools each group's heads and then *uptrains* the result (about 5% of the original
    pre-training compute) so the model adapts to the shared heads; without the uptraining,
    as here, quality drops and the tokens change. Below, both rewritten
    checkpoints are written to a temporary folder and served by the real engine, with the
    same KV memory budget, next to the original.
    """)
    return


@app.cell
def _(Path, cfg, json, llm, load_file, save_file, shutil):
    def rewrite_kv_heads(src: Path, dst: Path, num_kv_heads: int) -> Path:
        """A copy of checkpoint `src` whose k_proj/v_proj have num_kv_heads heads: repeated
        (more heads) or averaged within a group (fewer). Lesson tool, not engine code."""
        dst.mkdir(parents=True, exist_ok=True)
        _old, _d = cfg.num_key_value_heads, cfg.head_dim
        tensors = load_file(src / "model.safetensors")
        for _name, _w in tensors.items():
            if _name.endswith(("k_proj.weight", "v_proj.weight")):
                _w = _w.view(_old, _d, -1)                             # (Hkv, D, hidden)
                if num_kv_heads > _old:
                    _w = _w.repeat_interleave(num_kv_heads // _old, 0)
                else:
                    _w = _w.view(num_kv_heads, _old // num_kv_heads, _d, -1).mean(1)
                tensors[_name] = _w.reshape(num_kv_heads * _d, -1).contiguous()
        save_file(tensors, dst / "model.safetensors")
        _config = json.loads((src / "config.json").read_text())
        _config["num_key_value_heads"] = num_kv_heads
        (dst / "config.json").write_text(json.dumps(_config))
        for _f in src.iterdir():
            if _f.name.startswith(("tokenizer", "chat_template")):
                shutil.copy(_f, dst / _f.name)
        return dst

    src_path = llm.engine.model_path
    assert not any("k_proj.bias" in k for k in load_file(src_path / "model.safetensors"))
    return rewrite_kv_heads, src_path


@app.cell
def _(
    KV_BUDGET,
    LLM,
    Path,
    SamplingParams,
    llm,
    mo,
    rewrite_kv_heads,
    src_path,
    tempfile,
    time,
):
    _prompts = ["The capital of France is", "def fibonacci(n):\n    "]
    _params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    live = {}
    with tempfile.TemporaryDirectory() as _tmp:
        for _kind, _n in (("GQA", None), ("MHA", 9), ("MQA", 1)):
            print(f"serving the {_kind} checkpoint (a rewrite loads in a few seconds) ...",
                  flush=True)
            _t = time.perf_counter()
            _engine = llm if _n is None else LLM(
                str(rewrite_kv_heads(src_path, Path(_tmp) / _kind, _n)),
                max_model_len=512, kv_cache_memory=KV_BUDGET)
            _outs = _engine.generate(_prompts, _params, use_tqdm=False)
            _runner = _engine.engine.runner
            live[_kind] = {
                "kv_heads": _runner.kv_cache.shape[4], "blocks": _runner.num_blocks,
                "tokens": [o.outputs[0].token_ids for o in _outs],
                "text": _outs[0].outputs[0].text, "seconds": time.perf_counter() - _t}
            if _n is not None:
                del _engine
    for _kind, _r in live.items():
        print(f"{_kind}: {_r['kv_heads']} KV heads, {_r['blocks']} blocks in the pool, "
              f"same tokens as GQA: {_r['tokens'] == live['GQA']['tokens']}, "
              f"text: {_r['text']!r}")
    mha_same_tokens = live["MHA"]["tokens"] == live["GQA"]["tokens"]
    mqa_same_tokens = live["MQA"]["tokens"] == live["GQA"]["tokens"]
    mo.md("| checkpoint | KV heads | blocks in the same pool | greedy tokens vs original |\n"
          "|---|---|---|---|\n" + "\n".join(
              f"| {k} | {r['kv_heads']} | {r['blocks']:,} | "
              f"{'identical' if r['tokens'] == live['GQA']['tokens'] else 'different'} |"
              for k, r in live.items()))
    return live, mha_same_tokens, mqa_same_tokens


@app.cell
def _(live, mo):
    mo.md(f"""
    The MHA copy computes exactly what the original computes, yet from the same memory it gets
    **{live['MHA']['blocks']:,}** blocks where the original gets **{live['GQA']['blocks']:,}**:
    a third of the sequences, for nothing. The averaged MQA model fits
    **{live['MQA']['blocks']:,}** blocks but
    {'kept' if live['MQA']['tokens'] == live['GQA']['tokens'] else 'changed'} the original's
    answers: the trained model relies on three distinct K/V heads, and averaging them is a
    different model. How many KV heads a model has is decided when it is trained; the engine
    only has to store what the model needs, and it does.
    """)
    return


@app.cell
def _(kv_pick, live, mo):
    # The dropdown from above, now on served checkpoints: what the engine answered with it.
    _kind = {"9": "MHA", "3": "GQA", "1": "MQA"}[kv_pick.value.split()[0]]
    _r, _ref = live[_kind], live["GQA"]
    _same = _r["tokens"] == _ref["tokens"]
    mo.callout(mo.md(
        f"**{kv_pick.value}**, served by the engine from the rewritten checkpoint "
        f"({_r['blocks']:,} blocks in the pool): {_r['text']!r}. "
        + ("Same greedy tokens as the original." if _same else
           f"The original answers {_ref['text']!r}: the tokens changed. More sequences fit, "
           "but it is no longer the model you trained.")),
        kind="success" if _same else "danger")
    return


@app.cell
def _(mo):
    mo.md(r"""
    ## Decode reads the cache: bytes moved per step

    A decode step reads every cached K/V byte of every running sequence once, per layer.
    Fewer KV heads means fewer bytes, and decode attention is bound by exactly those bytes.
    Timed below: one layer's decode attention (batch and context below), with 9 query heads and
    9, 3 or 1 KV heads, through the engine's attention code for this device (on a GPU the
    Triton decode kernel; on a CPU the torch reference, which gathers the K/V it reads).
    The bytes are *counted*, not computed: a `TorchDispatchMode` watches every tensor op of
    the engine's torch attention path (`paged_attention`) and adds up the K/V bytes it gathers
    from the pool and the K/V bytes the attention op itself is handed. Had the path expanded
    K/V to the 9 query heads before attending, the second count would show it.
    """)
    return


@app.cell
def _(
    AttentionMetadata,
    cfg,
    paged_attention,
    paged_decode_attention,
    plt,
    random_paged_batch,
    time,
    torch,
):
    from torch.utils._python_dispatch import TorchDispatchMode

    class KVBytesRead(TorchDispatchMode):
        """Counts, over every tensor op torch runs, the bytes gathered from the K/V pools
        (an index into their storage: its result is what was read) and the K and V bytes
        handed to a scaled_dot_product attention op."""

        def __init__(self, *pools):
            super().__init__()
            self.pools = {p.untyped_storage().data_ptr() for p in pools}
            self.gathered = self.attended = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if (func is torch.ops.aten.index.Tensor
                    and args[0].untyped_storage().data_ptr() in self.pools):
                self.gathered += out.numel() * out.element_size()
            if "scaled_dot_product" in func.__name__:
                self.attended += sum(t.numel() * t.element_size() for t in args[1:3])
            return out

    _gpu = torch.cuda.is_available()
    _dev, _dt = ("cuda", torch.bfloat16) if _gpu else ("cpu", torch.float32)
    DEC_B, DEC_L = (64, 2048) if _gpu else (8, 1024)
    _H, _D = cfg.num_attention_heads, cfg.head_dim
    decode_rows = []
    for _n in (9, 3, 1):
        _b = random_paged_batch([1] * DEC_B, [DEC_L - 1] * DEC_B, _H, _n, _D, dtype=_dt,
                                device=_dev, spare_blocks=0)
        if _gpu:
            _fn = lambda: paged_decode_attention(_b.q, _b.k_cache, _b.v_cache,  # noqa: E731
                                                 _b.seq_lens, _b.block_tables, DEC_L, _D ** -0.5)
        else:
            _md = AttentionMetadata(_b.seq_lens.new_empty(0), _b.query_start_loc, _b.seq_lens,
                                    _b.block_tables, 1, DEC_L)
            _fn = lambda: paged_attention(_b.q, _b.k_cache, _b.v_cache, _md,  # noqa: E731
                                          _D ** -0.5)
        _fn()
        _times = []
        for _ in range(5):
            if _gpu:
                torch.cuda.synchronize()
            _t = time.perf_counter()
            _fn()
            if _gpu:
                torch.cuda.synchronize()
            _times.append(time.perf_counter() - _t)
        # Counted: what the engine's torch attention path gathers from the pool and hands the
        # attention op, for the same batch (on a GPU too, beside the kernel's timing).
        _md = AttentionMetadata(_b.seq_lens.new_empty(0), _b.query_start_loc, _b.seq_lens,
                                _b.block_tables, 1, DEC_L)
        with KVBytesRead(_b.k_cache, _b.v_cache) as _count:
            paged_attention(_b.q, _b.k_cache, _b.v_cache, _md, _D ** -0.5)
        _bytes = _count.gathered
        decode_rows.append((_n, _bytes, 1e3 * min(_times), _count.attended))
        print(f"{_n} KV heads: {_bytes / 2**20:6.1f} MiB of K/V gathered per layer-step "
              f"({_count.attended / 2**20:.1f} MiB handed to the attention op), "
              f"{1e3 * min(_times):7.2f} ms, {_bytes / min(_times) / 1e9:6.1f} GB/s")
    _fig, _ax = plt.subplots(figsize=(6, 3))
    _ax.bar([f"{n} KV heads" for n, *_ in decode_rows],
            [ms for _, _, ms, _ in decode_rows],
            color=["C3", "C0", "C2"])
    _ax.set_ylabel("ms per layer-step")
    _ax.set_title(f"decode attention, batch {DEC_B} x {DEC_L} tokens, {_H} query heads")
    _fig.tight_layout()
    _fig
    decode_elem_bytes = _b.k_cache.element_size()
    return DEC_B, DEC_L, decode_elem_bytes, decode_rows


@app.cell
def _(decode_rows, mo):
    _ratio = decode_rows[0][2] / decode_rows[-1][2]  # (kv heads, bytes, ms, attended)
    mo.md(f"""
    Nine KV heads read 9x the bytes of one, and took **{_ratio:.1f}x** the time here. These
    are measurements, not a model: where the times do not fall in proportion to the bytes,
    something other than reading K/V (launch or Python overhead, the softmax itself, the
    reference's gather copy on a CPU) dominates at this size.
    """)
    return


@app.cell
def _(mo):
    mo.md(r"""
    ## Exercise: which KV head does a query head read?

    Write `kv_head_of` with the rule the engine uses. The checker does not compare your
    function with a formula: it *asks the engine*. For each shape it builds a one-token
    cache in which KV head $j$'s value vector is filled with $j$, runs
    `minivllm.attention.torch_attention.paged_attention`, and reads off which value each query head got.
    """)
    return


@app.function
def kv_head_of(q_head: int, num_heads: int, num_kv_heads: int) -> int:
    """The KV head that query head `q_head` attends with (edit me)."""
    return q_head % num_kv_heads          # a first guess: is it the engine's rule?


@app.cell
def _(AttentionMetadata, paged_attention, torch):
    def engine_kv_head_map(num_heads, num_kv_heads, head_dim=16):
        """Ask the engine's attention which KV head each query head reads."""
        v = torch.arange(num_kv_heads, dtype=torch.float32)[None, None, :, None]
        v_cache = v.expand(1, 16, num_kv_heads, head_dim).contiguous()  # (blocks, bs, Hkv, D)
        k_cache = torch.zeros_like(v_cache)
        q = torch.zeros(1, num_heads, head_dim)
        z = torch.zeros(1, dtype=torch.int64)
        md = AttentionMetadata(z, torch.tensor([0, 1]), torch.tensor([1]), z[None], 1, 1)
        out = paged_attention(q, k_cache, v_cache, md, 1.0)              # (1, H, D)
        return [int(x) for x in out[0, :, 0].round()]

    def check_kv_head_of(fn):
        for _h, _kv in ((9, 3), (8, 2), (32, 8), (4, 1), (6, 6)):
            truth = engine_kv_head_map(_h, _kv)
            mine = [fn(q, _h, _kv) for q in range(_h)]
            if mine != truth:
                hint = (" That is the interleaved (round-robin) assignment; the engine groups "
                        "consecutive heads." if mine == [q % _kv for q in range(_h)] else "")
                return False, (f"For {_h} query heads over {_kv} KV heads the engine maps "
                               f"{truth}; yours gives {mine}.{hint}")
        return True, "Correct: query head h reads KV head h // (num_heads // num_kv_heads)."
    return check_kv_head_of, engine_kv_head_map


@app.cell
def _(check_kv_head_of, mo):
    _ok, _msg = check_kv_head_of(kv_head_of)
    print(f"exercise: {'solved' if _ok else 'not yet'} - {_msg}")
    mo.callout(mo.md(_msg), kind="success" if _ok else "warn")
    return


@app.cell
def _(
    DEC_B,
    DEC_L,
    capacity,
    cfg,
    check_kv_head_of,
    decode_elem_bytes,
    decode_rows,
    kv_bytes_per_token,
    kv_dtype,
    live,
    mha_same_tokens,
    mqa_same_tokens,
    pool_bytes_per_token,
    smol_bytes,
):
    def test_attention_reads_kv_bytes_in_proportion_to_kv_heads():
        # Counted by a dispatch mode on the engine's attention path: per layer-step it gathers
        # batch x context x (K and V) x kv heads x head dim x bytes, and hands attention no more
        # (no expansion to the query heads): 9 : 3 : 1.
        for _n, _gathered, _, _attended in decode_rows:
            _expected = DEC_B * DEC_L * 2 * _n * cfg.head_dim * decode_elem_bytes
            assert _gathered == _attended == _expected, (_n, _gathered, _attended)
        assert decode_rows[0][1] == 3 * decode_rows[1][1] == 9 * decode_rows[2][1]
        assert smol_bytes["MHA"] == 3 * smol_bytes["GQA"] == 9 * smol_bytes["MQA"]

    def test_engine_pool_matches_the_formula():
        assert pool_bytes_per_token == kv_bytes_per_token(cfg, kv_dtype) == smol_bytes["GQA"]

    def test_fewer_kv_heads_fit_more_sequences():
        assert capacity["MQA"] > capacity["GQA"] > capacity["MHA"] > 0
        assert capacity["GQA"] >= 2 * capacity["MHA"]

    def test_mha_rewrite_is_exact_and_costs_three_times_the_blocks():
        assert mha_same_tokens
        assert live["MHA"]["kv_heads"] == 9 and live["MQA"]["kv_heads"] == 1
        assert abs(live["GQA"]["blocks"] / live["MHA"]["blocks"] - 3) < 0.05
        assert abs(live["MQA"]["blocks"] / live["GQA"]["blocks"] - 3) < 0.05

    def test_averaged_mqa_checkpoint_changes_the_tokens():
        # The widget's break: the squeezed checkpoint fits 3x the blocks and answers
        # differently (greedy, 2 prompts x 6 tokens).
        assert not mqa_same_tokens

    def test_checker_asks_the_engine():
        assert check_kv_head_of(lambda q, h, kv: q // (h // kv))[0]
        assert not check_kv_head_of(lambda q, h, kv: q % kv)[0]
    return


@app.cell
def _(mo):
    # Shown at the end, under "Where the code lives".
    v1_box = mo.callout(mo.md(r"""
    **In vLLM V1** (as of vLLM 0.33). In `vllm/model_executor/models/llama.py`,
    `LlamaDecoderLayer` reads `num_key_value_heads` from the model's config and passes it to
    `LlamaAttention`, which projects Q, K and V with one `QKVParallelLinear` and builds an
    `Attention` layer with `num_heads` and `num_kv_heads`. That layer now lives in
    `vllm/model_executor/layers/attention/attention.py` (the old `vllm/attention/` package is
    gone; the attention backends that run the kernels are under `vllm/v1/attention/`). Its
    `get_kv_cache_spec` returns a `FullAttentionSpec` (`vllm/v1/kv_cache_interface.py`) whose page
    size counts KV heads only: the pool is sized by them, as here. Under tensor parallelism each
    GPU holds `num_kv_heads / tp` heads, and when tp exceeds the KV heads each head is replicated
    so every GPU has one. minivllm splits and replicates the same way (`minivllm/distributed/`,
    lesson 15) but has one kind of layer, so no spec: `kv_bytes_per_token` sizes its pool.
    """), kind="info")
    return (v1_box,)


@app.cell
def _(DEC_B, DEC_L, capacity, decode_rows, live, mo, smol_bytes, v1_box):
    findings = {"smol_bytes_per_token": smol_bytes, "capacity_1k_sequences": capacity,
                "mha_blocks": live["MHA"]["blocks"], "gqa_blocks": live["GQA"]["blocks"],
                "mqa_blocks": live["MQA"]["blocks"],
                "decode_ms": {n: ms for n, _, ms, _ in decode_rows},
                "decode_kv_bytes_gathered": {n: b for n, b, *_ in decode_rows}}
    print("findings:", findings)
    mo.vstack([mo.md(f"""
    ## What we found

    * SmolLM2's KV per token: {smol_bytes['MHA']:,} B as MHA, {smol_bytes['GQA']:,} B as
      the GQA model it is, {smol_bytes['MQA']:,} B as MQA. Sequences of 1,024 tokens in the
      same pool: {capacity['MHA']} / {capacity['GQA']} / {capacity['MQA']}.
    * The exact MHA rewrite of the model produced the same tokens from a pool with a third of
      the blocks; the averaged MQA rewrite got three times the blocks and
      {'the same' if live['MQA']['tokens'] == live['GQA']['tokens'] else 'different'} tokens.
    * Decode attention reads every cached K/V byte each step. Counted on the engine's
      attention path (batch {DEC_B} x {DEC_L} tokens, one layer):
      {', '.join(f'{b / 2**20:.1f} MiB ({n} KV)' for n, b, *_ in decode_rows)} gathered and
      handed to attention, in proportion to the KV heads; on this device the step took
      {', '.join(f'{ms:.1f} ms ({n} KV)' for n, _, ms, _ in decode_rows)}.

    Fewer KV heads let one pool hold longer prompts and more of them, yet a long prompt still
    enters in one prefill step, and every request decoding in that step waits through it
    (lesson 08 counted its tokens). Next, lesson 10: what does cutting that prefill into chunks
    under a per-step token budget buy, and what does the budget cost the newcomer?

    ## Where the code lives

    * `minivllm/core/kv_cache.py`: `kv_bytes_per_token`; `minivllm/worker/model_runner.py`:
      `allocate_kv_cache` (the pool's KV-head axis); `minivllm/core/block_manager.py`:
      `BlockManager`, asked above for capacity.
    * `minivllm/models/llama.py`: `LlamaAttention` projects to `num_key_value_heads` heads.
    * `minivllm/attention/torch_attention.py`: `paged_attention` (torch, `enable_gqa=True`).
    * `kernels/paged_attention.py` and `kernels/flash_attention.py`: `NUM_QUERIES_PER_KV`, the
      group size; in the decode kernel a group's query heads are the rows of one tile.
    """), v1_box])
    return (findings,)


if __name__ == "__main__":
    app.run()
