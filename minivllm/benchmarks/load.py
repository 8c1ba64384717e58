"""`minivllm bench load`: how long the packaged model takes to load, first and cached.

No vLLM twin (vLLM logs its load time; it has no benchmark for it). Here the first load
converts the GGUF file the package ships into a cache directory, and every later load reads
that cache, so the two numbers say what the conversion costs once and what a start costs after.

    uv run minivllm bench load

Each load runs in a fresh process (an import or a warm allocator in this one would hide part of
the cost), with MINIVLLM_CACHE pointing at an empty temporary directory. Leaves out Hugging Face
checkpoints (they load without a conversion).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    """No flags of its own: it always loads the packaged model."""


def run(args: argparse.Namespace) -> None:
    """Load the packaged model twice in fresh processes: into an empty cache, then cached."""
    code = ("import time; t = time.perf_counter(); from minivllm import LLM; llm = LLM(); "
            "print(f'{time.perf_counter() - t:.2f}')")
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "MINIVLLM_CACHE": cache}
        env.pop("PYTHONDONTWRITEBYTECODE", None)     # the second start finds .pyc, as a user's
        times = [float(subprocess.run([sys.executable, "-c", code], env=env, check=True,
                                      capture_output=True, text=True).stdout.split()[-1])
                 for _ in range(2)]
    print(f"default model load, first (GGUF -> cache): {times[0]:6.2f} s")
    print(f"default model load, cached:                {times[1]:6.2f} s")
