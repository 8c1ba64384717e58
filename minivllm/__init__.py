"""minivllm: a small, readable LLM serving engine that runs the same way vLLM does.

    from minivllm import LLM, SamplingParams
"""

from minivllm.engine import LLMEngine
from minivllm.llm import LLM
from minivllm.outputs import CompletionOutput, RequestOutput
from minivllm.sampling_params import SamplingParams

__all__ = ["LLM", "LLMEngine", "SamplingParams", "RequestOutput", "CompletionOutput"]
