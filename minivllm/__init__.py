"""minivllm: a small, readable LLM serving engine that runs the same way vLLM does.

    from minivllm import LLM, SamplingParams
"""

import os

import torch

# Triton runs on a CPU only through its interpreter, and reads the switch when its modules are
# first imported (torch may import them early): set it before anything else happens.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from minivllm.engine import LLMEngine  # noqa: E402
from minivllm.llm import LLM  # noqa: E402
from minivllm.outputs import CompletionOutput, RequestOutput  # noqa: E402
from minivllm.sampling_params import SamplingParams  # noqa: E402

__all__ = ["LLM", "LLMEngine", "SamplingParams", "RequestOutput", "CompletionOutput"]
