import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell
def _():
    import minivllm.platforms  # noqa: F401  first: without CUDA, Triton's interpreter on

    import math
    import time

    import marimo as mo
    import matplotlib.pyplot as plt
    import torch

    from kernels.flash_attention import (default_tiles, flash_attention,
                                         flash_attention_reference)
    from kernels.paged_batch import random_paged_batch
    from minivllm.config import HfConfig
    from minivllm.models.loader import load_hf_config, resolve_model_path
    return (HfConfig, default_tiles, flash_attention, flash_attention_reference,
            load_hf_config, math, mo, plt, random_paged_batch, resolve_model_path, time,
            torch)


@app.cell
def _(mo):
    mo.md(r"""
    # 03 · FlashAttention: attention in tiles, softmax on the fly

    After this lesson you can explain why plain attention reads and writes a T x T matrix
    through main memory, how the online softmax lets a kernel walk the keys one tile at a time
    while keeping only three running numbers per query row, and you can write the one line
    that makes it exact: the rescaling step. You will run minivllm's own Triton kernel
    (`kernels/flash_attention.py`), the one the engine uses on a GPU for prefills, and see it
    agree with the naive formula.

    FlashAttention and PagedAttention solve different problems: paging decides *where* K and
    V live (lesson 02); tiling decides *how* attention reads them. The kernel here does both: it
    tiles, and it finds each key tile through the sequence's block table.
    """)
    return


@app.cell
def _(HfConfig, load_hf_config, mo, resolve_model_path, torch):
    on_gpu = torch.cuda.is_available()
    device = torch.cuda.get_device_name() if on_gpu else "CPU (Triton interpreter)"
    cfg = HfConfig.from_hf_dict(load_hf_config(resolve_model_path(None)))
    H, HKV, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    dtype = torch.bfloat16 if on_gpu else torch.float32
    mo.md(f"**running on:** {device} · **attention shapes of:** SmolLM2-135M-Instruct "
          f"({H} query heads, {HKV} KV heads, head dim {D}) · **dtype:** "
          f"{str(dtype).removeprefix('torch.')}")
    return D, H, HKV, device, dtype, on_gpu


@app.cell
def _(mo):
    mo.md(r"""
    ## The problem, measured: a T x T matrix per head

    Written as three tensor operations, attention for one head is

    $$S = QK^\top \cdot \tfrac{1}{\sqrt d},\qquad P = \mathrm{softmax}(S),\qquad O = PV$$

    and each arrow between them is a round trip through main memory: $S$ and $P$ are T x T,
    one entry per (query, key) pair. Below, the naive version (labelled: it is the *before*
    picture, not engine code) runs for growing prompt lengths with SmolLM2's 9 heads, beside
    torch's fused `scaled_dot_product_attention`, which never materializes $S$.
    """)
    return


@app.cell
def _(D, H, mo, time, torch):
    def naive_attention(q, k, v, scale):
        """The 'before' version: (H, T, D) in, the full score matrix in the middle."""
        s = (q @ k.transpose(-1, -2)) * scale                         # (H, T, T)
        causal = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
        p = s.masked_fill(~causal, float("-inf")).softmax(-1)        # (H, T, T)
        return p @ v                                                  # (H, T, D)

    def best_ms(fn, repeats=3):
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        return 1e3 * min(times)

    _script = mo.app_meta().mode == "script" or "headless" in mo.cli_args()
    _dev = "cuda" if torch.cuda.is_available() else "cpu"
    lengths = [256, 512, 1024, 2048] if (_script and _dev == "cpu") else [512, 1024, 2048, 4096,
                                                                          8192]
    naive_rows = []
    for _t in lengths:
        _q, _k, _v = (torch.randn(H, _t, D, device=_dev) for _ in range(3))
        _naive = best_ms(lambda: naive_attention(_q, _k, _v, D ** -0.5))
        _fused = best_ms(lambda: torch.nn.functional.scaled_dot_product_attention(
            _q, _k, _v, is_causal=True))
        # The same arithmetic as the naive version: every score computed, none skipped.
        _full = best_ms(lambda: torch.nn.functional.scaled_dot_product_attention(_q, _k, _v))
        _s_bytes = H * _t * _t * 4
        naive_rows.append((_t, _s_bytes, _naive, _fused, _full))
        print(f"T={_t:5d}: S (and P) {_s_bytes / 2**20:8.1f} MiB each per layer (fp32, {H} "
              f"heads), naive {_naive:8.2f} ms, fused SDPA {_fused:7.2f} ms causal, "
              f"{_full:7.2f} ms without the causal skip")
    return best_ms, naive_attention, naive_rows


