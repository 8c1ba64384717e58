import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell
def _():
    import time

    import marimo as mo
    import matplotlib.pyplot as plt
    import numpy as np
    import torch

    from minivllm import LLM, SamplingParams
    from minivllm.benchmarks.quant import (decode_tokens_per_s, eval_text, first_divergence,
                                      greedy_tokens, perplexity)
    from minivllm.quantization.weight_only import model_weight_bytes
    from minivllm.workloads import Request, serve
    return (LLM, Request, SamplingParams, decode_tokens_per_s, eval_text, first_divergence,
            greedy_tokens, mo, model_weight_bytes, np, perplexity, plt, serve, time, torch)


@app.cell
def _(mo):
    mo.md(r"""
    # 13 · Quantization: fewer bits per weight, fewer bytes per cached token

    After this lesson you can say what int8, int4 (in groups), fp8 and GGUF's Q4_1 store,
    byte by byte; why storing weights in 8 or 4 bits speeds up decode while the arithmetic
    stays in floating point; what it costs in perplexity on the real model; and how a
    quantized KV cache turns the same memory into more concurrent sequences. Every number
    below is measured live on the packaged SmolLM2-135M through `LLM(quantization=...)` and
    `LLM(kv_cache_dtype=...)`.

    Lesson 12 kept one copy of the base weights for many adapters, yet every decode step still
    reads all of those weights to produce one token per sequence. This lesson stores each
    weight, and each cached token, in fewer bytes.
    """)
    return


@app.cell
def _(LLM, mo, model_weight_bytes, torch):
    # One model, loaded once in fp32; every format below is a reconfigure over the same float
    # weights (minivllm keeps them aside so it can switch back). 64 MiB of KV pool, always.
    KV_MEMORY = 64 << 20
    llm = LLM(max_model_len=512, max_num_seqs=32, kv_cache_memory=KV_MEMORY,
              enable_prefix_caching=False)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    fp32_weight_bytes = model_weight_bytes(llm.engine.runner.model)
    mo.md(f"**running on:** {device} · **model:** SmolLM2-135M-Instruct (fp32) · "
          f"**weights:** {fp32_weight_bytes / 1e6:.0f} MB · threads: "
          f"{torch.get_num_threads()}  \n`{llm.engine!r}`")
    return KV_MEMORY, device, fp32_weight_bytes, llm


@app.cell
def _(decode_tokens_per_s, fp32_weight_bytes, llm, mo):
    # The problem: a decode step at batch 1 reads every weight once for one token.
    base_tok_s = decode_tokens_per_s(llm, 1, max_tokens=16)
    mo.md(f"""
    ## The problem, measured: decode reads every weight for every token

    At batch 1 each decode step multiplies one row of activations by every weight matrix:
    2 FLOPs per weight, and each weight (4 bytes in fp32) is read from memory once. Measured
    here: **{base_tok_s:.1f} tokens/s**, so the step streams about
    **{fp32_weight_bytes * base_tok_s / 1e9:.1f} GB/s** of weights, and the arithmetic units
    wait for memory most of the time. Fewer bytes per weight is the direct fix; the
    arithmetic can stay in floating point ("weight-only" quantization, W8A16 / W4A16).
    """)
    return (base_tok_s,)


