#!/usr/bin/env bash
# The hardware check of the MPS shim, as one command on an Apple Silicon Mac (macOS 14+, the
# wheel's deployment target) with PyTorch MPS: what no Linux machine can check. It
#   1. records the machine (macOS version, chip) and finds a Python >= 3.10 (Xcode's
#      /usr/bin/python3 is 3.9 and Homebrew's refuses pip under PEP 668), then makes a venv of
#      its own under $OUT: every install's exit code is checked;
#   2. installs numpy, pytest, ml_dtypes, torch (and MLX >= 0.32 when pip has it, recorded);
#      flux-dnn from --wheel DIR, or built here: with Homebrew's libomp for the BLAS shim
#      (OpenMP_ROOT, as cibuildwheel does), or, without Homebrew, with the BLAS shim left out
#      and recorded as such (the MPS shim does not need it);
#   3. the gate: the MPS shim loads and uses a Metal device (the device and macOS are
#      recorded, and how this torch exports sliced MPS tensors); without it every Metal test
#      would skip and pytest would say "passed", so the run stops there (exit 2);
#   4. the tests, each group within a limit, each test's outcome written as it is known
#      (scripts/gpu_check_plugin.py): the SDK-free logic, the ABI suite on the dylib, the Metal
#      conformance cases (tests/conformance/test_metal.py first, then every accelerator case);
#   5. benchmarks/bench_mps.py against torch on MPS, failed when any measurement failed or none
#      was made;
# and prints one table last. Logs go to $OUT (default ./mac_check_logs).
#
#   bash scripts/mac_check.sh                    # on the Mac: build, gate, tests, benchmark
#   bash scripts/mac_check.sh --wheel DIR        # a flux_dnn-*macosx*arm64.whl built before
#   bash scripts/mac_check.sh --no-bench | --full-bench
#   bash scripts/mac_check.sh --rehearse         # anywhere (CI): everything up to the gate in
#       PYTHON's own environment (no venv, no installs), the gate expected to fail, every
#       test group collected, not run; the table says REHEARSED
#
# Overrides: OUT, PYTHON (a Python >= 3.10), T_TESTS, T_CONFORMANCE, T_BENCH (seconds).
# Exit status: 0 all passed; 1 a step or a test failed, or nothing ran; 2 the MPS shim is not
# usable (the gate); 3 not an Apple Silicon Mac.
set -uo pipefail

cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
OUT="${OUT:-$ROOT/mac_check_logs}"
T_TESTS="${T_TESTS:-900}"
T_CONFORMANCE="${T_CONFORMANCE:-2400}"
T_BENCH="${T_BENCH:-1200}"
WHEEL_DIR="" BENCH=(--quick --budget-s 300) REHEARSE=0
while [ $# -gt 0 ]; do
  case $1 in
    --wheel) WHEEL_DIR=$(cd "$2" && pwd) || exit 1; shift 2 ;;
    --no-bench) BENCH=(); shift ;;
    --full-bench) BENCH=(--budget-s 1500); shift ;;
    --rehearse) REHEARSE=1; shift ;;
    *) echo "mac_check: unknown argument $1 (see the head of $0)" >&2; exit 1 ;;
  esac
done
BENCH_ON=$([ "${#BENCH[@]}" -gt 0 ] && echo 1 || echo 0)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
: > "$OUT/steps.tsv"
: > "$OUT/results.tsv"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1 FLUX_DNN_UNVERIFIED_WARNING=0

# record NAME RESULT DETAIL: one row of the table (RESULT: ok, FAILED, CUT, info, REHEARSED,
# collected); the table's verdict is read from these rows and the tests' outcomes.
record() {
  printf '%s\t%s\t%s\n' "$1" "$2" "$(printf '%s' "$3" | tr '\t\n' '  ' | cut -c1-160)" >> "$OUT/steps.tsv"
}
step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }
# macOS has no timeout(1) unless coreutils is installed (gtimeout); without one, no limit.
with_timeout() {
  local seconds=$1
  shift
  if command -v timeout > /dev/null; then timeout --signal=INT --kill-after=10 "$seconds" "$@"
  elif command -v gtimeout > /dev/null; then gtimeout --signal=INT --kill-after=10 "$seconds" "$@"
  else "$@"; fi
}