@app.cell
def _(mo, naive_rows):
    _t, _b, _n, _f, _full = naive_rows[-1]
    mo.md(f"""
    Doubling the prompt quadruples the matrix: at {_t:,} tokens one layer's $S$ alone is
    **{_b / 2**20:,.0f} MiB**, and $P$ as much again, each written once and read back once.
    Here the fused version took **{_f:.1f} ms** against the naive **{_n:.1f} ms**
    ({_n / _f:.1f}x), but not for the same arithmetic. On this CPU causal SDPA skips the
    key blocks that lie wholly above the diagonal (about half the scores), while the naive
    version computes every score, then builds a T x T mask and makes two more passes over
    $S$ to apply it and to softmax it. Asked for the full, unmasked product, SDPA took
    **{_full:.1f} ms**: the causal skip is worth {_full / _f:.1f}x of the gap, and the other
    {_n / _full:.1f}x is the naive version's extra passes and T x T allocations, through
    this CPU's caches and DRAM. Nothing on this page measures a GPU's HBM: the traffic
    argument below is counted, not timed, and no GPU run of this lesson is recorded yet
    (docs/benchmarks.md).
    """)
    return


@app.cell
def _(mo):
    mo.md(r"""
    ## The mechanism: softmax one tile at a time

    Softmax needs the row maximum (for numerical safety) and the row sum before it can
    normalize anything, which seems to require all of $S$'s row at once. The trick, at the
    heart of FlashAttention (Dao et al. 2022) and FlashAttention-2 (Dao 2023), is to keep, for
    each query row, three running values while keys arrive tile by tile:

    * $m$, the largest score seen so far,
    * $\ell$, the sum of $e^{s - m}$ over the scores seen so far,
    * $O$, the sum of $e^{s - m}\,v$ over the values seen so far (not yet divided by $\ell$).

    When a new tile raises the maximum from $m$ to $m'$, everything accumulated so far was
    weighted by $e^{s - m}$ instead of $e^{s - m'}$; multiplying $\ell$ and $O$ by
    $\alpha = e^{m - m'}$ fixes that exactly. After the last tile, $O / \ell$ is the softmax
    output. Move the slider to walk the tiles of one query row.
    """)
    return


@app.cell
def _(torch):
    def online_softmax_walk(s, v, tile):
        """Teaching version of the kernel's inner loop for one query row, in torch: returns
        (m, l, O) after every tile. The Triton kernel does the same in exp2 and for BLOCK_M
        rows at once (kernels/flash_attention.py, online_softmax_step)."""
        m, l, o = torch.tensor(float("-inf")), torch.tensor(0.0), torch.zeros(v.shape[1])
        states = [(m, l, o)]
        for _start in range(0, len(s), tile):
            s_t, v_t = s[_start:_start + tile], v[_start:_start + tile]   # (N,), (N, D)
            m_new = torch.maximum(m, s_t.max())
            alpha = torch.exp(m - m_new)                 # rescale what came before
            p = torch.exp(s_t - m_new)                   # (N,)
            l, o, m = l * alpha + p.sum(), o * alpha + p @ v_t, m_new
            states.append((m, l, o))
        return states

    _g = torch.Generator().manual_seed(3)
    WALK_T, WALK_TILE = 64, 16
    walk_s = torch.randn(WALK_T, generator=_g) * 2 + torch.linspace(-2, 3, WALK_T)
    walk_v = torch.randn(WALK_T, 8, generator=_g)
    walk_states = online_softmax_walk(walk_s, walk_v, WALK_TILE)
    walk_exact = walk_s.softmax(0) @ walk_v
    _m, _l, _o = walk_states[-1]
    walk_error = float((_o / _l - walk_exact).abs().max())
    print(f"online softmax over {WALK_T} keys in tiles of {WALK_TILE}: max |O/l - softmax(s) v|"
          f" = {walk_error:.1e}")
    return (WALK_TILE, online_softmax_walk, walk_error, walk_exact, walk_s, walk_states,
            walk_v)


@app.cell
def _(WALK_TILE, mo, walk_states):
    tile_slider = mo.ui.slider(0, len(walk_states) - 1, value=2,
                               label=f"tiles of {WALK_TILE} keys processed")
    tile_slider
    return (tile_slider,)


@app.cell
def _(WALK_TILE, plt, tile_slider, walk_exact, walk_s, walk_states):
    _k = tile_slider.value
    _m, _l, _o = walk_states[_k]
    _seen = _k * WALK_TILE
    _fig, (_a, _b) = plt.subplots(1, 2, figsize=(10, 3.3), width_ratios=[3, 2])
    _a.bar(range(len(walk_s)), walk_s, color=["tab:blue" if _i < _seen else "lightgray"
                                               for _i in range(len(walk_s))])
    for _j in range(1, len(walk_states)):
        _a.axvline(_j * WALK_TILE - 0.5, color="k", lw=0.5, ls=":")
    if _k:
        _a.axhline(float(_m), color="tab:red", label=f"running max m = {float(_m):.2f}")
        _a.legend(loc="upper left")
    _a.set_xlabel("key position")
    _a.set_ylabel("score s")
    _a.set_title(f"after {_k} tile(s): l = {float(_l):.3f}")
    _cur = (_o / _l) if _k else _o * 0
    _b.bar([x - 0.2 for x in range(8)], walk_exact, width=0.4, color="lightgray",
           label="softmax(s) v (exact)")
    _b.bar([x + 0.2 for x in range(8)], _cur, width=0.4, color="tab:green", label="O / l so far")
    _b.set_xlabel("output dimension")
    _b.set_title("the output converges to the exact one")
    _b.legend(loc="lower left", fontsize=8)
    _fig.tight_layout()
    _fig
    return


