#!/usr/bin/env bash
# One-shot check of the cuDNN shim on a lent NVIDIA GPU machine (no network). Its image has
# CUDA 13 (nvcc), cmake, pybind11, scikit-build-core, numpy, pytest, cupy-cuda13x,
# nvidia-cudnn-cu13 and torch (cu130); it lacks the oneDNN wheels, so the core is built
# without the oneDNN shim. Builds and installs flux_dnn and flux-dnn-cuda13 from this
# checkout, runs the no-GPU and GPU conformance tests on CuPy arrays and torch CUDA tensors,
# runs the GPU benchmark, and prints a short table last. Aim: under 6 minutes.
#
#   bash scripts/gpu_check.sh            # logs also go to $OUT (or ./gpu_check_logs)
set -uo pipefail

cd "$(dirname "$0")/.."
LOGS="${OUT:-gpu_check_logs}"
mkdir -p "$LOGS"
PY="${PYTHON:-python3}"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1
status=0
step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }

step "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || status=1
nvcc --version | tail -1
"$PY" - <<'PY'
import importlib
for m in ("numpy", "pytest", "torch", "cupy", "scikit_build_core", "pybind11", "nvidia.cudnn"):
    try:
        mod = importlib.import_module(m)
        print(f"{m:18} {getattr(mod, '__version__', '') or list(getattr(mod, '__path__', ['?']))[0]}")
    except Exception as exc:
        print(f"{m:18} MISSING: {exc}")
PY

step "build and install flux_dnn (core only: no oneDNN wheel here)"
# (Warnings as errors are CI's job; here a new compiler warning must not cost the GPU run.)
"$PY" -m pip install --no-build-isolation --no-deps -v . \
  -C cmake.define.FLUX_DNN_BUILD_ONEDNN=OFF \
  > "$LOGS/build_core.log" 2>&1 || { tail -40 "$LOGS/build_core.log"; echo "core build FAILED"; exit 1; }
echo "ok"

step "build and install flux-dnn-cuda13"
"$PY" -m pip install --no-build-isolation --no-deps -v ./packaging/flux-dnn-cuda13 \
  > "$LOGS/build_cuda.log" 2>&1 || { tail -40 "$LOGS/build_cuda.log"; echo "cuda wheel build FAILED"; exit 1; }
echo "ok"

step "python -m flux_dnn info"
(cd /tmp && "$PY" -m flux_dnn info) 2>&1 | tee "$LOGS/info.txt"

step "tests: ABI, discovery, GPU conformance (every CUDA array library: torch, CuPy, JAX)"
# Run from the repo root against the installed packages (the tests import flux_dnn). The
# conformance suite's GPU part is its backends on devices other than the CPU (-m accelerator).
timeout 120 "$PY" -m pytest -q -p no:cacheprovider -o addopts="" -W default -rfs \
  --junitxml="$LOGS/pytest.xml" \
  tests/abi tests/test_cudnn.py \
  > "$LOGS/pytest.txt" 2>&1
test_rc=$?
timeout 240 "$PY" -m pytest -q -p no:cacheprovider -o addopts="" -W default -rfs \
  --junitxml="$LOGS/pytest_conformance.xml" -m accelerator \
  tests/conformance \
  >> "$LOGS/pytest.txt" 2>&1
test_rc=$((test_rc | $?))
grep -E "^(FAILED|ERROR)" "$LOGS/pytest.txt" | head -30
tail -3 "$LOGS/pytest.txt"
[ $test_rc -eq 0 ] || status=1

step "benchmark (quick)"
timeout 130 "$PY" benchmarks/bench_cuda.py --quick --budget-s 90 --json "$LOGS/bench.json" \
  > "$LOGS/bench.txt" 2>&1
bench_rc=$?
[ $bench_rc -eq 0 ] || { tail -20 "$LOGS/bench.txt"; status=1; }

step "summary"
grep -E "^[0-9]+ (passed|failed)|passed|failed" "$LOGS/pytest.txt" | tail -1
sed -n '/^summary:/,$p' "$LOGS/bench.txt"
exit $status
