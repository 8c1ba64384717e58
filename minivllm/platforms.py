"""The platform, decided once: with CUDA or without, and so whether Triton runs compiled or
through its interpreter (vLLM twin: vllm/platforms/, `current_platform`; whether Triton is
usable at all is vllm/triton_utils/importing.py).

Without CUDA, Triton runs only through its interpreter (every program as numpy operations,
about a millisecond each), and Triton reads the TRITON_INTERPRET switch when a kernel is
*defined* (`@triton.jit`, so when a kernels/ file is imported), whoever imported Triton or torch
before. So every module that imports kernels/ imports this one first, and a lesson or test that
imports kernels/ itself does the same:

    import minivllm.platforms  # noqa: F401  (first: TRITON_INTERPRET before kernels/)

An explicit TRITON_INTERPRET wins (kernels/aot.py compiles for a GPU from a CPU with it at 0).
kernels/ never sets it: it imports nothing from minivllm. `import minivllm` does not either:
the package's top level imports no torch (minivllm/__init__.py).

On a CPU, torch's kernels run on a team of OpenMP threads, one team for each thread that runs
them; release_openmp_threads hands a thread's team back when it stops computing (below).

Left out, compared with vLLM: its Platform classes for ROCm, TPU, XPU, CPU and its plugins.
"""

import ctypes
import functools
import os

import torch

# The one place TRITON_INTERPRET is decided, on a machine without CUDA.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@functools.cache
def _openmp_runtime():
    """GNU's OpenMP library as torch loaded it (Linux wheels), or None. LLVM's and Intel's
    runtimes (macOS, conda's MKL builds) sleep by a timer of their own: left alone."""
    try:
        with open("/proc/self/maps") as maps:            # Linux; elsewhere: None
            paths = {line.split()[-1] for line in maps if "/lib" in line}
    except OSError:
        return None
    for path in sorted(paths):
        if os.path.basename(path).startswith("libgomp"):
            lib = ctypes.CDLL(path)
            if hasattr(lib, "omp_pause_resource_all"):   # OpenMP 5.0
                return lib
    return None


def release_openmp_threads() -> bool:
    """Hand the calling thread's OpenMP team back (omp_pause_resource_all, soft). Each thread
    that runs torch's CPU kernels keeps a team of torch.get_num_threads() - 1 workers; with more
    such workers alive than cores, libgomp stops spinning between parallel regions and puts
    them to sleep after every one, about a thousand a decode step. The engine built on the main
    thread and stepped on AsyncLLMEngine's made two teams on two cores: each step ran 35-40%
    slower there than on the main thread (docs/benchmarks.md). vLLM steps on the core process's
    main thread alone. A team comes back, one thread start, the next time its thread computes.
    True if one was handed back (GNU OpenMP found, more than one thread, not inside a team)."""
    lib = _openmp_runtime()
    if lib is None or torch.get_num_threads() < 2:
        return False
    return lib.omp_pause_resource_all(1) == 0            # omp_pause_soft
