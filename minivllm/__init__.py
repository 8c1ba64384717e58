"""minivllm: a small, readable LLM serving engine that runs the same way vLLM does
(vLLM twin: vllm/__init__.py, which exports the same names).

    from minivllm import LLM, SamplingParams

The packages, in the order one request's data passes through them (each names its vLLM twin):

    llm.py, entrypoints/   the front ends: LLM.generate, the `minivllm` CLI, the OpenAI server
    engine/                LLMEngine.step: schedule -> execute_model -> update -> outputs
    core/                  Scheduler (schedule, update_from_output), BlockManager, prefix cache
    worker/                ModelRunner: flat batch -> model -> sampled tokens; CUDA graphs
    models/                Llama / Qwen2 / Qwen3, and the GGUF / Hugging Face loaders
    attention/             paged attention: metadata, the CPU fast path, torch and Triton
    sample/                logits processors and the Sampler
    spec_decode/ lora/ quantization/ structured_output/ distributed/   the add-ons
    benchmarks/            every `minivllm bench X`, and the workloads lessons share

Left out, compared with vLLM: its plugin and platform registries; `minivllm.workloads` is ours
(a short import path for the lessons).
"""

import os

import torch

# The one place TRITON_INTERPRET is decided. Triton runs on a CPU only through its interpreter,
# and reads the switch when a kernel is defined (torch may import Triton early): so it is set
# here, before anything else, on a machine without CUDA. An explicit TRITON_INTERPRET wins.
# Lessons and tests import minivllm before kernels/ for this reason; kernels/ never sets it.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from minivllm.engine.llm_engine import LLMEngine  # noqa: E402
from minivllm.llm import LLM  # noqa: E402
from minivllm.lora.request import LoRARequest  # noqa: E402
from minivllm.outputs import CompletionOutput, RequestOutput  # noqa: E402
from minivllm.sampling_params import SamplingParams  # noqa: E402

__all__ = ["LLM", "LLMEngine", "SamplingParams", "RequestOutput", "CompletionOutput",
           "LoRARequest"]
