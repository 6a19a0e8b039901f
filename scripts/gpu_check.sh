#!/usr/bin/env bash
# The hardware check of the cuDNN shim, as one command on a lent NVIDIA GPU machine.
#
# That machine (see tests/../README "GPU check") has one H200, CUDA 13, Python 3.12 with
# torch (cu130), CuPy, JAX, nvidia-cudnn-cu13, cmake, ninja, pybind11, scikit-build-core,
# numpy, pytest, pytest-timeout; no network, and no scipy-openblas32 or oneDNN wheels. It
# gives 15 minutes of GPU time in all (its start included), 10 minutes a command, and at
# most 8 result files from $OUT. So:
#   - the wheels are built beforehand, here (--build-wheels), and shipped with the checkout:
#     no GPU second is spent compiling; building there is the fallback (no CPU shims, no JAX);
#   - the first GPU call is a gate: cuDNN loaded and sees the device, or the run stops there,
#     failed (without it every GPU test would skip and pytest would say "passed");
#   - the most valuable checks run first, each step within a limit and the whole run within
#     T_TOTAL (default 290 s: the first command ends inside 5 minutes);
#   - each test's outcome is written as it is known (scripts/gpu_check_plugin.py), so a run
#     cut short still tells what failed and what never ran, and --rerun-failed DIR runs
#     exactly those on a second machine;
#   - $OUT gets at most 8 files, and the table (at most 60 lines, the verdict first) is the
#     last thing printed.
#
#   bash scripts/gpu_check.sh --build-wheels DIR   # here: the two cp3XX wheels for the run
#   bash scripts/gpu_check.sh --wheels DIR         # there: the run (first command)
#   bash scripts/gpu_check.sh --wheels DIR --rerun-failed PRIOR   # there: what failed/never ran
#   bash scripts/gpu_check.sh --wheels DIR --jax   # there, later: JAX arrays on the GPU too
#   FLUX_DNN_TEST_SEED_BASE=N bash scripts/gpu_check.sh --wheels DIR --no-bench   # new draws
#   bash scripts/gpu_check.sh --rehearse           # here (CI): the whole run up to the GPU
#   bash scripts/gpu_check.sh --table DIR          # the table of an earlier run's files
#   bash scripts/gpu_check.sh --dry-run            # is there a GPU? builds nothing
#
# Overrides: OUT (default ./gpu_check_logs), PYTHON (python3), FLUX_DNN_CUDA_ARCHS (90-real),
# T_TOTAL and T_<STEP> seconds (T_INSTALL, T_GATE, T_TESTS, T_CONFORMANCE, T_BENCH, T_JAX),
# BENCH_BUDGET_S, FLUX_DNN_TEST_SEED_BASE (another set of fixed draws).
# Exit status: 0 all passed; 1 a step failed, a test failed, or was cut short; 2 cuDNN is not
# usable (the gate); 3 no GPU here; the rehearsal: 0 when its checks pass.
set -uo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
PY="${PYTHON:-python3}"
ARCHS="${FLUX_DNN_CUDA_ARCHS:-90-real}"
REPORT="$ROOT/scripts/gpu_check_report.py"
T_TOTAL="${T_TOTAL:-290}"
T_INSTALL="${T_INSTALL:-120}" # with --wheels: seconds; building there: about 2 minutes
T_GATE="${T_GATE:-30}"
T_TESTS="${T_TESTS:-60}"
T_CONFORMANCE="${T_CONFORMANCE:-150}"
T_BENCH="${T_BENCH:-45}"
T_JAX="${T_JAX:-150}"
BENCH_BUDGET_S="${BENCH_BUDGET_S:-25}"

WHEELS="" RERUN="" JAX=0 BENCH=1 MODE=run
while [ $# -gt 0 ]; do
  case $1 in
    --wheels) WHEELS=$(cd "$2" && pwd) || exit 1; shift 2 ;;
    --rerun-failed) RERUN=$(cd "$2" && pwd) || exit 1; shift 2 ;;
    --jax) JAX=1; shift ;;
    --no-bench) BENCH=0; shift ;;
    --build-wheels) MODE=build_wheels; WHEEL_DIR=$2; shift 2 ;;
    --rehearse) MODE=rehearse; shift ;;
    --table) MODE=table; TABLE_DIR=$2; shift 2 ;;
    --dry-run) MODE=dry_run; shift ;;
    *) echo "gpu_check: unknown argument $1 (see the head of $0)" >&2; exit 1 ;;
  esac
