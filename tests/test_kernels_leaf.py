"""kernels/ is a leaf: it imports nothing from minivllm (the engine depends on the kernels,
never the other way round; the adapter is minivllm/attention/triton_attention.py)."""

import ast
from pathlib import Path

KERNELS = Path(__file__).resolve().parents[1] / "kernels"


def test_kernels_import_nothing_from_minivllm():
    files = sorted(KERNELS.glob("*.py"))
    assert len(files) >= 5, files
    offenders = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.name}:{node.lineno} {n}" for n in names
                          if n == "minivllm" or n.startswith("minivllm.")]
    assert not offenders, f"kernels/ must not import minivllm: {offenders}"
    # The text too: no `importlib.import_module("minivllm...")` or string-built import.
    assert not [p.name for p in files if "import_module(\"minivllm" in p.read_text()]
