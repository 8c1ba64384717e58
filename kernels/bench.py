"""The GPU benchmark of the attention kernels. Needs CUDA.

    python -m kernels.bench                  # decode GB/s, prefill TFLOP/s, write_kv GB/s
    python -m kernels.bench sweep            # the same, over several tile settings
    minivllm bench kernels [sweep]           # the same, from the engine's CLI

What it measures, and against what:
  * decode: one paged decode step at batch 64 x 2k context in bf16 (Llama-3-8B and Qwen3-0.6B
    attention shapes). Achieved bandwidth = K/V bytes / time, as a share of the GPU's peak HBM
    bandwidth (from its memory clock and bus width) and of a measured device-to-device copy.
    Target: >= 60% of peak. Beside it: torch SDPA on the same K/V laid out contiguously.
  * prefill: one causal 4k-token prompt. TFLOP/s of flash_attention (K/V read through block
    tables) and of torch SDPA's flash backend on contiguous tensors. Target: >= 0.7x SDPA.

The engine end to end on a GPU (random weights of real model shapes, against transformers) is
minivllm/benchmarks/gpu.py: kernels/ imports nothing from minivllm. Nothing here asserts: it prints
what it measured and the machine it measured on. Leaves out multi-GPU.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from kernels.flash_attention import bench as bench_prefill
from kernels.paged_attention import bench as bench_decode
from kernels.write_kv import bench as bench_write

ATTN_SHAPES = {"llama3-8b": dict(num_heads=32, num_kv_heads=8, head_dim=128),
               "qwen3-0.6b": dict(num_heads=16, num_kv_heads=8, head_dim=128)}

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


def summary(results: dict) -> str:
    """The default-tile numbers as one short table: what gpu_check prints last."""
    rows = [f"{'kernel':<22}{'shape':<12}{'ms':>8}  result"]
    for r in results["decode"]:
        if not r["tiles"]:
            rows.append(f"{'decode b64 x 2k':<22}{r['shape']:<12}{r['ms']:8.3f}  "
                        f"{r['GB/s']:.0f} GB/s ({r['pct_peak']:.0f}% of peak; target >= 60%)")
    for r in results["prefill"]:
        if not r["tiles"]:
            rows.append(f"{'prefill 4k causal':<22}{r['shape']:<12}{r['ms']:8.3f}  "
                        f"{r['TFLOP/s']:.0f} TFLOP/s ({r['vs_sdpa']:.2f}x SDPA; target >= 0.7x)")
    w = results["write_kv"]
    rows.append(f"{'write_kv 8k tokens':<22}{'8 x 128':<12}{w['ms']:8.3f}  {w['GB/s']:.0f} GB/s")
    return "\n".join(rows)


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    """The flags, also for `minivllm bench kernels` (the engine's CLI adds them; nothing here
    imports minivllm)."""
    parser.add_argument("what", nargs="?", default="kernels", choices=["kernels", "sweep"])
    parser.add_argument("--json", type=Path, help="also write the results here")


def run(args: argparse.Namespace) -> dict:
    if not torch.cuda.is_available():
        raise SystemExit("kernels.bench measures GPU speed and needs CUDA; on a CPU run "
                         "`pytest tests/test_kernels.py` (the interpreter checks correctness)")
    print(f"machine: {machine()}")
    results = {"machine": machine(), "kernels": run_kernels(sweep=args.what == "sweep")}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2, default=str))
    print(f"\nsummary ({machine()})\n{summary(results['kernels'])}")
    return results


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m kernels.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_cli_args(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    main()
