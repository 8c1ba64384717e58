#!/usr/bin/env bash
# The GPU checks, in steps that each finish well inside 10 minutes, one step per command:
#
#   scripts/gpu_check.sh tests        # GPU tests + the kernel tests compiled for the GPU (~1 min on an H200)
#   scripts/gpu_check.sh kernels      # kernel benchmark: decode GB/s, prefill TFLOP/s (~2 min)
#   scripts/gpu_check.sh e2e-small    # engine vs transformers, Qwen3-0.6B shapes (~3 min)
#   scripts/gpu_check.sh e2e-8b       # engine vs transformers, Llama-3-8B shapes (~6 min)
#   scripts/gpu_check.sh graphs       # decode step eager / CUDA graphs / + compile, batch 1..64 (~2 min)
#   scripts/gpu_check.sh host         # the host's share of a step, sync vs async scheduling (~3 min)
#   scripts/gpu_check.sh all          # all of them in a row (a long session only)
#
# Needs a CUDA GPU and a Python with torch, triton, transformers, numpy and pytest; no network
# (random weights of real model shapes), no uv. PYTHON picks the interpreter (default: python,
# else python3). Results go to $OUT when it is set (a rented GPU returns only that folder),
# else to build/gpu_check: <step>.log (the full output, written as it runs, so a timeout keeps
# everything printed so far) and <step>.json; each step prints a short table last.
#
# Why a script: the GPU tests are skipped in CI (no GPU there; tests/test_aot_compile.py
# compiles the kernels for sm_90 and sm_80 instead), so this is what proves the kernels on real
# hardware and prints the numbers docs/benchmarks.md may quote.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
if [ -z "${PYTHON:-}" ]; then
    if command -v python >/dev/null 2>&1; then PYTHON=python; else PYTHON=python3; fi
fi
RESULTS=${OUT:-build/gpu_check}
mkdir -p "$RESULTS"
step=${1:-}
case "$step" in tests|kernels|e2e-small|e2e-8b|graphs|host|all) ;; *)
    echo "usage: $0 tests|kernels|e2e-small|e2e-8b|graphs|host|all   (one step per call; see the header)"
    exit 2 ;;
esac

$PYTHON -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device')" \
    || exit 1

# Run one step: its output goes to the terminal and to $RESULTS/<name>.log line by line
# (tee writes as it reads, and pipefail keeps the step's exit status).
run() {
    local name=$1; shift
    echo "== $name: $*" | tee "$RESULTS/$name.log"
    "$@" 2>&1 | tee -a "$RESULTS/$name.log"
}

status=0
if [ "$step" = tests ] || [ "$step" = all ]; then
    # The marked GPU tests, then the interpreter-sized kernel tests compiled for the GPU. The
    # engine tests that need the packaged SmolLM2 skip themselves where it is not installed.
    run tests $PYTHON -m pytest -p no:cacheprovider -q -rs --junitxml="$RESULTS/tests.xml" \
        tests/test_gpu.py tests/test_kernels.py tests/test_compilation.py || status=1
    echo "tests: $(grep -E '(passed|failed|error)' "$RESULTS/tests.log" | tail -1)"
fi
if [ "$step" = kernels ] || [ "$step" = all ]; then
    run kernels $PYTHON -m kernels.bench kernels --json "$RESULTS/kernels.json" || status=1
fi
if [ "$step" = e2e-small ] || [ "$step" = all ]; then
    run e2e-small $PYTHON -m minivllm.benchmarks.gpu --models qwen3-0.6b \
        --json "$RESULTS/e2e-small.json" || status=1
fi
if [ "$step" = e2e-8b ] || [ "$step" = all ]; then
    run e2e-8b $PYTHON -m minivllm.benchmarks.gpu --models llama3-8b \
        --json "$RESULTS/e2e-8b.json" || status=1
fi
if [ "$step" = graphs ] || [ "$step" = all ]; then
    run graphs $PYTHON -m minivllm.benchmarks.gpu --models qwen3-0.6b --decode-modes \
        --json "$RESULTS/graphs.json" || status=1
fi
if [ "$step" = host ] || [ "$step" = all ]; then
    # Batch-1 and batch-64 ITL with CUDA graphs, sync vs async scheduling, beside the forward
    # (the traced step): where the 20 ms a token between a 4.4 ms graph step and the 26.4 ms
    # ITL of the first H200 run goes, and what async scheduling takes off it.
    run host $PYTHON -m minivllm.benchmarks.host --models tiny qwen3-0.6b \
        --batch-sizes 1 64 --steps 64 || status=1
fi
echo "gpu_check $step: $([ $status = 0 ] && echo ok || echo FAILED); results in $RESULTS/"
exit $status