@app.cell
def _(mo, tile_slider, walk_states):
    _rows = []
    for _i, (_m, _l, _o) in enumerate(walk_states[1:], start=1):
        _cells = f"{_i} | {float(_m):.3f} | {float(_l):.4f} | {float(_o.norm()):.4f}"
        _rows.append(f"| **{_cells.replace(' | ', '** | **')}** |" if _i == tile_slider.value
                     else f"| {_cells} |")
    mo.md("The state after each tile (the slider's position in bold). When a tile raises m, "
          "the l and O accumulated so far are first multiplied by $e^{m - m'} < 1$, then the "
          "tile's own terms are added.\n\n"
          "| tiles | m | l | norm of O |\n|---|---|---|---|\n" + "\n".join(_rows))
    return


@app.cell
def _(mo):
    mo.md(r"""
    ### Break it: drop one line of the loop, in fp16

    A GPU kernel hands the probabilities $e^{s - m}$ to a tensor-core matmul in fp16 or
    bf16, and fp16's largest number is 65,504, which is $e^{11.1}$. Below, the same walk
    runs entirely in fp16 (simpler than a real kernel, which keeps $\ell$ and $O$ in fp32)
    on scores three times larger (scores of 20 to 30 are ordinary in trained models). Pick
    a variant: the exact loop; one without the max subtraction (exponentiate the raw
    scores); one that keeps the running max but never rescales what it accumulated.
    """)
    return


@app.cell
def _(torch):
    def online_softmax_fp16(s, v, tile, variant="exact"):
        """The walk's loop in fp16, with one line optionally removed. Returns O / l."""
        h = torch.float16
        m, l, o = torch.tensor(float("-inf"), dtype=h), torch.zeros((), dtype=h), 0 * v[0].to(h)
        for _start in range(0, len(s), tile):
            s_t, v_t = s[_start:_start + tile].to(h), v[_start:_start + tile].to(h)
            m_new = torch.maximum(m, s_t.max())
            if variant == "no max subtraction":
                p, alpha = torch.exp(s_t), torch.ones((), dtype=h)   # e^s overflows
            else:
                p, alpha = torch.exp(s_t - m_new), torch.exp(m - m_new)
                if variant == "no rescale":
                    alpha = torch.ones((), dtype=h)   # the bug: old terms keep the old max
            l, o, m = l * alpha + p.sum(), o * alpha + p @ v_t, m_new
        return (o / l).float()

    BREAK_VARIANTS = ("exact", "no max subtraction", "no rescale")
    return BREAK_VARIANTS, online_softmax_fp16


@app.cell
def _(BREAK_VARIANTS, mo):
    break_pick = mo.ui.dropdown(BREAK_VARIANTS, value="no max subtraction",
                                label="online softmax variant (fp16)")
    break_pick
    return (break_pick,)


@app.cell
def _(BREAK_VARIANTS, WALK_TILE, break_pick, mo, online_softmax_fp16, walk_s, walk_v):
    _big = 3 * walk_s                                   # scores up to about 3x the walk's
    _exact = _big.softmax(0) @ walk_v
    break_errors = {}
    for _v in BREAK_VARIANTS:
        _out = online_softmax_fp16(_big, walk_v, WALK_TILE, _v)
        break_errors[_v] = (float((_out - _exact).abs().max()), int((~_out.isfinite()).sum()))
    for _v, (_err, _bad) in break_errors.items():
        print(f"fp16 walk, {_v:>18}: max error {_err:.3g}, {_bad} of 8 outputs inf/NaN")
    _err, _bad = break_errors[break_pick.value]
    mo.callout(mo.md(
        f"**{break_pick.value}** (largest score {float(_big.max()):.1f}): "
        + (f"{_bad} of 8 outputs are inf or NaN: $e^{{s}}$ overflowed fp16, and inf / inf is "
           "NaN. In a model, one NaN row poisons every later layer and the sampler." if _bad
           else f"max error {_err:.3g} against the exact softmax"
           + (" (fp16 rounding only)." if _err < 1e-2 else
              ": finite and silently wrong, because the terms summed before the max grew "
              "are weighted by the old max. Nothing crashes; the tokens change.")),
        ), kind="success" if _err < 1e-2 else "danger")
    return (break_errors,)


@app.cell
def _(mo):
    mo.md(r"""
    ## The real kernel, exactly equal

    `kernels/flash_attention.py` runs this loop for `BLOCK_M` query rows per program, over key
    tiles of `BLOCK_N`, and loads each key tile through the block table: key position $n$
    lives in block `block_table[n // block_size]`, slot `n % block_size`. Causality is handled
    at tile level: tiles entirely before a row block's first position are read unmasked,
    tiles past its last position are never read, only diagonal tiles are masked.

    Below it runs on two batches: a fresh prompt, and the same prompt split in two, where the
    second half is a *chunk* whose first half is already in the paged cache (what chunked
    prefill and prefix caching produce). Both are compared with the naive formula computed
    from the same cache.
    """)
    return