done
REHEARSAL="${FLUX_DNN_GPU_CHECK_REHEARSAL:-0}" # set by --rehearse for its inner run

# ---- building the two wheels (here beforehand; there only as the fallback) ---------------
# The core without its CPU shims (the GPU machine has neither scipy-openblas32 nor oneDNN,
# and the check needs no CPU shim) nor the XLA FFI handler (JAX is a later step), and the
# cuDNN plug-in for the GPU's architecture only. Warnings are CI's business, not the run's.
build_wheels() {
  local dest=$1 build=${2:-$ROOT/build/gpu_check}
  mkdir -p "$dest"
  "$PY" -m pip wheel --no-build-isolation --no-deps --no-index -w "$dest" "$ROOT" \
    -C cmake.define.FLUX_DNN_BUILD_ONEDNN=OFF -C cmake.define.FLUX_DNN_BUILD_BLAS=OFF \
    -C cmake.define.FLUX_DNN_BUILD_JAX_FFI=OFF -C build-dir="$build/core" &&
    "$PY" -m pip wheel --no-build-isolation --no-deps --no-index -w "$dest" "$ROOT/packaging/flux-dnn-cuda13" \
      -C cmake.define.CMAKE_CUDA_ARCHITECTURES="$ARCHS" -C build-dir="$build/cuda"
}

if [ $MODE = build_wheels ]; then
  # scikit-build-core >= 0.11.2: the plug-in's template metadata provider (review G12).
  "$PY" -c "import scikit_build_core as s, sys; v = tuple(map(int, s.__version__.split('.')[:3])); \
sys.exit(0 if v >= (0, 11, 2) else f'scikit-build-core {s.__version__} is older than 0.11.2')" || exit 1
  rm -f "$WHEEL_DIR"/flux_dnn-*.whl "$WHEEL_DIR"/flux_dnn_cuda13-*.whl
  build_wheels "$WHEEL_DIR" && ls -l "$WHEEL_DIR"
  exit $?
fi
if [ $MODE = table ]; then
  "$PY" "$REPORT" table "$TABLE_DIR"
  exit $?
fi

# ---- the rehearsal: this script in a venv of exactly the GPU machine's packages ---------
# torch's CPU build stands in for torch cu130, a stand-in nvidia-smi lists one H200; the
# venv is kept between runs (FLUX_DNN_REHEARSAL_VENV) since its packages are 1.5 GB.
GPU_MACHINE_PACKAGES=(numpy pytest pytest-timeout pytest-xdist ml_dtypes "torch==2.13.0" cupy-cuda13x jax
  nvidia-cudnn-cu13 scikit-build-core pybind11 cmake ninja)
rehearse() {
  local venv="${FLUX_DNN_REHEARSAL_VENV:-$HOME/.cache/flux_dnn/gpu_rehearsal_venv}"
  local work rc
  work=$(mktemp -d)
  trap 'rm -rf "$work"' RETURN
  if [ ! -x "$venv/bin/python" ] || ! cmp -s <(printf '%s\n' "${GPU_MACHINE_PACKAGES[@]}") "$venv/packages.txt"; then
    rm -rf "$venv" && python3 -m venv "$venv" && "$venv/bin/python" -m pip install --quiet --upgrade pip &&
      "$venv/bin/python" -m pip install --quiet "${GPU_MACHINE_PACKAGES[@]}" &&
      printf '%s\n' "${GPU_MACHINE_PACKAGES[@]}" > "$venv/packages.txt" || return 1
  fi
  # Exactly that set: the core must build and import without the CPU shims' vendor wheels.
  if "$venv/bin/python" -m pip show scipy-openblas32 onednn-cpu-gomp onednn-devel-cpu-gomp 2>/dev/null | grep -q ^Name; then
    echo "rehearsal: the venv has a CPU vendor wheel the GPU machine lacks" >&2
    return 1
  fi
  mkdir -p "$work/bin" "$work/out" "$work/wheels"
  cat > "$work/bin/nvidia-smi" << 'SMI'
#!/bin/sh
# The rehearsal's stand-in: what the GPU machine's nvidia-smi answers (no driver behind it).
case "$*" in
  *-L*) echo "GPU 0: NVIDIA H200 (UUID: GPU-00000000-rehearsal)" ;;
  *query-gpu*) echo "NVIDIA H200, 580.159.04 (rehearsal stand-in), 143771 MiB, 9.0" ;;
  *) echo "nvidia-smi rehearsal stand-in" ;;
