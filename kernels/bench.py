"""The GPU benchmark of the attention kernels and of the engine that uses them. Needs CUDA.

    python -m kernels.bench                  # kernels, then end to end on both model shapes
    python -m kernels.bench kernels          # decode GB/s and prefill TFLOP/s only
    python -m kernels.bench sweep            # the same, over several tile settings
    python -m kernels.bench e2e --models qwen3-0.6b

What it measures, and against what:
  * decode: one paged decode step at batch 64 x 2k context in bf16 (Llama-3-8B and Qwen3-0.6B
    attention shapes). Achieved bandwidth = K/V bytes / time, as a share of the GPU's peak HBM
    bandwidth (from its memory clock and bus width) and of a measured device-to-device copy.
    Target: >= 60% of peak. Beside it: torch SDPA on the same K/V laid out contiguously.
  * prefill: one causal 4k-token prompt. TFLOP/s of flash_attention (K/V read through block
    tables) and of torch SDPA's flash backend on contiguous tensors. Target: >= 0.7x SDPA.
  * end to end, random weights with Qwen3-0.6B and Llama-3-8B shapes in bf16 (no download; a
    word-level tokenizer stands in): minivllm (Triton backend) against transformers' generate
    on the same checkpoint: inter-token latency at batch 1, output tokens/s at batch 64.

Nothing here asserts: it prints what it measured and the machine it measured on. Leaves out
CUDA graphs (the engine's decode steps are eager here) and multi-GPU.
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import time
from pathlib import Path

import torch

from kernels.flash_attention import bench as bench_prefill
from kernels.paged_attention import bench as bench_decode
from kernels.write_kv import bench as bench_write

ATTN_SHAPES = {"llama3-8b": dict(num_heads=32, num_kv_heads=8, head_dim=128),
               "qwen3-0.6b": dict(num_heads=16, num_kv_heads=8, head_dim=128)}

MODEL_SHAPES = {
    "qwen3-0.6b": dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_size=1024,
                       intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, vocab_size=151936,
                       max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1e6,
                       tie_word_embeddings=True),
    "llama3-8b": dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=4096,
                      intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, head_dim=128, vocab_size=128256,
                      max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=5e5,
                      tie_word_embeddings=False),
}


def machine() -> str:
    import triton
    p = torch.cuda.get_device_properties(0)
    return (f"{p.name}, {p.total_memory / 2**30:.0f} GiB, {p.multi_processor_count} SMs; "
            f"torch {torch.__version__}, triton {triton.__version__}")


def peak_hbm_gbs() -> float | None:
    """Theoretical HBM bandwidth: 2 transfers per memory clock x bus width (bytes)."""
    p = torch.cuda.get_device_properties(0)
    clock_khz, bus_bits = getattr(p, "memory_clock_rate", 0), getattr(p, "memory_bus_width", 0)
    return 2 * clock_khz * 1e3 * bus_bits / 8 / 1e9 if clock_khz and bus_bits else None


def copy_gbs(nbytes: int = 1 << 30) -> float:
    """What a plain device-to-device copy achieves: a practical ceiling for any kernel."""
    from triton.testing import do_bench
    x = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    ms = do_bench(lambda: y.copy_(x))
    return 2 * nbytes / ms / 1e6


def sdpa_decode_ms(batch, context, num_heads, num_kv_heads, head_dim, dtype=torch.bfloat16):
    """torch SDPA for one decode step on contiguous K/V (batch, heads, context, head_dim)."""
    from triton.testing import do_bench
    q = torch.randn(batch, num_heads, 1, head_dim, device="cuda", dtype=dtype)
    k = torch.randn(batch, num_kv_heads, context, head_dim, device="cuda", dtype=dtype)
    v = torch.randn_like(k)
    f = torch.nn.functional.scaled_dot_product_attention
    try:
        f(q, k, v, enable_gqa=True)
        return do_bench(lambda: f(q, k, v, enable_gqa=True))
    except RuntimeError:     # an SDPA without GQA support: expand K/V (costs it bandwidth)
        k, v = (x.repeat_interleave(num_heads // num_kv_heads, 1) for x in (k, v))
        return do_bench(lambda: f(q, k, v))


def run_kernels(sweep: bool = False) -> dict:
    peak, copy = peak_hbm_gbs(), copy_gbs()
    print(f"HBM: theoretical peak {peak or float('nan'):.0f} GB/s, measured copy {copy:.0f} GB/s")
    results = {"peak_hbm_GB/s": peak, "copy_GB/s": copy, "decode": [], "prefill": []}
    decode_tiles = [{}]
    prefill_tiles = [{}]
    if sweep:
        decode_tiles += [dict(partition_size=p, block_n=n, num_warps=w, num_stages=s)
                         for p in (256, 512, 1024) for n in (32, 64, 128) for w in (4, 8)
                         for s in (2, 3)]
        prefill_tiles += [dict(block_m=m, block_n=n, num_warps=w, num_stages=s)
                          for m in (64, 128) for n in (32, 64, 128) for w in (4, 8)
                          for s in (2, 3, 4)]
    print("\ndecode, batch 64 x 2048 context, bf16, block_size 16")
    print(f"{'shape':<12}{'tiles':<58}{'ms':>8}{'GB/s':>8}{'% peak':>8}{'SDPA ms':>9}")
    for name, shape in ATTN_SHAPES.items():
        sdpa = sdpa_decode_ms(64, 2048, **shape)
        for tiles in decode_tiles:
            try:
                r = bench_decode(batch=64, context=2048, **shape, **tiles)
            except Exception as e:           # a tile setting this GPU cannot compile
                print(f"{name:<12}{str(tiles):<58} failed: {type(e).__name__}")
                continue
            pct = 100 * r["GB/s"] / peak if peak else float("nan")
            print(f"{name:<12}{str(tiles or 'default'):<58}{r['ms']:8.3f}{r['GB/s']:8.0f}"
                  f"{pct:8.1f}{sdpa:9.3f}")
            results["decode"].append({"shape": name, "tiles": tiles, **r, "pct_peak": pct,
                                      "sdpa_ms": sdpa})
    print("\nprefill, one causal prompt of 4096 tokens, bf16, block_size 16")
    print(f"{'shape':<12}{'tiles':<58}{'ms':>8}{'TFLOP/s':>9}{'SDPA':>8}{'x SDPA':>8}")
    for name, shape in ATTN_SHAPES.items():
        for tiles in prefill_tiles:
            try:
                r = bench_prefill(seq_len=4096, **shape, **tiles)
            except Exception as e:
                print(f"{name:<12}{str(tiles):<58} failed: {type(e).__name__}")
                continue
            print(f"{name:<12}{str(tiles or 'default'):<58}{r['ms']:8.3f}{r['TFLOP/s']:9.1f}"
                  f"{r['sdpa_TFLOP/s']:8.1f}{r['vs_sdpa']:8.2f}")
            results["prefill"].append({"shape": name, "tiles": tiles, **r})
    w = bench_write()
    print(f"\nwrite_kv, {w['tokens']} tokens x 8 KV heads x 128: {w['ms']:.3f} ms, "
          f"{w['GB/s']:.0f} GB/s")
    results["write_kv"] = w
    return results


# ------------------------------------------------------------------------------ end to end
def random_checkpoint(shape: str | dict, path: Path, dtype=torch.bfloat16, device="cuda",
                      std: float | None = None):
    """A checkpoint directory with random weights of a shape (a MODEL_SHAPES name or a config
    dict like them), written by transformers, plus a word-level tokenizer (the benchmark feeds
    token ids; the engine wants a tokenizer). Returns the transformers model, on `device`.
    std: redraw every weight with this spread (norms around 1) for less degenerate outputs."""
    import transformers
    from tokenizers import Tokenizer, models
    cfg = dict(MODEL_SHAPES[shape] if isinstance(shape, str) else shape)
    cfg.pop("architectures", None)
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg,
                                               bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    with torch.device(device):
        try:
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
        except TypeError:                          # transformers < 4.56 spells it torch_dtype
            model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=dtype)
    model.eval()
    if std is not None:
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.normal_(1.0 if "norm" in name else 0.0, std)
    model.save_pretrained(path)
    vocab = {f"w{i}": i for i in range(1000)}
    Tokenizer(models.WordLevel(vocab, unk_token="w0")).save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"unk_token": "w0"}))
    return model


def _timed(fn) -> float:
    fn()                                               # warm-up: compile, allocate
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def run_e2e(name: str, batch: int = 64, prompt_len: int = 512, new_tokens: int = 256) -> dict:
    """Batch-1 inter-token latency and batch-`batch` throughput, transformers vs minivllm."""
    from minivllm import LLM, SamplingParams
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, 1000, (batch, prompt_len), generator=g).tolist()
    one = prompts[:1]
    res = {"model": name, "batch": batch, "prompt_len": prompt_len, "new_tokens": new_tokens}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp)
        model = random_checkpoint(name, path)

        def hf(ids, n):
            x = torch.tensor(ids, device="cuda")
            return lambda: model.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                                          max_new_tokens=n, min_new_tokens=n, pad_token_id=0)
        hf_itl = (_timed(hf(one, 65)) - _timed(hf(one, 1))) / 64
        hf_tps = batch * new_tokens / _timed(hf(prompts, new_tokens))
        del model
        gc.collect()
        torch.cuda.empty_cache()

        llm = LLM(str(path), dtype="bfloat16", max_model_len=prompt_len + new_tokens + 64,
                  max_num_seqs=batch, max_num_batched_tokens=8192)
        print(f"  {llm}")

        def ours(ids, n):
            p = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
            return lambda: llm.generate(ids, p, use_tqdm=False)
        our_itl = (_timed(ours(one, 65)) - _timed(ours(one, 1))) / 64
        our_tps = batch * new_tokens / _timed(ours(prompts, new_tokens))
        del llm
        gc.collect()
        torch.cuda.empty_cache()
    res.update(hf_itl_ms=1e3 * hf_itl, minivllm_itl_ms=1e3 * our_itl,
               hf_tok_s=hf_tps, minivllm_tok_s=our_tps)
    print(f"  batch 1 inter-token latency: transformers {1e3 * hf_itl:.2f} ms, "
          f"minivllm {1e3 * our_itl:.2f} ms")
    print(f"  batch {batch} x {prompt_len}+{new_tokens} tokens: transformers {hf_tps:.0f} "
          f"tok/s, minivllm {our_tps:.0f} tok/s ({our_tps / hf_tps:.2f}x)")
    return res


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", nargs="?", default="all", choices=["all", "kernels", "sweep", "e2e"])
    ap.add_argument("--models", default="qwen3-0.6b,llama3-8b",
                    help=f"end-to-end model shapes, from {sorted(MODEL_SHAPES)}")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("kernels.bench measures GPU speed and needs CUDA; on a CPU run "
                         "`pytest tests/test_kernels.py` (the interpreter checks correctness)")
    print(f"machine: {machine()}")
    results = {"machine": machine()}
    if args.what in ("all", "kernels", "sweep"):
        results["kernels"] = run_kernels(sweep=args.what == "sweep")
    if args.what in ("all", "e2e"):
        results["e2e"] = []
        for name in args.models.split(","):
            print(f"\nend to end, {name} shapes, random weights, bf16")
            results["e2e"].append(run_e2e(name))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2, default=str))
    return results


if __name__ == "__main__":
    main()
