"""kernels: minivllm's Triton kernels, one mechanism per file. A leaf: nothing here imports
minivllm (the engine's adapter, AttentionMetadata -> kernel arguments, is
minivllm/attention/triton_attention.py).

    write_kv.py          K/V of this step's tokens -> their slots in the paged cache
    flash_attention.py   tiled online-softmax attention over the paged cache (prefill, chunks)
    paged_attention.py   decode attention split along the context (flash-decoding)
    paged_batch.py       random paged batches for tests, benchmarks and lessons
    cpu_attention.py     the torch backend's fast path: plain torch ops, no Triton, no padding
    bench.py             the GPU benchmark (`python -m kernels.bench`)

Each kernel file carries its torch reference, a test against it and a benchmark, and runs on
its own: `python -m kernels.flash_attention` on a GPU, `TRITON_INTERPRET=1 python -m
kernels.flash_attention` on a CPU. Without CUDA, Triton runs only through its interpreter
(every program runs as numpy operations, about a millisecond each), and Triton reads that
switch when a kernel is *defined*. One place decides it: minivllm/platforms.py, on import
(the engine's modules import it before kernels/; a lesson or test importing kernels/ does too).

This file must stay side-effect free and must never raise: transformers probes for an unrelated
PyPI package that is also called `kernels` by importing it, so it imports this one too.
"""