esac
SMI
  chmod +x "$work/bin/nvidia-smi"
  echo "rehearsal: building the wheels with the GPU machine's package set ($("$venv/bin/python" -V))"
  PYTHON="$venv/bin/python" bash "$0" --build-wheels "$work/wheels" > "$work/build.log" 2>&1 ||
    { tail -30 "$work/build.log"; return 1; }
  # The run itself, then a rerun of everything it left not run (all of it: nothing ran).
  PATH="$work/bin:$PATH" PYTHON="$venv/bin/python" OUT="$work/out" FLUX_DNN_GPU_CHECK_REHEARSAL=1 \
    bash "$0" --wheels "$work/wheels"
  rc=$?
  [ $rc = 0 ] || { echo "rehearsal: the run exited $rc"; return 1; }
  mkdir -p "$work/out2"
  PATH="$work/bin:$PATH" PYTHON="$venv/bin/python" OUT="$work/out2" FLUX_DNN_GPU_CHECK_REHEARSAL=1 \
    bash "$0" --wheels "$work/wheels" --rerun-failed "$work/out" > "$work/rerun.log" 2>&1 ||
    { tail -40 "$work/rerun.log"; return 1; }
  "$venv/bin/python" - "$work/out" "$work/out2" << 'PY' || return 1
# The rerun selected exactly what the first run collected but never ran, group by group.
import sys, importlib.util, pathlib
spec = importlib.util.spec_from_file_location("r", "scripts/gpu_check_report.py")
r = importlib.util.module_from_spec(spec); spec.loader.exec_module(r)
first, again = (r.read_results(pathlib.Path(d) / "results.tsv") for d in sys.argv[1:])
for group in ("tests", "conformance"):
    assert set(first[group]) == set(again.get(group, {})), f"rerun of {group}: {len(again.get(group, {}))} of {len(first[group])}"
print(f"rehearsal: rerun selection ok ({', '.join(f'{g} {len(again[g])}' for g in again)})")
PY
  "$venv/bin/python" "$REPORT" verify-rehearsal "$work/out"
}
if [ $MODE = rehearse ]; then
  rehearse
  exit $?
fi

# ---- the run -------------------------------------------------------------------------------
OUT="${OUT:-$ROOT/gpu_check_logs}"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK="$ROOT/build/gpu_check_work" # logs that travel back only inside logs.tar.gz
rm -rf "$WORK" && mkdir -p "$WORK"
: > "$OUT/steps.tsv"
: > "$OUT/results.tsv"
START=$(date +%s)
status=0

# What comes back (at most 8): table.txt steps.tsv results.tsv pytest_tests.txt
# pytest_conformance.txt bench.json logs.tar.gz (and pytest_jax.txt with --jax).
finish() {
  tar -czf "$OUT/logs.tar.gz" -C "$WORK" . 2> /dev/null
  "$PY" "$REPORT" table "$OUT" $([ "$REHEARSAL" = 1 ] && echo --rehearsal) > "$OUT/table.txt"
  echo
  cat "$OUT/table.txt"
}

