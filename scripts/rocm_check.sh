#!/usr/bin/env bash
# On an AMD GPU machine with PyTorch for ROCm (and CuPy for ROCm, when installed): builds
# flux_dnn and the MIOpen shim, runs the ABI and conformance suites on the real MIOpen with
# PyTorch ROCm tensors and CuPy ROCm arrays, and benchmarks against torch (one table).
# NOT RUN YET: no AMD GPU was reachable when it was written.
set -euo pipefail
cd "$(dirname "$0")/.."
export FLUX_DNN_MIOPEN_REAL=1   # the real MIOpen, not the test double
python -m pip install --quiet scikit-build-core
python -m pip install --quiet ".[test]"
python -m pip wheel --quiet --no-build-isolation --no-deps -w build/rocm-wheels ./packaging/flux-dnn-rocm \
  -C cmake.define.FLUX_DNN_WERROR=ON
python -m pip install --quiet --no-deps --force-reinstall build/rocm-wheels/flux_dnn_rocm-*.whl
python -m flux_dnn info
python -c "import torch; assert torch.version.hip and torch.cuda.is_available(), 'needs PyTorch ROCm and an AMD GPU'"
python -m pytest -q tests/abi -k miopen
python -m pytest -q tests/conformance -k "miopen and (torch or cupy)"
python benchmarks/bench_rocm.py | tee build/rocm_bench.txt
