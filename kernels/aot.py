"""Compile every kernel ahead of time for a GPU that is not here: registers, shared memory, spills.

What you will learn:
  * Triton compiles for a *target*, not for the GPU in the machine: `triton.compile(ASTSource,
    target=GPUTarget("cuda", 90, 32))` runs the whole pipeline (TTIR -> TTGIR -> LLVM -> PTX ->
    ptxas -> cubin) on a CPU-only box, because Triton's wheel ships ptxas;
  * what decides whether a kernel fits an SM: registers per thread (255 at most; more spill
    to local memory, i.e. to HBM through L1: cuobjdump's LOCAL bytes) and shared memory per
    block (the K/V tiles times num_stages of software pipelining: 227 KB on an H100, 163 KB on
    an A100).

The launches compiled here are the launchers' own: each launcher (write_kv, flash_attention,
paged_decode_attention) is called with "meta" tensors (shapes and dtypes, no memory) while its
kernel is replaced by a recorder, so the grid, arguments, constexprs, num_warps and num_stages
are exactly what the engine would launch, and cannot drift from a copy kept here. Integer
arguments are specialised the way Triton's launcher does it (multiples of 16 are marked
divisible by 16, which is what lets K/V tiles load with 16-byte cp.async).

    python -m kernels.aot              # sm_90 and sm_80, the engine's shapes; prints a table

Needs TRITON_INTERPRET unset or 0 (interpreted kernels cannot be compiled). Left out: running
the cubin (that needs the GPU), AMD targets, autotuning.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import tempfile
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kernels import flash_attention as fa
from kernels import paged_attention as pa
from kernels import write_kv as wk

SHARED_MEM_LIMIT = {90: 227 * 1024, 80: 163 * 1024}   # bytes per block (opt-in maximum)
# (name, num_heads, num_kv_heads, head_dim): SmolLM2-135M (the default model), Llama-3-8B.
MODELS = [("smollm2-135m", 9, 3, 64), ("llama3-8b", 32, 8, 128)]
_TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32",
          torch.int64: "i64", torch.int32: "i32"}


class _Recorder:
    """Stands in for a @triton.jit kernel: `kernel[grid](*args, **kwargs)` is recorded."""

    def __init__(self, kernel, calls: list):
        self.kernel, self.calls = kernel, calls

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((self.kernel, grid, args, kwargs))


def record_launches(fn, *args, **kwargs) -> list:
    """Call a launcher with its kernels replaced by recorders; return the launches it made."""
    calls = []
    patches = [(fa, "_flash_attention_kernel"), (pa, "_paged_decode_kernel"),
               (pa, "_reduce_partitions_kernel"), (wk, "_write_kv_kernel")]
    saved = [getattr(m, n) for m, n in patches]
    for m, n in patches:
        setattr(m, n, _Recorder(getattr(m, n), calls))
    fa_check, pa_check = fa.check_launch, pa.check_launch
    fa.check_launch = pa.check_launch = lambda x, kernel: None   # meta tensors, compiled kernels
    try:
        fn(*args, **kwargs)
    finally:
        for (m, n), k in zip(patches, saved):
            setattr(m, n, k)
        fa.check_launch, pa.check_launch = fa_check, pa_check
    return calls


def compile_launch(kernel, args, kwargs, arch: int) -> dict:
    """Compile one recorded launch for sm_<arch>; ptxas -v says registers, spills, smem."""
    signature, constexprs, attrs, options = {}, {}, {}, {}
    values = dict(zip(kernel.arg_names, args))
    for key, value in kwargs.items():
        (values if key in kernel.arg_names else options)[key] = value
    for i, name in enumerate(kernel.arg_names):
        v = values[name]
        if i in kernel.constexprs or v is None:            # None: a constexpr, as at launch
            signature[name], constexprs[name] = "constexpr", v
        elif isinstance(v, torch.Tensor):
            signature[name] = "*" + _TYPES[v.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]          # torch allocations: 256-B aligned
        elif isinstance(v, float):
            signature[name] = "fp32"
        else:
            signature[name] = "i32" if -2**31 <= v < 2**31 else "i64"
            if v % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    compiled = triton.compile(ASTSource(kernel, signature, constexprs, attrs),
                              target=GPUTarget("cuda", arch, 32), options=options)
    usage = resource_usage(compiled.asm["cubin"])
    return {"regs": usage["REG"], "local_bytes": usage["LOCAL"] + usage["STACK"],
            "smem": compiled.metadata.shared, "num_warps": compiled.metadata.num_warps,
            "num_stages": compiled.metadata.num_stages}


def resource_usage(cubin: bytes) -> dict:
    """cuobjdump's resource usage of a cubin: REG (per thread), SHARED (static), LOCAL and
    STACK (bytes per thread in local memory: register spills live there). Read from the binary,
    so it works on a cache hit too (ptxas's own -v log is printed only when ptxas runs)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([triton.knobs.nvidia.cuobjdump.path, "--dump-resource-usage",
                               f.name], check=True, capture_output=True, text=True).stdout
    return {k: int(v) for k, v in re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", text)}


def engine_launches(num_heads: int, num_kv_heads: int, head_dim: int, dtype=torch.bfloat16,
                    capability: tuple[int, int] = (9, 0), max_model_len: int = 2048,
                    max_num_seqs: int = 64) -> dict:
    """Every launch one layer of the engine makes on a GPU of that capability, by step shape,
    as recorded calls (the engine's defaults: max_model_len 2048, max_num_seqs 64)."""
    meta = dict(device="meta", dtype=dtype)
    bs, blocks = 16, max_num_seqs * max_model_len // 16
    k_cache = torch.empty(blocks, bs, num_kv_heads, head_dim, **meta)
    idx = dict(device="meta", dtype=torch.int64)
    tables = torch.empty(max_num_seqs, max_model_len // bs, **idx)
    seq_lens, qsl = torch.empty(max_num_seqs, **idx), torch.empty(max_num_seqs + 1, **idx)
    scale = head_dim ** -0.5

    def q(n):
        return torch.empty(n, num_heads, head_dim, **meta)

    kv = torch.empty(2048, num_kv_heads, head_dim, **meta)
    scratch = pa.DecodeScratch.allocate(max_num_seqs, num_heads, head_dim, max_model_len,
                                        "meta", partition_size=512)
    return {
        "write_kv": record_launches(wk.write_kv, kv, kv, k_cache, k_cache,
                                    torch.empty(2048, **idx)),
        "prefill (block_m 128)": record_launches(
            fa.flash_attention, q(2048), k_cache, k_cache, qsl, seq_lens, tables, 2048, scale,
            on_gpu=True, capability=capability),
        "chunk <= 64 (block_m 64)": record_launches(
            fa.flash_attention, q(256), k_cache, k_cache, qsl, seq_lens, tables, 64, scale,
            on_gpu=True, capability=capability),
        "decode + reduce": record_launches(
            pa.paged_decode_attention, q(max_num_seqs), k_cache, k_cache, seq_lens, tables,
            max_model_len, scale, scratch=scratch, on_gpu=True),
    }


def compile_all(archs=(90, 80), dtypes=(torch.bfloat16,), models=MODELS) -> list[dict]:
    rows = []
    for arch in archs:
        for dtype in dtypes:
            for model, h, hkv, d in models:
                cap = (arch // 10, arch % 10)
                for step, calls in engine_launches(h, hkv, d, dtype, cap).items():
                    for kernel, _grid, args, kwargs in calls:
                        r = compile_launch(kernel, args, kwargs, arch)
                        rows.append({"arch": f"sm_{arch}", "dtype": _TYPES[dtype],
                                     "model": model, "step": step,
                                     "kernel": kernel.__name__.strip("_"), **r,
                                     "smem_limit": SHARED_MEM_LIMIT[arch]})
    return rows


def table(rows: list[dict]) -> str:
    lines = [f"{'arch':<7}{'dtype':<6}{'model':<14}{'step':<26}{'kernel':<26}{'warps':>6}"
             f"{'stages':>7}{'regs':>6}{'local B':>8}{'smem KB':>9}"]
    for r in rows:
        lines.append(f"{r['arch']:<7}{r['dtype']:<6}{r['model']:<14}{r['step']:<26}"
                     f"{r['kernel']:<26}{r['num_warps']:>6}{r['num_stages']:>7}"
                     f"{r['regs']:>6}{r['local_bytes']:>8}"
                     f"{r['smem'] / 1024:>9.1f}")
    return "\n".join(lines)


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", default="90,80", help="compute capabilities, e.g. 90,80")
    ap.add_argument("--dtype", default="bfloat16", help="comma-separated: bfloat16,float32")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args(argv)
    rows = compile_all(tuple(int(a) for a in args.arch.split(",")),
                       tuple(getattr(torch, d) for d in args.dtype.split(",")))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    print(table(rows))
    return rows


if __name__ == "__main__":
    main()
