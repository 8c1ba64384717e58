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

Left out, compared with vLLM: its Platform classes for ROCm, TPU, XPU, CPU and its plugins.
"""

import os

import torch

# The one place TRITON_INTERPRET is decided, on a machine without CUDA.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