@app.cell
def _(D, H, HKV, default_tiles, dtype, flash_attention, flash_attention_reference, on_gpu,
      random_paged_batch):
    def run_kernel(b):
        args = (b.q, b.k_cache, b.v_cache, b.query_start_loc, b.seq_lens, b.block_tables)
        out = flash_attention(*args, b.max_query_len, D ** -0.5)
        ref = flash_attention_reference(*args, D ** -0.5)
        return float((out.float() - ref.float()).abs().max())

    _dev = "cuda" if on_gpu else "cpu"
    EQ_T = 1024 if on_gpu else 80
    # Key tiles in the prompt: the last row block reads EQ_TILES - 1 of them unmasked. At least
    # four, so a kernel that skipped the older tiles (a sliding window) would show here.
    EQ_TILES = EQ_T // default_tiles(D, EQ_T, on_gpu)["block_n"]
    _fresh = random_paged_batch([EQ_T], [0], H, HKV, D, dtype=dtype, device=_dev)
    _chunk = random_paged_batch([EQ_T // 2], [EQ_T // 2], H, HKV, D, dtype=dtype, device=_dev)
    kernel_errors = {"fresh prompt": run_kernel(_fresh), "chunk over cached half":
                     run_kernel(_chunk)}
    for _name, _err in kernel_errors.items():
        print(f"{_name:>24} ({EQ_T} tokens, {EQ_TILES} key tiles): "
              f"max |flash_attention - naive| = {_err:.1e}")
    return EQ_T, EQ_TILES, kernel_errors


@app.cell
def _(mo):
    mo.md(r"""
    ## Memory traffic, counted

    A calculator for one head (elements moved between the kernel and main memory; multiply
    by bytes per element and heads). The naive version reads $Q, K$, writes $S$, reads it,
    writes $P$, reads $P$ and $V$, writes $O$: $4Td + 4T^2$. The tiled version reads $Q$ once
    and writes $O$ once, and each query tile of $B_M$ rows reads the K and V tiles it needs
    (causal: only keys up to its last row). Every re-read of K and V is counted as a
    main-memory read, so the tiled count is an upper bound.
    """)
    return


@app.function
def hbm_elements(T: int, d: int, block_m: int = 128) -> tuple[int, int]:
    """(naive, tiled) elements of one head's causal attention that cross main memory."""
    naive = 4 * T * d + 4 * T * T
    tiles = -(-T // block_m)
    kv_reads = sum(2 * d * min(T, (i + 1) * block_m) for i in range(tiles))
    return naive, 2 * T * d + kv_reads


@app.cell
def _(D, math, plt):
    calc_T = [2 ** i for i in range(8, 17)]
    _naive, _tiled = zip(*(hbm_elements(t, D) for t in calc_T))
    traffic_ratio_4k = hbm_elements(4096, D)[0] / hbm_elements(4096, D)[1]
    _fig, _ax = plt.subplots(figsize=(7, 3.3))
    _ax.loglog(calc_T, [2 * x / 2**20 for x in _naive], "o-", color="tab:red",
               label="naive: S and P through memory")
    _ax.loglog(calc_T, [2 * x / 2**20 for x in _tiled], "o-", color="tab:green",
               label="tiled, B_M = 128")
    _ax.set_xlabel("sequence length T")
    _ax.set_ylabel("MiB per head (2-byte elements)")
    _ax.set_title(f"head dim {D}: tiled moves {traffic_ratio_4k:.1f}x fewer bytes at T = 4096")
    _ax.legend()
    _fig.tight_layout()
    # Slope of each line on the log-log plot over its last doubling: 2 means quadratic.
    traffic_slopes = {_name: math.log2(_x[-1] / _x[-2]) for _name, _x in
                      (("naive", _naive), ("tiled", _tiled))}
    print(f"traffic per head at T=4096, head dim {D}: naive / tiled = {traffic_ratio_4k:.1f}x; "
          f"scratch memory: naive {4096 * 4096 * 2 / 2**20:.0f} MiB, tiled 0; log-log slope "
          f"from T=32k to 64k: naive {traffic_slopes['naive']:.2f}, tiled "
          f"{traffic_slopes['tiled']:.2f}")
    _fig
    return traffic_ratio_4k, traffic_slopes


@app.cell
def _(D, flash_attention, mo, naive_attention, on_gpu, random_paged_batch, torch):
    # The calculator checked against counts. The tiled kernel's loads are counted inside
    # Triton's interpreter (CPU: every tl.load goes through its builder, so we add up the
    # elements each load's mask lets through). The naive version's traffic is counted by a
    # TorchDispatchMode: every op's input and output bytes. One head, 128-row tiles.
    import contextlib as _contextlib

    import numpy as _np
    from torch.utils._python_dispatch import TorchDispatchMode as _DispatchMode

    class OpBytes(_DispatchMode):
        """Bytes every torch op reads (its tensor arguments) and writes (its results)."""

        def __init__(self):
            super().__init__()
            self.bytes = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in [*args, *(out if isinstance(out, (tuple, list)) else [out])]:
                if isinstance(t, torch.Tensor):
                    self.bytes += t.numel() * t.element_size()
            return out

    @_contextlib.contextmanager
    def kernel_loads():
        """{"bytes": ...}: what Triton kernels load while the block runs (interpreter only)."""
        from triton.runtime import interpreter
        builder, box = interpreter.interpreter_builder, {"bytes": 0}
        load = builder.create_masked_load

        def counted(ptrs, mask, *args):
            ret = load(ptrs, mask, *args)
            box["bytes"] += int(_np.count_nonzero(mask.data)) * ret.data.itemsize
            return ret
        builder.create_masked_load = counted
        try:
            yield box
        finally:
            builder.create_masked_load = load

    # T -> (naive bytes, tiled kernel bytes loaded). The naive side is counted on every
    # device (a dispatch mode sees CUDA ops too); the kernel's loads only under the
    # interpreter: on a GPU the kernel runs compiled, with no hook, so they stay None there.
    counted_traffic = {}
    for _t in (256, 512, 1024):
        _loaded = None
        if not on_gpu:
            _b = random_paged_batch([_t], [0], 1, 1, D, dtype=torch.float32, device="cpu")
            with kernel_loads() as _loads:
                flash_attention(_b.q, _b.k_cache, _b.v_cache, _b.query_start_loc, _b.seq_lens,
                                _b.block_tables, _b.max_query_len, D ** -0.5, block_m=128,
                                block_n=64)
            _loaded = _loads["bytes"]
        _q, _k, _v = (torch.randn(1, _t, D, device="cuda" if on_gpu else "cpu")
                      for _ in range(3))
        with OpBytes() as _naive:
            naive_attention(_q, _k, _v, D ** -0.5)
        counted_traffic[_t] = (_naive.bytes, _loaded)
        _tiled_text = ("not countable (compiled)" if _loaded is None
                       else f"{_loaded / 2**20:6.2f} MiB")
        print(f"T={_t:5d}: counted naive {_naive.bytes / 2**20:6.2f} MiB, tiled kernel "
              f"loads {_tiled_text} (calculator, reads only: "
              f"{4 * (hbm_elements(_t, D)[1] - _t * D) / 2**20:6.2f} MiB)")
    mo.md("Counted under Triton's interpreter, one head, fp32: the kernel's loads agree with "
          "the calculator (its block-table reads aside), and doubling T multiplies them by "
          "more than 3: quadratic, as the calculator says." if not on_gpu else
          "On a GPU the kernel runs compiled, so its loads are not counted here (the CPU run "
          "of this lesson counts them); the naive version's bytes are counted on the GPU, "
          "against the calculator's tiled reads.")
    return (counted_traffic,)


@app.cell
def _(D, mo, traffic_slopes):
    _gpt2 = hbm_elements(1024, 64)          # GPT-2 medium: T = 1024, head dim 64
    mo.md(rf"""
    Read the plot's slopes, not only the gap: both lines rise by a factor of 4 per doubling
    of T (slopes {traffic_slopes['naive']:.2f} and {traffic_slopes['tiled']:.2f} on the
    log-log axes). FlashAttention makes attention's *memory* O(T), nothing of size T x T is
    ever stored, but its main-memory *traffic* stays quadratic: query tile $i$ re-reads every
    K and V tile before it. What tiling buys is a constant factor, which tends to
    $4B_M/d$ ({4 * 128 // D} with 128-row tiles and head dim {D}), and re-reads that are
    tile-sized and regular. **The series outline is wrong here**: it promises a "75x HBM
    reduction", as if traffic fell from O(T²) to O(T). It does not: the factor is about 7x
    at these sizes and stays bounded by $4B_M/d$ however long the sequence (at GPT-2
    medium's shape, the model the FlashAttention paper measures, T = 1024 and head dim 64,
    this calculator gives {_gpt2[0] / _gpt2[1]:.1f}x). That constant is why the paper calls
    the kernel "IO-aware" rather than "linear"; on a GPU it is the difference between a
    memory-bound and a compute-bound kernel (a statement from the papers, not measured here).

    ## Live timing on this device
    """)
    return


@app.cell
def _(D, H, HKV, best_ms, default_tiles, dtype, flash_attention, mo, naive_attention,
      on_gpu, random_paged_batch, torch):
    _dev = "cuda" if on_gpu else "cpu"
    TIME_T = 4096 if on_gpu else 64
    _b = random_paged_batch([TIME_T], [0], H, HKV, D, dtype=dtype, device=_dev, spare_blocks=0)
    _args = (_b.q, _b.k_cache, _b.v_cache, _b.query_start_loc, _b.seq_lens, _b.block_tables,
             TIME_T, D ** -0.5)
    kernel_ms = best_ms(lambda: flash_attention(*_args), repeats=3 if on_gpu else 1)
    _qkv = [torch.randn(H, TIME_T, D, device=_dev, dtype=dtype) for _ in range(3)]  # (H, T, D)
    naive_ms = best_ms(lambda: naive_attention(*_qkv, D ** -0.5))
    _tiles = default_tiles(D, TIME_T, on_gpu)
    programs = -(-TIME_T // _tiles["block_m"]) * H
    if on_gpu:
        _msg = (f"{TIME_T} tokens, {H} heads, bf16: Triton flash_attention {kernel_ms:.2f} ms, "
                f"naive {naive_ms:.2f} ms ({naive_ms / kernel_ms:.1f}x)")
    else:
        _msg = (f"{TIME_T} tokens, {H} heads: the Triton kernel under the interpreter took "
                f"{kernel_ms:.0f} ms for {programs} programs ({kernel_ms / programs:.1f} ms each);"
                f" naive torch took {naive_ms:.2f} ms")
    print(_msg)
    mo.md(_msg + ("" if on_gpu else r"""

    On a CPU, Triton has no compiler target, so `TRITON_INTERPRET=1` executes each program
    instance in Python, one tile operation at a time, with numpy arrays standing in for
    registers. That is slow by design: it exists to check a kernel's logic on any machine,
    which is how this course's tests run the same kernel the GPU runs. Its speed says nothing
    about the kernel's speed on a GPU; `python -m kernels.bench` measures that."""))
    return TIME_T, kernel_ms, naive_ms


@app.cell
def _(mo):
    mo.md(r"""
    ## Exercise: write the rescaling step

    In flash-decoding (the decode kernel, `kernels/paged_attention.py`), several programs each
    walk one slice of a long context and return partial statistics $(m_i, \ell_i, O_i)$, with
    $O_i$ not yet divided by $\ell_i$. Complete `merge` so that it combines two partials into
    the statistics of the whole context. The starting version just adds them: it is right
    only when both slices happened to have the same maximum. The kernel decides: the checker
    runs minivllm's decode kernel (`paged_decode_attention`) over a 160-token context cut into
    partitions of 16 and of 32 tokens, takes the partials each partition left in its scratch
    buffer (`DecodeScratch`), folds them left to right with your `merge`, and compares the
    result with the kernel's own reduction (`_reduce_partitions_kernel`), head by head.
    """)
    return


@app.function
def merge(m1, l1, o1, m2, l2, o2):
    """Combine two partial softmax states (scalars m, l; vectors o) into one."""
    m = max(m1, m2)
    return m, l1 + l2, o1 + o2          # <- edit me: each side was summed under its own max


@app.cell
def _(D, H, HKV, on_gpu, random_paged_batch, torch):
    from kernels.flash_attention import LOG2E
    from kernels.paged_attention import DecodeScratch, paged_decode_attention

    def kernel_partials(partition_size, context=160):
        """One decode over `context` tokens, split into partitions: per head, the partials
        (m, l, O) each partition left in the scratch, in natural-log units with O not yet
        divided by l, and the kernel's own reduced output."""
        _dev = "cuda" if on_gpu else "cpu"
        _b = random_paged_batch([1], [context - 1], H, HKV, D, device=_dev, seed=3)
        _scratch = DecodeScratch.allocate(1, H, D, context, _dev, partition_size)
        _out = paged_decode_attention(_b.q, _b.k_cache, _b.v_cache, _b.seq_lens,
                                      _b.block_tables, context, D ** -0.5, scratch=_scratch,
                                      partition_size=partition_size)       # (1, H, D)
        _parts = -(-context // partition_size)
        _m = _scratch.part_m[0, :, :_parts].double() / LOG2E     # the kernel works in log2
        _l = _scratch.part_l[0, :, :_parts].double()
        _o = _scratch.part_o[0, :, :_parts, :D].double() * _l[..., None]   # un-normalised
        return ([[(_m[h, i], _l[h, i], _o[h, i]) for i in range(_parts)] for h in range(H)],
                _out[0].double())

    # Two splits of the same kind of context: 10 and 5 partitions (the interpreter runs them).
    kernel_splits = {ps: kernel_partials(ps) for ps in (16, 32)}
    return (kernel_splits,)


@app.cell
def _(kernel_splits, torch):
    def check_merge(fn):
        """(ok, message): fold the kernel's partials with `fn`; the kernel's reduce decides."""
        for _ps, (_heads, _kernel_out) in kernel_splits.items():
            for _h, _parts in enumerate(_heads):
                _m, _l, _o = _parts[0]
                _first = True
                for _part in _parts[1:]:
                    _new = fn(_m, _l, _o, *_part)
                    if _first and torch.allclose(torch.as_tensor(_new[1]), _l + _part[1]):
                        if not torch.allclose(_m, _part[0]):
                            return False, ("l and O were added without rescaling: multiply "
                                           "each side by exp(m_i - m) first.")
                    _m, _l, _o = (torch.as_tensor(x, dtype=torch.float64) for x in _new)
                    _first = False
                _m_true = max(float(p[0]) for p in _parts)
                if abs(float(_m) - _m_true) > 1e-6:
                    return False, "m should be the larger of the two maxima."
                _err = float((_o / _l - _kernel_out[_h]).abs().max())
                if _err > 1e-4:
                    return False, (f"O / l differs from the kernel's own reduction by {_err:.3f} "
                                   f"(head {_h}, partitions of {_ps}): check the sign of the "
                                   "exponent, exp(m_i - m) <= 1.")
                _l_true = sum(float(p[1]) * torch.exp(p[0] - _m_true).item() for p in _parts)
                if abs(float(_l) - _l_true) > 1e-6 * _l_true:
                    return False, "O / l is right, but l is not the sum under the new max."
        return True, ("Correct: exp(m_i - m) moves each partial to the common maximum, and "
                      "your merge reproduces the kernel's reduction on every head.")
    return (check_merge,)


@app.cell
def _(check_merge, mo):
    exercise_ok, exercise_message = check_merge(merge)
    print(f"exercise: {'solved' if exercise_ok else 'not yet'} - {exercise_message}")
    mo.callout(mo.md(exercise_message), kind="success" if exercise_ok else "warn")
    return


@app.cell
def _(check_merge, torch):
    def _solution(m1, l1, o1, m2, l2, o2):
        m = torch.maximum(m1, m2)
        a1, a2 = torch.exp(m1 - m), torch.exp(m2 - m)
        return m, l1 * a1 + l2 * a2, o1 * a1 + o2 * a2

    def _wrong_sign(m1, l1, o1, m2, l2, o2):
        m = torch.maximum(m1, m2)
        a1, a2 = torch.exp(m - m1), torch.exp(m - m2)
        return m, l1 * a1 + l2 * a2, o1 * a1 + o2 * a2

    checker_verdicts = {"solution": check_merge(_solution)[0],
                        "added": check_merge(lambda *s: (max(s[0], s[3]), s[1] + s[4],
                                                         s[2] + s[5]))[0],
                        "wrong sign": check_merge(_wrong_sign)[0]}
    return (checker_verdicts,)


@app.cell
def _(
    D,
    H,
    counted_traffic,
    kernel_errors,
    naive_attention,
    naive_rows,
    on_gpu,
    torch,
    traffic_ratio_4k,
):
    from torch.utils._python_dispatch import TorchDispatchMode

    class LargestTensor(TorchDispatchMode):
        """Watches every tensor operation torch runs and keeps the largest result, in bytes:
        the biggest buffer an attention implementation really allocated."""

        def __init__(self):
            super().__init__()
            self.bytes = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor):
                    self.bytes = max(self.bytes, t.numel() * t.element_size())
            return out

    # Measured, not computed: the largest tensor each version allocated at two lengths.
    largest_buffer = {}
    for _t in (naive_rows[0][0], naive_rows[1][0]):
        _q, _k, _v = (torch.randn(H, _t, D, device="cuda" if on_gpu else "cpu")
                      for _ in range(3))
        with LargestTensor() as _naive:
            naive_attention(_q, _k, _v, D ** -0.5)
        with LargestTensor() as _fused:
            torch.nn.functional.scaled_dot_product_attention(_q, _k, _v, is_causal=True)
        largest_buffer[_t] = (_naive.bytes, _fused.bytes)
        print(f"T={_t:5d}: largest tensor allocated: naive {_naive.bytes / 2**20:6.1f} MiB, "
              f"fused SDPA {_fused.bytes / 2**20:6.2f} MiB")

    _t_long = max(largest_buffer)
    findings = {
        "longest_t": int(_t_long),
        "naive_largest_buffer_mib": largest_buffer[_t_long][0] / 2**20,
        "fused_largest_buffer_mib": largest_buffer[_t_long][1] / 2**20,
        "tiled_traffic_ratio_4k": float(traffic_ratio_4k),
        "counted_traffic_mib": {str(t): [None if x is None else round(x / 2**20, 3)
                                         for x in v] for t, v in counted_traffic.items()},
        "max_kernel_error": float(max(kernel_errors.values())),
    }
    print("findings:", findings)
    return findings, largest_buffer


@app.cell
def _(
    D,
    EQ_TILES,
    H,
    break_errors,
    checker_verdicts,
    counted_traffic,
    kernel_errors,
    largest_buffer,
    on_gpu,
    walk_error,
    walk_s,
    walk_states,
):
    def test_online_softmax_ends_at_the_exact_softmax():
        _m, _l, _ = walk_states[-1]
        assert walk_error < 1e-5
        assert float(_m) == float(walk_s.max())
        assert abs(float(_l) - float((walk_s - walk_s.max()).exp().sum())) < 1e-4

    def test_triton_kernel_equals_naive_attention():
        tol = 2e-2 if on_gpu else 1e-5
        assert EQ_TILES >= 4 and all(err < tol for err in kernel_errors.values()), kernel_errors

    def test_score_matrix_grows_quadratically():
        # The naive version's biggest buffer is the T x T score matrix: doubling T
        # quadruples it. The fused kernel's biggest is the (H, T, D) output: it doubles.
        (t0, (n0, f0)), (t1, (n1, f1)) = sorted(largest_buffer.items())
        assert n1 / n0 == (t1 / t0) ** 2 and n1 == H * t1 * t1 * 4
        assert f1 / f0 == t1 / t0 and f1 < n1 / 4

    def test_counted_traffic_agrees_with_the_calculator():
        # Measured: the kernel's loads, counted in Triton's interpreter (CPU only: compiled
        # on a GPU), are the calculator's reads (Q once, K/V per query tile) plus its
        # block-table reads (< 5%); the naive version, counted by a dispatch mode on either
        # device (S and P, the mask, every op's inputs and outputs), moves over 10x the
        # bytes of 128-row tiles (16-row tiles: only ~4x).
        assert sorted(counted_traffic) == [256, 512, 1024]
        for _t, (_naive, _tiled) in counted_traffic.items():
            _reads = 4 * (hbm_elements(_t, D)[1] - _t * D)           # fp32, less O's write
            assert (_tiled is None) == on_gpu, (_t, _tiled)
            if _tiled is not None:
                assert _reads <= _tiled < 1.05 * _reads, (_t, _tiled, _reads)
            assert _naive > 10 * (_tiled or _reads), (_t, _naive, _tiled, _reads)

    def test_each_dropped_line_breaks_fp16_softmax():
        assert break_errors["exact"][0] < 1e-2 and break_errors["exact"][1] == 0
        assert break_errors["no max subtraction"][1] > 0          # inf / NaN
        assert break_errors["no rescale"][1] == 0 and break_errors["no rescale"][0] > 0.05

    def test_traffic_is_still_quadratic():
        # Counted, not computed: doubling T multiplied the naive version's bytes (on either
        # device) and the kernel's loads (interpreter) by more than 3; linear traffic would
        # double them.
        _ts = sorted(counted_traffic)
        assert len(_ts) == 3
        for _a, _b in zip(_ts, _ts[1:]):
            for _side in (0, 1):
                _x, _y = counted_traffic[_a][_side], counted_traffic[_b][_side]
                assert (_x is None) == (_side == 1 and on_gpu), counted_traffic
                if _x is not None:
                    assert _y > 3 * _x, counted_traffic

    def test_checker_accepts_the_rescaling_and_rejects_the_bugs():
        assert checker_verdicts == {"solution": True, "added": False, "wrong sign": False}
    return


@app.cell
def _(kernel_errors, mo, traffic_ratio_4k):
    mo.md(f"""
    ## What we found

    * The online softmax reproduces softmax exactly: three running numbers per query row and
      one rescaling factor $e^{{m - m'}}$ per tile replace the T x T matrix.
    * minivllm's Triton kernel matched the naive formula to within
      {max(kernel_errors.values()):.0e}, on a fresh prompt and on a chunk over cached context
      read through a block table.
    * At 4,096 tokens and head dim 64 the tiled kernel moves about {traffic_ratio_4k:.0f}x fewer
      bytes per head, and needs no T x T scratch memory at all.

    ## Where the code lives

    * `kernels/flash_attention.py`: `online_softmax_step` and `load_kv_tile` (the two tile
      operations), `_flash_attention_kernel` (the causal tile walk over the paged cache),
      `flash_attention` (launcher), `flash_attention_reference`, the test and `bench`.
    * `kernels/paged_attention.py`: the decode kernel and `_reduce_partitions_kernel`, whose
      merge is this lesson's exercise.
    * `minivllm/attention/triton_attention.py`: how the engine picks a kernel each step;
      `minivllm/attention/torch_attention.py`: the torch reference every kernel is checked
      against; `minivllm/attention/layer.py`: `Attention.forward`, which dispatches (on a CPU
      to the fast path, `minivllm/attention/cpu_attention.py`, unless `USE_REFERENCE` is set).
    * `python -m kernels.bench` (GPU): this kernel against torch SDPA's flash backend.
    """)
    return


@app.cell
def _(mo):
    mo.callout(mo.md(r"""
    **In vLLM V1** (as of vLLM 0.33). The attention backends are in
    `vllm/v1/attention/backends/`: on most NVIDIA GPUs the first choice is `flash_attn.py`
    (`FlashAttentionImpl.forward`), which calls `flash_attn_varlen_func` from vLLM's fork of
    Dao's FlashAttention, a CUDA kernel that reads K/V through the block table as ours does; on
    data-centre Blackwell (compute capability 10.x) `flashinfer.py` is tried first. The Triton
    twin of our kernel is `triton_attn.py` over
    `vllm/v1/attention/ops/triton_unified_attention.py` (it moved there from
    `vllm/attention/ops/`): `unified_attention` runs prefill, chunks over cached context and
    decode in one kernel, and for long decodes splits the context into segments whose partials
    `reduce_segments` merges with this lesson's rescaling. minivllm keeps two kernels
    (FlashAttention for prefill and chunks, flash-decoding in `kernels/paged_attention.py`)
    because each is one idea a reader can hold; it has no CUDA kernel, so every kernel also runs
    under Triton's interpreter on a CPU, where this page counts its loads.
    """), kind="info")
    return


if __name__ == "__main__":
    app.run()
