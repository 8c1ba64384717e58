"""Import hygiene: our top-level `kernels` package shares its name with an unrelated PyPI
package that transformers probes for by importing it, and that probe must stay harmless; the
scheduler imports without torch; `import minivllm` is lazy; minivllm.platforms decides
Triton's interpreter switch before kernels/ defines a kernel."""

import os
import subprocess
import sys


def test_transformers_imports_cleanly_after_torch_and_triton():
    code = ("import torch, triton.language, transformers; "
            "from transformers import LlamaConfig; "
            "from transformers.utils import import_utils as u; "
            "assert not u.is_kernels_available(); print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_importing_kernels_is_cheap_and_does_not_import_triton():
    code = "import sys, kernels; print('triton' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr[-2000:]


def fresh(code: str, **env: str) -> str:
    """What `code` prints in a new Python process (nothing imported yet), TRITON_INTERPRET
    unset unless given: this process has set it (conftest.py imports minivllm.platforms)."""
    environ = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | env
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=environ)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def test_the_scheduler_imports_neither_torch_nor_the_engine():
    """Scheduling is plain Python (minivllm/core/__init__.py): importing it, V0's scheduler and
    the KV sizes (the pool tensors are the worker's) costs no torch (about 3 s) and no engine,
    so a test or the simulator can drive it on its own."""
    code = ("import sys, minivllm.core.scheduler, minivllm.core.block_manager, "
            "minivllm.core.kv_cache, minivllm.core.v0.scheduler, minivllm.sampling_params; "
            "print(sorted({'torch', 'minivllm.engine.llm_engine'} & set(sys.modules)))")
    assert fresh(code) == "[]"


def test_import_minivllm_is_lazy_and_its_names_resolve():
    code = ("import sys, minivllm; lazy = 'torch' not in sys.modules; "
            "from minivllm import (LLM, CompletionOutput, LLMEngine, LoRARequest, "
            "RequestOutput, SamplingParams); "
            "print(lazy, minivllm.LLM is LLM, LLM.__module__, LLMEngine.__module__, "
            "sorted(minivllm.__all__) == sorted(minivllm.MODULE_ATTRS), 'torch' in sys.modules)")
    assert fresh(code) == "True True minivllm.llm minivllm.engine.llm_engine True True"
    code = "import minivllm\ntry:\n    minivllm.Nope\nexcept AttributeError as e:\n    print(e)"
    assert fresh(code) == "module 'minivllm' has no attribute 'Nope'"


def test_platforms_switches_the_interpreter_on_exactly_without_cuda():
    """kernels/ defined after minivllm.platforms: interpreted without CUDA, compiled with it;
    an explicit TRITON_INTERPRET=0 (kernels/aot.py's) wins."""
    code = ("import minivllm.platforms, kernels.flash_attention as fa, torch, triton; "
            "print(isinstance(fa.load_kv_tile, triton.runtime.JITFunction), "
            "torch.cuda.is_available())")
    compiled, cuda = fresh(code).split()
    assert compiled == cuda
    assert fresh(code, TRITON_INTERPRET="0").split()[0] == "True"