table() {
  "$PYBIN" - "$OUT" "$REHEARSE" << 'PY'
import collections, pathlib, sys
out, rehearse = pathlib.Path(sys.argv[1]), sys.argv[2] == "1"
steps = [l.split("\t") for l in (out / "steps.tsv").read_text().splitlines() if l.count("\t") >= 2]
groups = collections.OrderedDict()
for line in (out / "results.tsv").read_text().splitlines():
    f = line.split("\t")
    if len(f) >= 3:
        tests = groups.setdefault(f[1], {})
        if f[0] == "collected":
            tests.setdefault(f[2], "not run")
        elif f[0] == "outcome" and len(f) >= 4 and tests.get(f[2]) in (None, "not run", "passed", "skipped"):
            tests[f[2]] = f[3]
failed = any(s[1].startswith(("FAILED", "CUT")) for s in steps)
# A rehearsal proves every group collects: an empty group would be a selection gone wrong.
failed |= rehearse and any(not groups.get(g) for g in ("logic", "abi", "metal", "conformance"))
counts = {g: collections.Counter(t.values()) for g, t in groups.items()}
ran = sum(c["passed"] + c["failed"] + c["error"] for c in counts.values())
bad = sum(c["failed"] + c["error"] + (0 if rehearse else c["not run"]) for c in counts.values())
verdict = ("REHEARSED (nothing ran on a GPU)" if rehearse and not failed
           else "FAILED" if failed or bad else "NOTHING RAN" if ran == 0 else "PASSED")
print(f"mac_check: {verdict}")
print(f"{'step':34} {'result':10} detail")
for name, result, detail in (s[:3] for s in steps):
    print(f"{name[:34]:34} {result[:10]:10} {detail}")
for g, c in counts.items():
    print(f"{'tests: ' + g:34} {'':10} " + ", ".join(f"{n} {k}" for k, n in sorted(c.items())))
for g, tests in groups.items():
    for nodeid, outcome in tests.items():
        if outcome in ("failed", "error"):
            print(f"  {outcome.upper():7} {nodeid[:110]}")
sys.exit(0 if (rehearse and not failed) or not (failed or bad or ran == 0) else 1)
PY
}
finish() {  # the table is the last thing printed; its verdict is the exit status (or $1)
  step "summary"
  table | tee "$OUT/table.txt"
  local rc=${PIPESTATUS[0]}
  exit "${1:-$rc}"
}

# ---- 1. the machine and a Python >= 3.10 -----------------------------------------------------
step "machine"
PYBIN=python3
find_python() {  # a Python >= 3.10: PYTHON, else the newest found on PATH or in Homebrew
  local c
  for c in ${PYTHON:-} python3.13 python3.12 python3.11 python3.10 /opt/homebrew/bin/python3 python3; do
    command -v "$c" > /dev/null && "$c" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2> /dev/null &&
      { command -v "$c"; return 0; }
  done
  return 1
}
if ! BASE_PY=$(find_python); then
  record "python >= 3.10" FAILED "none found (Xcode's python3 is 3.9): brew install python@3.12 or set PYTHON"
  PYBIN=python3
  finish 1
fi
PYBIN=$BASE_PY
if [ $REHEARSE = 1 ]; then
  record "machine" REHEARSED "$(uname -s) $(uname -m): a rehearsal, no Mac"
elif [ "$(uname -s)" != Darwin ] || [ "$(uname -m)" != arm64 ]; then
  record "machine" FAILED "$(uname -s) $(uname -m): this check needs an Apple Silicon Mac"
  finish 3
else
  record "machine" info "macOS $(sw_vers -productVersion) ($(sw_vers -buildVersion)), $(sysctl -n machdep.cpu.brand_string)"
fi
record "python" info "$BASE_PY ($("$BASE_PY" -V 2>&1))"

