"""Import hygiene: our top-level `kernels` package shares its name with an unrelated PyPI
package that transformers probes for by importing it; that probe must stay harmless."""

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
