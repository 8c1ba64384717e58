"""Every kernel compiled ahead of time for sm_90 (H100) and sm_80 (A100), on this CPU.

No GPU has to be here: Triton compiles for a target (kernels/aot.py), and its wheel ships
ptxas. What is compiled is what the engine launches (the launchers are called with meta tensors
and their kernels recorded) in bf16 at the default model's shapes (SmolLM2: head_dim 64, GQA
9:3) and Llama-3-8B's (head_dim 128, GQA 32:8), for each step shape: the K/V write, a long
prefill (128-row query tiles), a short chunk (64-row tiles), a decode and its reduce. Asserted:
it compiles, shared memory fits the GPU, no register spills (no local memory). The table of
registers and shared memory is printed (pytest -s shows it).

It runs in subprocesses (one per GPU generation, in parallel), because kernels defined while
TRITON_INTERPRET=1 is on cannot be compiled. Triton's cache keeps later runs fast; a cold run
compiles 20 kernels (~50 s of CPU).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _ptxas_missing() -> str | None:
    try:
        import triton.backends.nvidia as nv
    except ImportError:
        return "Triton's NVIDIA backend is not installed"
    ptxas = Path(nv.__file__).parent / "bin" / "ptxas"
    return None if ptxas.is_file() else f"no ptxas in Triton's wheel ({ptxas})"


pytestmark = pytest.mark.skipif(_ptxas_missing() is not None, reason=str(_ptxas_missing()))


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    out = tmp_path_factory.mktemp("aot")
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_DEFAULT_FP_FUSION": "1",
           "PYTHONPATH": str(ROOT)}
    procs = {arch: subprocess.Popen(
        [sys.executable, "-m", "kernels.aot", "--arch", str(arch), "--json",
         str(out / f"sm_{arch}.json")], cwd=ROOT, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True) for arch in (90, 80)}
    rows = []
    for arch, p in procs.items():
        stdout, stderr = p.communicate(timeout=600)
        assert p.returncode == 0, f"sm_{arch} did not compile:\n{stderr[-3000:]}"
        print(f"\n{stdout}")
        rows += json.loads((out / f"sm_{arch}.json").read_text())
    return rows


def test_every_engine_launch_compiles_for_hopper_and_ampere(compiled):
    expected = {(arch, model, kernel) for arch in ("sm_90", "sm_80")
                for model in ("smollm2-135m", "llama3-8b")
                for kernel in ("write_kv_kernel", "flash_attention_kernel",
                               "paged_decode_kernel", "reduce_partitions_kernel")}
    assert {(r["arch"], r["model"], r["kernel"]) for r in compiled} == expected
    assert len(compiled) == 20          # the prefill and the chunk compile different tiles


def test_shared_memory_fits_and_nothing_spills(compiled):
    too_big = [r for r in compiled if r["smem"] > r["smem_limit"]]
    assert not too_big, f"shared memory over the limit: {too_big}"
    spills = [(r["arch"], r["model"], r["step"], r["kernel"], r["regs"], r["local_bytes"])
              for r in compiled if r["local_bytes"] > 0]
    assert not spills, f"register spills (local memory bytes per thread): {spills}"
    assert all(0 < r["regs"] <= 255 for r in compiled)
    # The K/V tiles are really staged in shared memory (software pipelining), not skipped.
    flash = [r for r in compiled if r["kernel"] == "flash_attention_kernel"]
    assert all(r["smem"] >= 16 * 1024 for r in flash), flash