# ---- 2. a venv of its own, the packages, flux-dnn ------------------------------------------
# pip_step NAME LOG ARGS...: pip in the venv; its exit code decides the row.
pip_step() {
  local name=$1 log=$2
  shift 2
  if "$PYBIN" -m pip "$@" > "$OUT/$log" 2>&1; then record "$name" ok "$(tail -1 "$OUT/$log")"
  else tail -20 "$OUT/$log"; record "$name" FAILED "see $log"; return 1; fi
}
# OpenMP for the BLAS shim: Homebrew's libomp, as cibuildwheel's macOS job has it; without
# Homebrew the BLAS CPU shim is left out (BUILD_ARGS), which the MPS shim does not need.
BUILD_ARGS=()
find_openmp() {
  local prefix=""
  if command -v brew > /dev/null; then
    prefix=$(brew --prefix libomp 2> /dev/null)
    [ -d "$prefix" ] || { brew install libomp > "$OUT/libomp.log" 2>&1 && prefix=$(brew --prefix libomp); }
  fi
  if [ -n "$prefix" ] && [ -d "$prefix" ]; then
    export OpenMP_ROOT=$prefix
    record "libomp (BLAS shim)" info "OpenMP_ROOT=$prefix"
  else
    BUILD_ARGS=(-C cmake.define.FLUX_DNN_BUILD_BLAS=OFF)
    record "libomp (BLAS shim)" info "no Homebrew libomp: the BLAS CPU shim is left out of this build"
  fi
}
install_all() {
  step "venv and packages"
  "$BASE_PY" -m venv "$OUT/venv" || { record "venv" FAILED "python -m venv $OUT/venv"; return 1; }
  PYBIN="$OUT/venv/bin/python"
  pip_step "pip upgrade" pip.log install --upgrade pip || return 1
  pip_step "numpy pytest ml_dtypes torch" deps.log install numpy pytest pytest-timeout ml_dtypes "torch>=2.9" || return 1
  if "$PYBIN" -m pip install "mlx>=0.32" > "$OUT/mlx.log" 2>&1; then record "mlx" info "installed"
  else record "mlx" info "not installed (see mlx.log): MLX cases skip"; fi
  step "flux-dnn"
  if [ -n "$WHEEL_DIR" ]; then
    pip_step "install flux-dnn (wheel)" install.log install --force-reinstall --no-deps "$WHEEL_DIR"/flux_dnn-*.whl
  else
    find_openmp
    pip_step "build and install flux-dnn" install.log install --force-reinstall --no-deps \
      ${BUILD_ARGS[@]+"${BUILD_ARGS[@]}"} "$ROOT"
  fi
}
if [ $REHEARSE = 1 ]; then
  record "venv and installs" REHEARSED "skipped: PYTHON's own environment ($("$PYBIN" -c 'import sys; print(sys.prefix)'))"
elif ! install_all; then
  finish 1
fi

# ---- 3. the gate -------------------------------------------------------------------------------
step "gate: the MPS shim on a Metal device"
(cd /tmp && "$PYBIN" - > "$OUT/gate.txt" 2>&1) << 'PY'
import platform, sys
import flux_dnn
mps = [s for s in flux_dnn.shims() if s.name == "mps"]
print("flux_dnn", flux_dnn.__version__, "macOS", platform.mac_ver()[0] or "-")
try:
    import torch
    import torch.utils.dlpack
    from flux_dnn._metal_dlpack import dltensor_of
    print("torch", torch.__version__, "MPS available:", torch.backends.mps.is_available())
    if torch.backends.mps.is_available():
        t = torch.arange(4.0, device="mps")[1:]
        dl = dltensor_of(torch.utils.dlpack.to_dlpack(t))
        print("torch export of t[1:]: byte_offset", dl.byte_offset, "(fixed)" if dl.byte_offset == 4 else "(address: refused)")
except Exception as exc:
    print("torch:", type(exc).__name__, exc)
if not mps or not mps[0].usable or mps[0].num_devices < 1:
    print("MPS shim not usable:", (mps[0].reason if mps else "not registered") or "no device")
    sys.exit(1)
