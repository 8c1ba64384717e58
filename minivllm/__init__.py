"""minivllm: a small, readable LLM serving engine that runs the same way vLLM does.

    from minivllm import LLM, SamplingParams
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
