#!/usr/bin/env bash
# make gpu: the GPU tier, run on a host with an NVIDIA GPU (CI has none, so there these tests skip). Every test
# marked gpu; a skip fails it (testing/skips.py with RIGSTACK_STRICT_SKIPS=all: here every one has its hardware).
#   - tests/kernels (torch and triton only): the SM8x kernels, 0011's collectives as processes on one GPU, 0013's
#     remap and gather, 0014/0019's LayerOffload on CUDA (eager, graphed, staged, direct, grouped, masked,
#     prefetching). Their files come from the importable vllm (the rig's patched package) or, where none is, from
#     the stack over the pinned package in RIGSTACK_VLLM_BASE (`python3 apply.py apply --until 0000 --out DIR`
#     makes one: DIR/vllm).
#   - the gpu tests of tests/patches, tests/preflight and tests/port import vLLM: without it they cannot run, and
#     this fails saying so, unless --kernels-only (a GPU host without vLLM, like a lent benchmark machine).
# PYTHON: the interpreter with torch (and vLLM) to use; python3 if unset.
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-python3}"
kernels_only=""
case "${1:-}" in
    "") ;;
    --kernels-only) kernels_only=1 ;;
    *) echo "scripts/gpu_tests.sh: unknown argument '$1'; the one option is --kernels-only"; exit 2 ;;
esac
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" RIGSTACK_STRICT_SKIPS=all
# One line saying why not: no torch in that interpreter, or no GPU it can see.
"$py" -c "
import importlib.util, sys
if importlib.util.find_spec('torch') is None:
    sys.exit('make gpu: $py has no torch; set PYTHON to the GPU host interpreter that has torch and triton')
import torch
if not torch.cuda.is_available():
    sys.exit('make gpu: $py sees no CUDA GPU (torch.cuda.is_available() is False); run it on a GPU host')
"
has_vllm=$("$py" -c "import importlib.util; print(int(importlib.util.find_spec('vllm') is not None))")
if [ "$has_vllm" = 0 ]; then
    if [ -z "${RIGSTACK_VLLM_BASE:-}" ]; then
        echo "make gpu: $py imports no vllm and RIGSTACK_VLLM_BASE is unset; point it at the pinned package" \
             "(python3 apply.py apply --until 0000 --out DIR; RIGSTACK_VLLM_BASE=DIR/vllm)"
        exit 1
    fi
    export RIGSTACK_SM8X_SOURCE=patches
fi
# Its own session: Triton's kernels compile per process, and the other folders' conftests import vLLM.
"$py" -m pytest -c /dev/null -o "markers=gpu: needs a CUDA GPU" --confcutdir=tests/kernels -p testing.skips -p no:cacheprovider \
    -m gpu tests/kernels \
    -q -rs --durations=5
if [ "$has_vllm" = 1 ]; then
    "$py" -m pytest -p testing.skips -p no:cacheprovider -m gpu tests/patches tests/preflight tests/port -q -rs
elif [ -z "$kernels_only" ]; then
    echo "make gpu: the gpu tests of tests/patches, tests/preflight and tests/port import vLLM, which $py cannot;" \
         "install the rig's patched vLLM, or pass --kernels-only to run the kernel tier alone"
    exit 1
fi
