#!/usr/bin/env bash
# One-shot proof of the MPS shim on an Apple Silicon Mac (macOS 13 or later), the check that
# no Linux machine can make. From this checkout it
#   1. builds the flux-dnn wheel (the MPS shim is part of the default macOS build) and
#      installs it with the test extra's needs, plus MLX (>= 0.32) when pip can get it;
#   2. runs the SDK-free decisions' unit test (tests/test_mps_logic.py);
#   3. runs the ABI suite on the shim's dylib (tests/abi; FLUX_DNN_MPS_SHIM points at it);
#   4. runs the conformance suite's accelerator part, whose Metal backends are the mps shim
#      with PyTorch MPS tensors and with MLX arrays (tests/conformance -m accelerator);
#   5. benchmarks the shim against torch.nn.functional.conv2d on MPS (benchmarks/bench_mps.py);
# and prints one table of what passed. Logs go to $OUT (default ./mac_check_logs).
#
#   bash scripts/mac_check.sh [--full-bench]
set -uo pipefail

cd "$(dirname "$0")/.."
LOGS="${OUT:-mac_check_logs}"
mkdir -p "$LOGS"
PY="${PYTHON:-python3}"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(sysctl -n hw.ncpu 2>/dev/null || echo 4)}"
export PIP_DISABLE_PIP_VERSION_CHECK=1
bench_args=(--quick --budget-s 300)
[ "${1:-}" = "--full-bench" ] && bench_args=()
declare -a table
record() { table+=("$(printf '%-34s %-6s %s' "$1" "$2" "$3")"); }
step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }
last_line() { grep -E "passed|failed|error" "$1" | tail -1; }
# macOS has no timeout(1) unless coreutils is installed (gtimeout); run without a limit then.
with_timeout() {
  local seconds=$1
  shift
  if command -v timeout > /dev/null; then timeout "$seconds" "$@"
  elif command -v gtimeout > /dev/null; then gtimeout "$seconds" "$@"
  else "$@"; fi
}

step "machine"
if [ "$(uname -s)" != "Darwin" ] || [ "$(uname -m)" != "arm64" ]; then
  echo "this is $(uname -s) $(uname -m): scripts/mac_check.sh needs an Apple Silicon Mac"
  exit 2
fi
sw_vers
sysctl -n machdep.cpu.brand_string
"$PY" --version

step "build the flux-dnn wheel and install it"
rm -rf "$LOGS/wheels"
if "$PY" -m pip wheel --no-deps -w "$LOGS/wheels" . > "$LOGS/build.log" 2>&1; then
  record "build wheel (default)" ok "$(ls "$LOGS"/wheels/*.whl | xargs -n1 basename)"
else
  # The CBLAS shim's macOS build is another issue's; the MPS shim must not wait for it.
  echo "the default build failed (tail below); retrying without the CBLAS shim"
  tail -20 "$LOGS/build.log"
  if "$PY" -m pip wheel --no-deps -w "$LOGS/wheels" . -C cmake.define.FLUX_DNN_BUILD_BLAS=OFF \
    > "$LOGS/build_noblas.log" 2>&1; then
    record "build wheel (default)" FAIL "see build.log; built with FLUX_DNN_BUILD_BLAS=OFF instead"
  else
    tail -40 "$LOGS/build_noblas.log"
    record "build wheel" FAIL "see build.log, build_noblas.log"
    printf '%s\n' "${table[@]}"
    exit 1
  fi
fi
"$PY" -m pip install --force-reinstall --no-deps "$LOGS"/wheels/flux_dnn-*.whl > "$LOGS/install.log" 2>&1
"$PY" -m pip install numpy pytest ml_dtypes "torch>=2.9" >> "$LOGS/install.log" 2>&1
if "$PY" -m pip install "mlx>=0.32" >> "$LOGS/install.log" 2>&1; then mlx="mlx installed"; else mlx="mlx NOT installed"; fi
dylib=$(cd /tmp && "$PY" -c "import flux_dnn, pathlib; print(pathlib.Path(flux_dnn.__file__).with_name('libflux_dnn_mps.dylib'))")
if [ -f "$dylib" ]; then record "MPS shim in the wheel" ok "$dylib"; else record "MPS shim in the wheel" FAIL "no $dylib"; fi
(cd /tmp && "$PY" -m flux_dnn info) > "$LOGS/info.txt" 2>&1
cat "$LOGS/info.txt"
(cd /tmp && "$PY" - <<'PY') > "$LOGS/versions.txt" 2>&1
import importlib
for m in ("numpy", "torch", "mlx.core", "flux_dnn"):
    try:
        mod = importlib.import_module(m)
        print(f"{m:10} {getattr(mod, '__version__', '?')}")
    except Exception as exc:
        print(f"{m:10} MISSING: {exc}")
import torch
print("torch MPS available:", torch.backends.mps.is_available())
PY
cat "$LOGS/versions.txt"
record "environment" info "$mlx; $(grep -c . "$LOGS/versions.txt") lines in versions.txt"

run_pytest() {  # name, log, pytest arguments...
  local name=$1 log=$2
  shift 2
  FLUX_DNN_MPS_SHIM="$dylib" with_timeout 1800 "$PY" -m pytest -q -p no:cacheprovider -o addopts="" -rfs "$@" \
    > "$LOGS/$log" 2>&1
  local rc=$?
  grep -E "^(FAILED|ERROR)" "$LOGS/$log" | head -20
  if [ $rc -eq 0 ]; then record "$name" ok "$(last_line "$LOGS/$log")"; else record "$name" FAIL "$(last_line "$LOGS/$log")"; fi
}

step "SDK-free decisions (unit test)"
run_pytest "decisions unit test" logic.txt tests/test_mps_logic.py

step "ABI suite on the dylib"
run_pytest "ABI suite (tests/abi)" abi.txt tests/abi

step "conformance: PyTorch MPS tensors and MLX arrays"
run_pytest "conformance -m accelerator" conformance.txt -m accelerator tests/conformance
# How many cases ran on the Metal backends (the suite names them mps-torch, mps-mlx).
FLUX_DNN_MPS_SHIM="$dylib" with_timeout 600 "$PY" -m pytest -q -p no:cacheprovider -o addopts="" -m accelerator \
  tests/conformance -k "mps" --co -q > "$LOGS/conformance_mps_cases.txt" 2>&1
record "conformance cases on mps" info "$(grep -c '::' "$LOGS/conformance_mps_cases.txt") collected (mps-torch, mps-mlx)"

step "benchmark against torch.nn.functional.conv2d on MPS"
if with_timeout 1200 "$PY" benchmarks/bench_mps.py ${bench_args[@]+"${bench_args[@]}"} --json "$LOGS/bench.json" > "$LOGS/bench.txt" 2>&1; then
  record "benchmark (bench_mps.py)" ok "$(grep -E '^all ' "$LOGS/bench.txt" | awk '{print "geomean torch/flux " $3 " over " $2 " cases"}')"
else
  tail -20 "$LOGS/bench.txt"
  record "benchmark (bench_mps.py)" FAIL "see bench.txt"
fi
sed -n '/^summary:/,$p' "$LOGS/bench.txt"

step "summary ($(sw_vers -productVersion), $(sysctl -n machdep.cpu.brand_string))"
printf '%-34s %-6s %s\n' "check" "result" "detail"
printf '%s\n' "${table[@]}"
! printf '%s\n' "${table[@]}" | grep -q " FAIL "
