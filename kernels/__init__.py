"""kernels: the Triton backend of minivllm's attention, one mechanism per file.

    write_kv.py          K/V of this step's tokens -> their slots in the paged cache
    flash_attention.py   tiled online-softmax attention over the paged cache (prefill, chunks)
    paged_attention.py   decode attention split along the context (flash-decoding)
    backend.py           the engine's entry point: write, then pick the attention kernel
    paged_batch.py       random paged batches for tests, benchmarks and lessons
    bench.py             the GPU benchmark (`python -m kernels.bench`)

Each kernel file carries its torch reference, a test against it and a benchmark, and runs on
its own: `python -m kernels.flash_attention`. The engine picks this backend on CUDA (bf16/fp16)
and the torch reference in minivllm/attention.py on CPU; `LLM(..., attention_backend="triton")`
forces it anywhere.

Without CUDA, Triton can only run through its interpreter (TRITON_INTERPRET=1: every program
runs as numpy operations, about a millisecond each), and Triton reads that switch when a kernel
is *defined*. So importing this package on a machine without CUDA turns the interpreter on,
before any @triton.jit in its modules is executed (minivllm/__init__.py does the same).

This file must stay cheap and must never raise: transformers probes for an unrelated PyPI
package that is also called `kernels` by importing it, so it imports this one too.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