# run_step NAME LIMIT COMMAND...: within its limit and what is left of T_TOTAL (SIGINT
# first, so pytest still reports; killed 5 s later); its time and result go to steps.tsv,
# with the last line of the file STEP_LOG (when set) as the reason of a failure.
run_step() {
  local name=$1 limit=$2 left start rc result detail=""
  shift 2
  left=$((T_TOTAL - ($(date +%s) - START) - 5))
  if [ "$left" -lt 5 ]; then
    printf '%s\tNOT RUN\t0\t%s\tno time left of T_TOTAL=%s\n' "$name" "$limit" "$T_TOTAL" >> "$OUT/steps.tsv"
    status=1
    return 124
  fi
  [ "$left" -lt "$limit" ] && limit=$left
  echo "=== $name (limit ${limit}s, $(date -u +%H:%M:%S))"
  start=$(date +%s)
  timeout --signal=INT --kill-after=5 "$limit" "$@"
  rc=$?
  case $rc in
    0) result=ok ;;
    124 | 130 | 137) result="CUT ${limit}s"; status=1 ;;
    *) result="FAILED rc=$rc"; status=1 ;;
  esac
  if [ $rc != 0 ] && [ -n "${STEP_LOG:-}" ]; then
    detail=$(grep -v '^\s*$' "$STEP_LOG" | tail -1 | tr '\t' ' ' | cut -c1-200)
  fi
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$result" "$(($(date +%s) - start))" "$limit" "$detail" >> "$OUT/steps.tsv"
  echo "--- $name: $result"
  return $rc
}

no_gpu_reason() {
  if ! command -v nvidia-smi > /dev/null; then
    echo "nvidia-smi not found (no NVIDIA driver)"
  elif ! nvidia-smi -L 2>&1 | grep -q "^GPU "; then
    echo "nvidia-smi lists no GPU: $(nvidia-smi -L 2>&1 | head -1)"
  fi
}

why=$(no_gpu_reason)
if [ -n "$why" ]; then
  echo "gpu_check: NO GPU HERE: $why. Nothing was built or checked; this script needs an NVIDIA GPU."
  printf 'machine\tNO GPU\t0\t0\t%s\n' "$why" >> "$OUT/steps.tsv"
  finish
  exit 3
fi
if [ $MODE = dry_run ]; then
  nvidia-smi -L
  echo "gpu_check: dry run: a GPU is here; nothing built"
  exit 0
fi

export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1
export FLUX_DNN_GPU_RUN=1                     # fixed per-test seeds (tests/conftest.py)
export FLUX_DNN_UNVERIFIED_WARNING=0          # the run is the verification
export XLA_PYTHON_CLIENT_PREALLOCATE=false    # JAX must not take 75% of the GPU at import
echo "gpu_check: T_TOTAL ${T_TOTAL}s; wheels: ${WHEELS:-build here ($ARCHS)}; rerun of: ${RERUN:-nothing (first run)}"

machine() {
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader
  "$PY" - << 'PY'
import importlib, platform
print("python", platform.python_version())
for m in ("numpy", "pytest", "pytest_timeout", "torch", "cupy", "jax", "scikit_build_core", "nvidia.cudnn"):
    try:
        mod = importlib.import_module(m)
        print(f"{m:18} {getattr(mod, '__version__', '') or list(getattr(mod, '__path__', ['?']))[0]}")
    except Exception as exc:
        print(f"{m:18} MISSING: {exc}")
PY
}
STEP_LOG="$WORK/machine.txt" run_step "machine" 30 bash -c "$(declare -f machine); PY='$PY' machine" \
  > "$WORK/machine.txt" 2>&1
cat "$WORK/machine.txt"