print("MPS shim usable:", mps[0].device_name, "|", mps[0].vendor_version_runtime)
PY
gate_rc=$?
cat "$OUT/gate.txt"
COLLECT=()
if [ $gate_rc = 0 ]; then
  record "gate: MPS shim usable" ok "$(grep '^MPS shim usable' "$OUT/gate.txt" | cut -d: -f2-)"
  record "torch export of sliced tensors" info "$(grep -E '^torch (export|[0-9])' "$OUT/gate.txt" | tr '\n' ';')"
elif [ $REHEARSE = 1 ]; then
  record "gate: MPS shim usable" REHEARSED "$(tail -1 "$OUT/gate.txt")"
  COLLECT=(--collect-only -q)
else
  record "gate: MPS shim usable" FAILED "$(tail -1 "$OUT/gate.txt")"
  finish 2
fi

# ---- 4. the tests -------------------------------------------------------------------------------
export PYTHONPATH="$ROOT/scripts${PYTHONPATH:+:$PYTHONPATH}" FLUX_DNN_CHECK_RESULTS="$OUT/results.tsv"
dylib=$(cd /tmp && "$PYBIN" -c "import flux_dnn, pathlib; print(pathlib.Path(flux_dnn.__file__).with_name('libflux_dnn_mps.dylib'))")
# group NAME LIMIT ARGS...: one pytest run, its outcomes in results.tsv under NAME.
group() {
  local name=$1 limit=$2 rc
  shift 2
  step "tests: $name"
  FLUX_DNN_CHECK_GROUP=$name FLUX_DNN_MPS_SHIM="$dylib" with_timeout "$limit" "$PYBIN" -m pytest -p no:cacheprovider \
    -p gpu_check_plugin -o addopts="" -rfE "${COLLECT[@]}" "$@" > "$OUT/pytest_$name.txt" 2>&1
  rc=$?
  grep -E "^(FAILED|ERROR)" "$OUT/pytest_$name.txt" | head -20
  case $rc in
    0) record "tests: $name" "$([ $REHEARSE = 1 ] && echo collected || echo ok)" "$(tail -1 "$OUT/pytest_$name.txt")" ;;
    124 | 130 | 137) record "tests: $name" "CUT ${limit}s" "$(tail -1 "$OUT/pytest_$name.txt")" ;;
    *) record "tests: $name" "FAILED rc=$rc" "$(tail -1 "$OUT/pytest_$name.txt")" ;;
  esac
}
group logic "$T_TESTS" tests/test_mps_logic.py tests/test_metal_dlpack.py
group abi "$T_TESTS" -k mps tests/abi
group metal "$T_CONFORMANCE" -m accelerator tests/conformance/test_metal.py
group conformance "$T_CONFORMANCE" -m accelerator --ignore=tests/conformance/test_metal.py tests/conformance

# ---- 5. the benchmark -----------------------------------------------------------------------------
bench_verdict() {  # ok only when rows were measured and none failed
  "$PYBIN" - "$OUT/bench.json" << 'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
failed = [r for r in rows if "error" in r]
ok = [r for r in rows if "ratio" in r]
print(f"{len(ok)} measured, {len(failed)} failed" + (f": {failed[0]['error'][:80]}" if failed else ""))
sys.exit(1 if failed or not ok else 0)
PY
}
if [ $REHEARSE = 1 ] || [ "$BENCH_ON" = 0 ]; then
  record "benchmark" info "not run$([ $REHEARSE = 1 ] && echo ' (rehearsal)')"
else
  step "benchmark against torch on MPS"
  rm -f "$OUT/bench.json"
  with_timeout "$T_BENCH" "$PYBIN" benchmarks/bench_mps.py "${BENCH[@]}" --json "$OUT/bench.json" > "$OUT/bench.txt" 2>&1
  rc=$?
  sed -n '/^summary:/,$p' "$OUT/bench.txt"
  if [ $rc != 0 ] || [ ! -f "$OUT/bench.json" ]; then
    record "benchmark" "FAILED rc=$rc" "see bench.txt"
  elif verdict=$(bench_verdict); then
    record "benchmark" ok "$verdict; $(grep -E '^all ' "$OUT/bench.txt" | awk '{print "geomean torch/flux " $3}')"
  else
    record "benchmark" FAILED "$verdict"
  fi
fi
finish