@app.cell
def _(np, plt, torch):
    # The formats drawn: every value each format can represent between 0 and 4.
    def _fp8_values(dtype):
        v = torch.arange(256, dtype=torch.uint8).view(dtype).float()
        return v[torch.isfinite(v) & (v >= 0) & (v <= 4)].numpy()
    _rows = {
        "fp8 e5m2 (2 mantissa bits)": _fp8_values(torch.float8_e5m2),
        "fp8 e4m3 (3 mantissa bits)": _fp8_values(torch.float8_e4m3fn),
        "int8, scale = 4/127": np.arange(0, 128) * 4 / 127,
        "int4 group: d = 4/15, min 0": np.arange(16) * 4 / 15,
    }
    _bf16 = torch.arange(0, 2**16, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    bf16_values_0_4 = int(((_bf16 >= 0) & (_bf16 <= 4)).sum())
    fig_formats, _ax = plt.subplots(figsize=(9, 2.6))
    _ax.eventplot(list(_rows.values()), lineoffsets=range(len(_rows)), linelengths=0.7)
    _ax.set_yticks(range(len(_rows)), list(_rows))
    _ax.set_xlabel(f"representable values in [0, 4] (bf16 has {bf16_values_0_4:,} there)")
    _ax.set_title("floats crowd near zero; integers are evenly spaced under one scale",
                  fontsize=10)
    fig_formats.tight_layout()
    return bf16_values_0_4, fig_formats


@app.cell
def _(fig_formats, mo):
    mo.vstack([mo.md(r"""
    ## The formats

    * **bf16**: 8 exponent bits, 7 mantissa bits: fp32's range at half the bytes.
    * **fp8 e4m3 / e5m2**: one byte; a float, so its steps grow with the value (e4m3: 3
      mantissa bits, largest 448; e5m2: 2 bits, more range). Values are divided by a scale
      first so the largest lands near the top of the range.
    * **int8 per output channel**: `q = round(w / s)`, one scale `s = max|row| / 127` per
      row of the weight matrix; 256 evenly spaced levels.
    * **int4 in groups of G**: 16 levels are too few for a whole row, so every G weights
      get their own scale `d` and minimum `m`: `w ~ q * d + m`, two `q` per byte.
    """), fig_formats])
    return


@app.cell
def _(np, torch):
    # GGUF Q4_1, read from the file the default model ships as.
    import gguf

    from minivllm.models.loader import default_gguf_path
    reader = gguf.GGUFReader(default_gguf_path())
    tensor_types = {}
    for _t in reader.tensors:
        tensor_types[_t.tensor_type.name] = tensor_types.get(_t.tensor_type.name, 0) + 1
    _t = next(t for t in reader.tensors if t.name == "blk.0.ffn_down.weight")
    _block = np.asarray(_t.data[0, :20])                      # the first block of row 0
    q4_1_d, q4_1_m = (float(x) for x in _block[:4].view(np.float16))
    _qs = _block[4:]
    q4_1_q = np.concatenate([_qs & 0xF, _qs >> 4]).astype(int)  # llama.cpp: j, then j + 16
    ffn_down = torch.from_numpy(gguf.dequantize(_t.data, _t.tensor_type)).float()  # (576, 1536)
    q4_1_matches_file = bool(np.allclose(q4_1_q * q4_1_d + q4_1_m, ffn_down[0, :32].numpy(),
                                         atol=1e-6))
    return ffn_down, q4_1_d, q4_1_m, q4_1_matches_file, q4_1_q, tensor_types


@app.cell
def _(mo, q4_1_d, q4_1_m, q4_1_matches_file, q4_1_q, tensor_types):
    mo.md(f"""
    ## How the default model ships: GGUF Q4_1

    The GGUF file holds {tensor_types} tensors. A Q4_1 block is 20 bytes for 32 weights:
    an fp16 scale `d`, an fp16 minimum `m`, then 16 bytes of 4-bit `q` (byte j holds weight
    j in its low nibble and weight j + 16 in its high one): 5 bits per weight. The first
    block of `blk.0.ffn_down.weight`, read from the file:

    `d = {q4_1_d:.6f}`, `m = {q4_1_m:.6f}`, `q = {q4_1_q.tolist()}`

    `q * d + m` equals the weights gguf's own dequantizer returns: **{q4_1_matches_file}**.
    minivllm's int4 with G = 32 is this format (fp32 d and m on the GPU path; torch's CPU
    kernel stores them as bf16 `(scale, zero)` pairs).
    """)
    return


@app.cell
def _(ffn_down, plt, torch):
    # Error vs group size on the real weights: blk.0's down projection, K = 1536.
    from minivllm.quantization.weight_only import (dequantize_int4, dequantize_int8, quantize_int4,
                                quantize_int8)

    def _rel(w_hat):
        return float((w_hat - ffn_down).norm() / ffn_down.norm())
    weight_error = {"bf16": _rel(ffn_down.bfloat16().float()),
                    "int8 / channel": _rel(dequantize_int8(*quantize_int8(ffn_down)))}
    _s = ffn_down.abs().amax(1, keepdim=True) / 448
    weight_error["fp8 e4m3 / channel"] = _rel((ffn_down / _s).to(torch.float8_e4m3fn).float()
                                              * _s)
    for _g in (32, 64, 128):
        weight_error[f"int4 g{_g}"] = _rel(dequantize_int4(*quantize_int4(ffn_down, _g), _g))
    fig_error, _ax = plt.subplots(figsize=(8, 2.8))
    _ax.barh(list(weight_error), [max(v, 1e-9) for v in weight_error.values()],
             color="tab:purple")
    _ax.set_xscale("log")
    _ax.set_xlabel("relative error ||W_hat - W|| / ||W|| (log; an exact 0 drawn at 1e-9)")
    _ax.set_title("blk.0.ffn_down of SmolLM2 (already Q4_1 in the file)", fontsize=10)
    fig_error.tight_layout()
    return fig_error, weight_error


@app.cell
def _(fig_error, mo, weight_error):
    mo.vstack([mo.md(f"""
    ## Error vs group size, on the real weights

    The surprise: **int4 g32 is almost exact** (error {weight_error['int4 g32']:.1e}). The
    weights *are* Q4_1 blocks of 32 already: each block's minimum and maximum sit on its own
    grid, so re-quantizing with G = 32 finds the same grid. G = 64 merges two blocks with
    different grids into one, and the error jumps to {weight_error['int4 g64']:.3f}, worse
    than int8's {weight_error['int8 / channel']:.4f}. On a model trained in bf16 the
    ordering would be the textbook one (smaller groups, smaller error) without the cliff.
    """), fig_error])
    return


@app.cell
def _(
    KV_MEMORY,
    decode_tokens_per_s,
    eval_text,
    first_divergence,
    greedy_tokens,
    llm,
    mo,
    model_weight_bytes,
    perplexity,
    time,
):
    # The table: each format over the same weights. Perplexity on the repo's fixed text set
    # (public-domain prose and code), fewer tokens in a headless run.
    _headless = mo.app_meta().mode == "script" or "headless" in mo.cli_args()
    PPL_TOKENS = 256 if _headless else 1024
    GEN_TOKENS = 12 if _headless else 24
    AGREE_PROMPTS = ["The capital of France is", "def fibonacci(n):\n    ",
                     "Once upon a time, in a small village by the sea,", "1, 1, 2, 3, 5, 8,"]
    FORMATS = {"fp32": {}, "int8": {"quantization": "int8"},
               "int4-g32": {"quantization": "int4-g32"}, "int4-g64": {"quantization": "int4-g64"},
               "int4-g128": {"quantization": "int4-g128"}, "kv int8": {"kv_cache_dtype": "int8"},
               "kv fp8": {"kv_cache_dtype": "fp8"}}
    ppl_ids = llm.tokenizer.encode(eval_text())[:PPL_TOKENS]

    def use(name):
        """The engine in format `name` (a fresh pool of KV_MEMORY bytes)."""
        return llm.reconfigure(**{"quantization": None, "kv_cache_dtype": "auto",
                                  **FORMATS[name]})

    table, refusals, reference = {}, {}, None
    _t0 = time.perf_counter()
    for _name in FORMATS:
        try:
            use(_name)
        except ValueError as _e:          # a format this model cannot take
            refusals[_name] = str(_e)
            continue
        print(f"format {_name}: greedy tokens, perplexity over {PPL_TOKENS} tokens, "
              "decode speed ...", flush=True)
        _tokens = greedy_tokens(llm, AGREE_PROMPTS, GEN_TOKENS)
        reference = reference or _tokens
        table[_name] = {
            "ppl": perplexity(llm.engine, ppl_ids),
            "agree": [first_divergence(_a, _b) for _a, _b in zip(_tokens, reference)],
            "weight_MB": model_weight_bytes(llm.engine.runner.model) / 1e6,
            "kv_tokens": llm.engine.stats().num_blocks_total * llm.engine.vllm_config.cache_config.block_size,
            "b1_tok_s": decode_tokens_per_s(llm, 1, max_tokens=GEN_TOKENS),
            "tokens": _tokens}
    table_seconds = time.perf_counter() - _t0
    use("fp32")
    assert llm.engine.vllm_config.cache_config.kv_cache_memory == KV_MEMORY
    return AGREE_PROMPTS, FORMATS, GEN_TOKENS, PPL_TOKENS, refusals, table, table_seconds, use


@app.cell
def _(GEN_TOKENS, PPL_TOKENS, mo, refusals, table, table_seconds):
    _base = table["fp32"]
    _rows = "\n    ".join(
        f"| {n} | {r['ppl']:.3f} | {r['ppl'] / _base['ppl'] - 1:+.2%} | {r['agree']} | "
        f"{r['weight_MB']:.0f} | {r['kv_tokens']:,} | {r['b1_tok_s']:.1f} "
        f"({r['b1_tok_s'] / _base['b1_tok_s']:.2f}x) |" for n, r in table.items())
    _refused = "; ".join(f"**{k}**: {v}" for k, v in refusals.items()) or "none"
    mo.md(f"""
    ## Perplexity, memory and speed

    | format | perplexity ({PPL_TOKENS} tokens) | vs fp32 | greedy agreement (tokens of {GEN_TOKENS}) | weights MB | KV tokens in 64 MiB | batch-1 decode tok/s |
    |---|---|---|---|---|---|---|
    {_rows}

    Refused: {_refused}.
    ({table_seconds:.0f} s for the table.)

    Reading it: int8 weights cost almost nothing in perplexity; int4 g32 a little: it
    re-finds the file's grid, but torch's CPU kernel keeps each group's scale and zero
    point in bf16 and rounds the activations to bf16, which moves the grid slightly; int4
    g64 is the cliff drawn above. The weights column counts the float
    embedding table (113 MB in fp32), which no format touches: a lookup reads one row
    per token; the quantized formats hold the LM head apart from it, in int8 (28 MB, as
    llama.cpp's Q8_0 head), so a token reads the head's 28 MB, not the table's 113. Speed on this CPU comes from torch's own weight-only kernels
    (`_weight_int8pack_mm`, `_weight_int4pack_mm_for_cpu`), which take bf16 activations;
    seconds move with the machine's load, so the tests assert on the counts, not the
    speeds. `minivllm bench quant` prints the same table for every format at batch 1 and 8,
    and bf16. Greedy agreement counts tokens before the first different one: a 135M model
    has near-ties that any rounding flips, bf16 weights included (see docs/benchmarks.md).
    """)
    return


@app.cell
def _(KV_MEMORY, Request, SamplingParams, llm, serve):
    # KV capacity in concurrent sequences: a 16 MiB pool, 32 requests of ~40 tokens each.
    POOL = 16 << 20
    _words = ("Quantization stores numbers in fewer bits so that more of them fit in the same "
               "memory, which is why a quantized cache holds more sequences at once. ").split()
    _params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    _requests = [Request(llm.tokenizer.encode(" ".join(_words[i % 8:i % 8 + 20])), _params)
                 for i in range(32)]
    capacity = {}
    for _kv in ("auto", "int8"):
        llm.reconfigure(kv_cache_dtype=_kv, kv_cache_memory=POOL)
        _res = serve(llm, _requests)
        capacity[_kv] = {
            "pool_tokens": _res.steps[0].stats.num_blocks_total * llm.engine.vllm_config.cache_config.block_size,
            "peak_running": max(s.stats.num_running for s in _res.steps),
            "steps": len(_res.steps), "preemptions": _res.steps[-1].stats.num_preemptions,
            "tokens": [o.outputs[0].token_ids for o in _res.outputs]}
    llm.reconfigure(kv_cache_dtype="auto", kv_cache_memory=KV_MEMORY)
    return POOL, capacity


@app.cell
def _(POOL, capacity, mo):
    _a, _q = capacity["auto"], capacity["int8"]
    mo.md(f"""
    ## A quantized KV cache: more sequences in the same memory

    With `kv_cache_dtype="int8"` (or `"fp8"`) minivllm's pool stores each token's K and V
    row per head as 64 one-byte values plus its own fp32 scale: 68 bytes instead of 256 in
    fp32 (or 128 in bf16). Rows are quantized when written and dequantized inside attention
    (the torch backend after its gather, the Triton kernels tile by tile). vLLM 0.33 has the
    same layout under the name `kv_cache_dtype="int8_per_token_head"` (and `fp8_` / `int4_`
    variants), an fp32 scale after each head's values, set when the row is written. Its
    older fp8 cache (`"fp8"`, meaning e4m3, or `"fp8_e4m3"` / `"fp8_e5m2"`) has per-tensor
    scales instead: one `k_scale` and one `v_scale` per attention layer, read from the
    checkpoint or left at 1.0, so a K/V element costs exactly one byte. A scale per row costs
    4 bytes in 68 here and needs no calibration. The same {POOL >> 20} MiB:

    | KV cache | tokens in the pool | peak running sequences | engine steps | preemptions |
    |---|---|---|---|---|
    | fp32 | {_a['pool_tokens']:,} | {_a['peak_running']} | {_a['steps']} | {_a['preemptions']} |
    | int8 | {_q['pool_tokens']:,} | {_q['peak_running']} | {_q['steps']} | {_q['preemptions']} |

    {_q['pool_tokens'] / _a['pool_tokens']:.2f}x the tokens (256 / 68 = 3.76; from bf16 it
    would be 128 / 68 = 1.88): 32 requests that had to take turns now run together, in
    fewer steps.
    """)
    return


@app.cell
def _(FORMATS, mo):
    mo.md(r"""
    ## Try it: pick a format

    The engine is reconfigured to the format you pick and continues a prompt greedily.
    Watch where its tokens leave fp32's, and what happens with a group size the model's
    hidden size (576 = 4.5 x 128) cannot take.
    """)
    pick = mo.ui.dropdown(options=list(FORMATS), value="int4-g64", label="format")
    pick
    return (pick,)


@app.cell
def _(SamplingParams, llm, mo, pick, table, use):
    _prompt = "Once upon a time, in a small village by the sea,"
    _params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    try:
        use(pick.value)
        widget_text = llm.generate([_prompt], _params, use_tqdm=False)[0].outputs[0].text
        widget_error = None
    except ValueError as _e:
        widget_text, widget_error = None, str(_e)
    use("fp32")
    _fp32 = llm.generate([_prompt], _params, use_tqdm=False)[0].outputs[0].text
    _row = table.get(pick.value)
    _ours = (_prompt + " **" + widget_text + "**" if widget_text is not None
             else "refused: `" + widget_error + "`")
    _ppl = (f"perplexity {_row['ppl']:.3f} vs fp32 {table['fp32']['ppl']:.3f}" if _row
            else "")
    mo.md(f"""
    **fp32:** {_prompt} **{_fp32}**

    **{pick.value}:** {_ours}

    {_ppl}
    """)
    return widget_error, widget_text


@app.cell
def _(mo):
    mo.md(r"""
    ## Exercise: how many tokens does an int8 KV pool hold?

    SmolLM2-135M has 30 layers, 3 KV heads and head_dim 64; blocks hold 16 tokens, and the
    pool gets whole blocks only. With `kv_cache_dtype="int8"` and
    `kv_cache_memory=64 MiB` (64 x 2^20 bytes), how many **tokens** does the pool hold?
    """)
    # Headless, the right answer is filled in so that the checker's verdict is tested below.
    _headless = mo.app_meta().mode == "script" or "headless" in mo.cli_args()
    kv_answer = mo.ui.number(start=0, stop=100000, value=5472 if _headless else 0,
                             label="tokens")
    kv_answer
    return (kv_answer,)


@app.cell
def _(KV_MEMORY, llm):
    # The truth, from the engine itself (the header's pool is 64 MiB, int8 in the table).
    llm.reconfigure(kv_cache_dtype="int8")
    exercise_truth = llm.engine.stats().num_blocks_total * llm.engine.vllm_config.cache_config.block_size
    llm.reconfigure(kv_cache_dtype="auto")

    def check_kv_tokens(value):
        per_token_no_scale = 2 * 30 * 3 * 64
        if not value:
            return "Enter a number of tokens."
        if value == exercise_truth:
            return (f"Correct: {exercise_truth:,} tokens. A token costs 2 x 30 x 3 x (64 + 4) "
                    f"= 12,240 bytes, a block 16 x that, and the pool takes whole blocks.")
        if value in (KV_MEMORY // per_token_no_scale // 16 * 16,
                     KV_MEMORY // per_token_no_scale):
            return ("Close, but each (token, head) row also stores its fp32 scale: 64 + 4 "
                    "bytes, not 64.")
        if value == KV_MEMORY // 12240:
            return "Nearly: the pool holds whole blocks of 16 tokens; round down to one."
        if value == KV_MEMORY // (2 * 30 * 3 * 64 * 4) // 16 * 16:
            return "That is the fp32 pool: int8 stores one byte per element, plus the scale."
        return "Bytes per token: 2 (K and V) x layers x KV heads x (head_dim + 4 bytes of scale)."
    return check_kv_tokens, exercise_truth


@app.cell
def _(check_kv_tokens, kv_answer, mo):
    _msg = check_kv_tokens(kv_answer.value)
    mo.callout(mo.md(f"Your answer: **{kv_answer.value:,}** tokens. {_msg}"),
               kind="success" if _msg.startswith("Correct") else "neutral")
    return


@app.cell
def _(
    capacity,
    check_kv_tokens,
    exercise_truth,
    fp32_weight_bytes,
    kv_answer,
    q4_1_matches_file,
    refusals,
    table,
    weight_error,
    widget_error,
):
    def test_int8_weights_within_one_percent_of_fp32_perplexity():
        # Two-sided: the int8 weights changed the perplexity (an int8 path that kept the float
        # weights would score fp32's exactly), and by less than 1%.
        _r = table["int8"]["ppl"] / table["fp32"]["ppl"]
        assert 1e-6 < abs(_r - 1) < 0.01, _r

    def test_kv_caches_cost_little_perplexity():
        # Measured on the first 256 tokens: int8 +0.6%, fp8 +2.7% (whole text: +0.5%, +0.6%).
        # Two-sided: a KV quantizer that did nothing would score fp32's perplexity exactly
        # (the same kernels on the same numbers), so each must move it measurably, and not far.
        _int8 = table["kv int8"]["ppl"] / table["fp32"]["ppl"]
        _fp8 = table["kv fp8"]["ppl"] / table["fp32"]["ppl"]
        assert 5e-4 < abs(_int8 - 1) < 0.02, _int8
        assert 1e-3 < abs(_fp8 - 1) < 0.05, _fp8

    def test_weights_shrink_with_bits():
        _mb = {n: r["weight_MB"] for n, r in table.items()}
        assert _mb["int4-g32"] < _mb["int8"] < 0.5 * fp32_weight_bytes / 1e6

    def test_q4_1_block_read_from_the_file_and_g32_refinds_its_grid():
        assert q4_1_matches_file
        assert weight_error["int4 g32"] < 1e-4 < 0.01 < weight_error["int4 g64"]

    def test_g32_near_fp32_only_on_the_files_grid():
        # g32 re-finds the Q4_1 grid of the packaged weights; g64 straddles two of its blocks.
        assert abs(table["int4-g32"]["ppl"] / table["fp32"]["ppl"] - 1) < 0.02
        assert table["int4-g64"]["ppl"] > 1.3 * table["fp32"]["ppl"]

    def test_g128_refused_for_a_576_wide_model():
        assert "576" in refusals["int4-g128"] and "int4-g128" not in table
        # Refused up front by quantize_model, before any layer changed, with the way out
        # (the kernel's own shape check would refuse too, later and without it).
        assert "use a group size" in refusals["int4-g128"]
        assert widget_error is None or "group size" in widget_error

    def test_int8_kv_pool_holds_more_sequences():
        _a, _q = capacity["auto"], capacity["int8"]
        assert _q["pool_tokens"] > 3.7 * _a["pool_tokens"]
        assert _q["peak_running"] > _a["peak_running"] and _q["steps"] < _a["steps"]

    def test_exercise_truth_and_checker():
        # The engine's pool decides; the headless run answered 5472.
        assert exercise_truth == (64 << 20) // (12240 * 16) * 16 == 5472
        assert check_kv_tokens(kv_answer.value).startswith("Correct")
        assert "scale" in check_kv_tokens(5824)
    return


@app.cell
def _(mo):
    # Shown at the end, under "Where the code lives".
    v1_box = mo.callout(mo.md(r"""
    **In vLLM V1** (as of vLLM 0.33). Weight formats live in
    `vllm/model_executor/layers/quantization/`: a `QuantizationConfig` per format (`fp8.py`,
    `auto_gptq.py`, `auto_awq.py`, `compressed_tensors/`, ...; the GPTQ and AWQ Marlin
    variants are now served by the same `AutoGPTQConfig` / `AutoAWQConfig`, and GGUF has no
    config there any more) gives each linear layer of `vllm/model_executor/layers/linear.py`
    a quant method whose `create_weights` shapes the stored tensors and whose `apply` runs the
    matmul. The KV cache's format is `cache_dtype` in `vllm/config/cache.py`; for the fp8
    formats the per-layer `k_scale` and `v_scale` are set up by `BaseKVCacheMethod`
    (`vllm/model_executor/layers/quantization/kv_cache.py`), while the `*_per_token_head`
    formats keep their scales inside the cache, written by the Triton attention backend
    (`vllm/v1/attention/backends/triton_attn.py`). vLLM mostly loads checkpoints that were
    quantized offline (GPTQ, AWQ, llm-compressor), with fp8 and a few others also quantized
    at load time (`online/`). minivllm quantizes the float weights at load time for every
    format (`quantize_model`), so one checkpoint shows them all side by side.
    """), kind="info")
    return (v1_box,)


@app.cell
def _(base_tok_s, bf16_values_0_4, capacity, mo, table, v1_box, weight_error):
    _fp, _g32, _g64 = (table[n]["ppl"] for n in ("fp32", "int4-g32", "int4-g64"))
    _a, _q = capacity["auto"], capacity["int8"]
    findings = {
        "perplexity": {n: round(r["ppl"], 4) for n, r in table.items()},
        "weight_MB": {n: round(r["weight_MB"], 1) for n, r in table.items()},
        "kv_pool_tokens_64MiB": {n: r["kv_tokens"] for n, r in table.items()},
        "greedy_agreement": {n: r["agree"] for n, r in table.items()},
        "b1_decode_tok_s": {n: round(r["b1_tok_s"], 2) for n, r in table.items()},
        "fp32_b1_decode_tok_s": round(base_tok_s, 2),
        "weight_rel_error_ffn_down": {k: float(f"{v:.3g}") for k, v in weight_error.items()},
        "kv_fp32_peak_running": capacity["auto"]["peak_running"],
        "kv_int8_peak_running": capacity["int8"]["peak_running"],
        "kv_steps": {k: v["steps"] for k, v in capacity.items()},
        "bf16_values_in_0_4": bf16_values_0_4,
    }
    print("findings:", findings)
    mo.vstack([mo.md(f"""
    ## What we found

    * A 16 MiB KV pool held **{_q['pool_tokens']:,}** tokens in int8 against
      **{_a['pool_tokens']:,}** in fp32: **{_q['peak_running']}** requests ran at once
      against **{_a['peak_running']}**, and the same 32 requests took **{_q['steps']}** engine
      steps against **{_a['steps']}** ({_q['preemptions']} and {_a['preemptions']}
      preemptions), for {table['kv int8']['ppl'] / _fp - 1:+.1%} perplexity.
    * int8 weights (per channel) cost {table['int8']['ppl'] / _fp - 1:+.2%} perplexity and
      held the weights in {table['int8']['weight_MB']:.0f} MB against
      {table['fp32']['weight_MB']:.0f} MB.
    * **int4 in groups of 32 scored {_g32:.3f} against fp32's {_fp:.3f}
      ({_g32 / _fp - 1:+.2%}) only because of where these weights come from.** The packaged
      model is the Q4_1 GGUF, dequantized to fp32 when it loads: every group of 32 weights
      already sits on a 16-level grid, so g32 finds the same grid again (error
      {weight_error['int4 g32']:.1e} on blk.0's down projection), and its small difference
      from fp32 in either direction is the bf16 rounding of torch's CPU kernel, not a gain.
      A perplexity at or under fp32's says nothing about int4 on a model trained in bf16.
      Beside it, the group sizes that do not match the file: **g64 scored {_g64:.2f}**
      ({_g64 / _fp - 1:+.0%}, weight error {weight_error['int4 g64']:.3f}), and **g128**,
      refused for this model (its hidden size 576 is not a multiple of 128; its weight error
      on the 1536-wide down projection is {weight_error['int4 g128']:.3f}). On a bf16 model
      the order would be the textbook one, smaller groups a smaller error, with no cliff.
    * Speeds (batch-1 decode tokens/s in the table) are this CPU's, from torch's weight-only
      kernels under whatever load the machine had; the counts above are the same anywhere.

    Fewer bytes per weight shrink what a step reads, not the number of operations it issues:
    hundreds per decode step, each with a fixed cost of being asked for. Next, lesson 14: how
    much of a small-batch decode step is that cost, and how much do torch.compile and CUDA
    graphs take off it?

    ## Where the code lives

    * `minivllm/quantization/weight_only.py`: `QuantLinear` (the CPU path through torch's weight-only kernels,
      the CUDA path through Triton), `quantize_model` (swaps the decoder layers' linears
      after loading; what it leaves out and why is in its docstring).
    * `kernels/quant_matmul.py`: the formats (`quantize_int8`, `quantize_int4`) and the
      Triton matmul that dequantizes each weight tile it loads, with its torch reference.
    * `kernels/write_kv.py`: the quantized KV row (`quantize_kv` / `dequantize_kv`) and the
      write kernel that quantizes on the way in; `load_kv_tile` in
      `kernels/flash_attention.py` dequantizes on the way out, for both attention kernels.
    * `minivllm/core/kv_cache.py`: `kv_bytes_per_token`, and `allocate_kv_cache` in
      `minivllm/worker/model_runner.py`, with `kv_cache_dtype`; `minivllm/benchmarks/quant.py`:
      `minivllm bench quant`.
    """), v1_box])
    return (findings,)


if __name__ == "__main__":
    app.run()