install() {
  if [ -n "$WHEELS" ]; then
    "$PY" -m pip install --no-deps --force-reinstall --no-compile "$WHEELS"/flux_dnn-*.whl "$WHEELS"/flux_dnn_cuda13-*.whl
  else
    build_wheels "$WORK/wheels" "$ROOT/build/gpu_check" &&
      "$PY" -m pip install --no-deps --force-reinstall "$WORK"/wheels/*.whl
  fi
}
if ! STEP_LOG="$WORK/install.log" run_step "install ($([ -n "$WHEELS" ] && echo wheels || echo "build $ARCHS"))" "$T_INSTALL" \
  bash -c "$(declare -f install build_wheels); PY='$PY' ROOT='$ROOT' ARCHS='$ARCHS' WHEELS='$WHEELS' WORK='$WORK' install" \
  > "$WORK/install.log" 2>&1; then
  tail -20 "$WORK/install.log"
  finish
  exit 1
fi
(cd /tmp && "$PY" -m flux_dnn info) > "$WORK/info.txt" 2>&1
cat "$WORK/info.txt"

# The gate: the first GPU call. The rehearsal has no GPU behind its nvidia-smi, so there the
# gate must fail with a driver reason, and what follows is collected, not run.
STEP_LOG="$WORK/gate.txt" run_step "gate: cuDNN usable on the GPU" "$T_GATE" \
  bash -c "cd /tmp && '$PY' '$REPORT' gate" > "$WORK/gate.txt" 2>&1
gate_rc=$?
cat "$WORK/gate.txt"
COLLECT=()
if [ "$gate_rc" != 0 ]; then
  if [ "$REHEARSAL" = 1 ]; then
    sed -i '$ s/\tFAILED rc=1\t/\trehearsed\t/' "$OUT/steps.tsv"
    status=0
    COLLECT=(--collect-only -q)
  else
    finish
    exit 2
  fi
fi

PYTEST=("$PY" -m pytest -p no:cacheprovider -p gpu_check_plugin -o addopts="" -W default -v -rfE
  --durations=15 --timeout=90 -o faulthandler_timeout=60 "${COLLECT[@]}")
export PYTHONPATH="$ROOT/scripts${PYTHONPATH:+:$PYTHONPATH}"
export FLUX_DNN_CHECK_RESULTS="$OUT/results.tsv"

# pytest_group GROUP LIMIT ARGS...: the group's tests (only those to run again, in a rerun).
pytest_group() {
  local group=$1 limit=$2 n
  shift 2
  if [ -n "$RERUN" ]; then
    n=$("$PY" "$REPORT" rerun "$group" "$RERUN" "$WORK/rerun_$group.txt")
    [ "$n" = 0 ] && { echo "--- $group: nothing to run again"; return 0; }
    export FLUX_DNN_CHECK_ONLY="$WORK/rerun_$group.txt"
  fi
  FLUX_DNN_CHECK_GROUP=$group run_step "$group" "$limit" "${PYTEST[@]}" "$@" > "$OUT/pytest_$group.txt" 2>&1
  grep -E "^(FAILED|ERROR)" "$OUT/pytest_$group.txt" | head -10
  unset FLUX_DNN_CHECK_ONLY
}

# 1. The ABI suite on the device and the shim's own tests (not the fake shims nor the
#    host-only self-tests: CI runs those).
pytest_group tests "$T_TESTS" -k "cudnn and not on_the_cpu" tests/abi tests/test_cudnn.py
# 2. Numerics on CuPy and torch arrays, most telling files first (a cut loses the matrix).
pytest_group conformance "$T_CONFORMANCE" -m accelerator -k "not jax" tests/conformance/test_accelerators.py tests/conformance/test_cuda.py \
  tests/conformance/test_numerics.py tests/conformance/test_device_allocator.py \
  tests/conformance/test_frameworks.py tests/conformance/test_known_defects.py tests/conformance/test_matrix.py
# 3. The benchmark against torch, each row written as it is measured (not in a rerun).
if [ -z "$RERUN" ] && [ $BENCH = 1 ]; then
  run_step "benchmark (quick)" "$T_BENCH" "$PY" benchmarks/bench_cuda.py --quick --budget-s "$BENCH_BUDGET_S" \
    --json "$OUT/bench.json" > "$WORK/bench.txt" 2>&1
fi
# 4. JAX arrays on the GPU (--jax): the FFI handler built there, then JAX's conformance cases.
if [ $JAX = 1 ]; then
  run_step "build JAX FFI handler" 120 "$PY" -m pip install --no-build-isolation --no-deps ./packaging/flux-dnn-jax \
    -C build-dir="$ROOT/build/gpu_check/jax" > "$WORK/build_jax.log" 2>&1 &&
    pytest_group jax "$T_JAX" -m accelerator -k jax tests/conformance
fi

for f in "$OUT"/pytest_*.txt; do
  sed -n '/slowest 15 durations/,/^$/p' "$f" | head -17 >> "$WORK/slowest.txt"
done
finish
[ "$REHEARSAL" = 1 ] && exit $status
"$PY" "$REPORT" table "$OUT" > /dev/null || status=1
exit $status
