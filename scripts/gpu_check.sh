#!/usr/bin/env bash
# Every GPU test and the GPU benchmark, in one go, on a machine with a CUDA GPU.
#
#   scripts/gpu_check.sh                       # python from PATH (torch, triton, transformers,
#                                              # numpy, pytest installed); no network needed
#   PYTHON="uv run python" scripts/gpu_check.sh
#   BENCH_ARGS="kernels" scripts/gpu_check.sh  # skip the end-to-end part (it writes a 16 GB
#                                              # random Llama-3-8B checkpoint to $TMPDIR)
#
# Why a script: the GPU tests are skipped in CI (no GPU there), so this is the one command that
# proves the kernels on real hardware and prints the numbers docs/benchmarks.md may quote.
# Results also land in build/gpu_check/ (the test log and bench.json).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
OUT=build/gpu_check
mkdir -p "$OUT"

$PYTHON -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device')"

# 1. Correctness on the GPU: the marked GPU tests, then the interpreter-sized kernel tests
#    (compiled for the GPU this time). The engine tests that need the packaged SmolLM2 skip
#    themselves where it is not installed.
status=0
$PYTHON -m pytest -p no:cacheprovider -q -rs tests/test_gpu.py tests/test_kernels.py \
    2>&1 | tee "$OUT/tests.log" || status=1

# 2. Speed: kernels against SDPA and the roofline, then the engine against transformers.
$PYTHON -m kernels.bench ${BENCH_ARGS:-all} --json "$OUT/bench.json" 2>&1 \
    | tee "$OUT/bench.log" || status=1

echo "gpu_check: tests $(tail -1 "$OUT/tests.log"); results in $OUT/"
exit $status
