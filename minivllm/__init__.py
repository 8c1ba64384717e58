"""minivllm: a small, readable LLM serving engine that runs the same way vLLM does
(vLLM twin: vllm/__init__.py, which exports the same names, lazily as here).

    from minivllm import LLM, SamplingParams

The packages, in the order one request's data passes through them (each names its vLLM twin):

    llm.py, entrypoints/   the front ends: LLM.generate, the `minivllm` CLI, the OpenAI server
    config/                VllmConfig and its parts; EngineArgs (engine/) makes one from kwargs
    engine/                LLMEngine.step: schedule -> execute_model -> update -> outputs
    core/                  Scheduler (schedule, update_from_output), BlockManager, prefix cache
    worker/                ModelRunner: flat batch -> model -> sampled tokens; CUDA graphs
    models/                Llama / Qwen2 / Qwen3, and the GGUF / Hugging Face loaders
    attention/             paged attention: metadata, the CPU fast path, torch and Triton
    sample/                logits processors and the Sampler
    spec_decode/ lora/ quantization/ structured_output/ distributed/   the add-ons
    benchmarks/            every `minivllm bench X`, and the workloads lessons share
    platforms.py           CUDA or not, and so Triton compiled or interpreted

The public names (MODULE_ATTRS) are imported on first use, not here, as vLLM's are: `import
minivllm.core.scheduler` runs this file first, and the scheduler needs neither torch (about 3 s
to import) nor the engine (tests/test_imports.py checks both).
Left out, compared with vLLM: its plugin and platform registries; `minivllm.workloads` is ours
(a short import path for the lessons).
"""

import typing

# name -> "module:attribute", imported by __getattr__ the first time the name is asked for.
MODULE_ATTRS = {
    "LLM": "minivllm.llm:LLM",
    "LLMEngine": "minivllm.engine.llm_engine:LLMEngine",
    "EngineArgs": "minivllm.engine.arg_utils:EngineArgs",
    "SamplingParams": "minivllm.sampling_params:SamplingParams",
    "RequestOutput": "minivllm.outputs:RequestOutput",
    "CompletionOutput": "minivllm.outputs:CompletionOutput",
    "LoRARequest": "minivllm.lora.request:LoRARequest",
    "BeamSearchParams": "minivllm.beam_search:BeamSearchParams",
}

if typing.TYPE_CHECKING:                 # what a type checker and an editor see
    from minivllm.beam_search import BeamSearchParams
    from minivllm.engine.arg_utils import EngineArgs
    from minivllm.engine.llm_engine import LLMEngine
    from minivllm.llm import LLM
    from minivllm.lora.request import LoRARequest
    from minivllm.outputs import CompletionOutput, RequestOutput
    from minivllm.sampling_params import SamplingParams


def __getattr__(name: str) -> typing.Any:
    """`minivllm.LLM`, `from minivllm import LLM`: the module holding it, imported now."""
    if name not in MODULE_ATTRS:
        raise AttributeError(f"module 'minivllm' has no attribute {name!r}")
    from importlib import import_module

    module, attr = MODULE_ATTRS[name].split(":")
    return getattr(import_module(module), attr)


__all__ = list(MODULE_ATTRS)
