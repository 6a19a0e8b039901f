#!/usr/bin/env bash
# The Intel GPU check of the onednn_sycl shim (issue 28), as one command on a machine with an
# Intel GPU and its driver (Level Zero: libze_loader.so.1 and the GPU compute runtime, from the
# distribution's or Intel's packages; nothing of it comes from PyPI). Never run yet: no Intel
# GPU was at hand. What runs here on the CPU as a SYCL device is scripts/sycl_ci.sh.
#
#   bash scripts/xpu_check.sh                 # builds the two wheels from this checkout
#   bash scripts/xpu_check.sh --wheels DIR    # or installs flux_dnn-*.whl and flux_dnn_sycl-*.whl
#   bash scripts/xpu_check.sh --dry-run       # is there an Intel GPU? installs nothing
#
# It makes its own venv ($OUT/venv) with the pinned SYCL set of scripts/sycl_env.sh *without*
# the OpenCL CPU runtime (so SYCL lists GPUs only and device 0 is a GPU), records the loaded
# runtime and device, runs the shim's tests, the ABI suite on USM memory, the conformance
# suite on dpnp arrays and the ABI fuzzer on the GPU, and prints one table (the verdict first).
# Overrides: OUT (./xpu_check_logs), PYTHON (python3).
# Exit status: 0 all passed; 1 a step failed; 2 the shim cannot run on the GPU (the gate);
# 3 no Intel GPU here.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY="${PYTHON:-python3}"
OUT="${OUT:-$ROOT/xpu_check_logs}"
WHEELS="" DRY=0
while [ $# -gt 0 ]; do
  case $1 in
    --wheels) WHEELS=$(cd "$2" && pwd) || exit 1; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    *) echo "unknown argument $1" >&2; exit 1 ;;
  esac
done
mkdir -p "$OUT"
TABLE="$OUT/table.txt"
: >"$TABLE"
row() { printf '| %-28s | %-6s | %s |\n' "$1" "$2" "$3" >>"$TABLE"; }
FAILED=0

if ! ls /dev/dri/renderD* >/dev/null 2>&1 && ! command -v xpu-smi >/dev/null && ! command -v sycl-ls >/dev/null; then
  echo "xpu_check: no GPU render node (/dev/dri/renderD*) here: not an Intel GPU machine"
  exit 3
fi
[ "$DRY" = 1 ] && { echo "xpu_check: a render node is here; run without --dry-run"; exit 0; }

# 1. The venv: the pinned SYCL set (2025.3: intel-cmplr-lib-ur has the Level Zero adapters),
#    no intel-opencl-rt.
VENV="$OUT/venv"
start=$SECONDS
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV" && "$VENV/bin/python" -m pip install --quiet --upgrade pip
fi
"$VENV/bin/python" -m pip install --quiet "intel-sycl-rt==2025.3.3" "intel-cmplr-lib-ur==2025.3.3" \
  "intel-cmplr-lib-rt==2025.3.3" "onednn==2025.3.0" tbb "dpctl==0.21.1" "dpnp==0.19.1" numpy pytest \
  ml_dtypes scikit-build-core pybind11 cmake ninja "onednn-devel==2025.3.0" >"$OUT/install.log" 2>&1 ||
  { row install FAIL "pip: $OUT/install.log"; FAILED=1; }
if [ -n "$WHEELS" ]; then
  "$VENV/bin/python" -m pip install --quiet "$WHEELS"/flux_dnn-*.whl >>"$OUT/install.log" 2>&1 &&
    "$VENV/bin/python" -m pip install --quiet --no-deps "$WHEELS"/flux_dnn_sycl-*.whl >>"$OUT/install.log" 2>&1
else
  "$VENV/bin/python" -m pip wheel --quiet --no-build-isolation --no-deps -w "$OUT/wheels" ./packaging/flux-dnn-sycl \
    -C build-dir="$OUT/build-sycl" >>"$OUT/install.log" 2>&1 &&
    "$VENV/bin/python" -m pip install --quiet "$ROOT" >>"$OUT/install.log" 2>&1 &&
    "$VENV/bin/python" -m pip install --quiet --no-deps "$OUT"/wheels/flux_dnn_sycl-*.whl >>"$OUT/install.log" 2>&1
fi || { row install FAIL "wheels: $OUT/install.log"; FAILED=1; }
row install "$([ $FAILED = 0 ] && echo ok || echo FAIL)" "$((SECONDS - start)) s"
PYV="$VENV/bin/python"

# 2. The gate: the runtime and the device, recorded; the shim usable on a GPU.
"$PYV" - >"$OUT/device.txt" 2>&1 <<'EOF'
import importlib.metadata as m, flux_dnn, dpctl
for dist in ("intel-sycl-rt", "intel-cmplr-lib-ur", "onednn", "dpctl", "dpnp", "flux-dnn", "flux-dnn-sycl"):
    print(f"{dist} {m.version(dist)}")
for d in dpctl.get_devices():
    print(f"device {d.backend.name}:{d.device_type.name} {d.name} driver {d.driver_version} fp16 {d.has_aspect_fp16} fp64 {d.has_aspect_fp64}")
s = [s for s in flux_dnn.shims() if s.name == "onednn_sycl"][0]
print("shim", s.usable, s.vendor_version_runtime, s.unavailable_reason)
assert s.usable and dpctl.get_devices() and dpctl.get_devices()[0].is_gpu, "onednn_sycl is not usable on a GPU"
EOF
gate=$?
cat "$OUT/device.txt"
"$PYV" -m flux_dnn info >"$OUT/info.txt" 2>&1
if [ $gate != 0 ]; then
  row gate FAIL "$(tail -n 1 "$OUT/device.txt")"
  echo "VERDICT: the shim cannot run on an Intel GPU here (exit 2)"; cat "$TABLE"; exit 2
fi
row gate ok "$(grep '^device' "$OUT/device.txt" | head -n 1 | cut -c1-80)"

# 3. The suites on the GPU (device 0), each with its closing line in the table.
suite() {
  local name=$1; shift
  local t0=$SECONDS
  "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  local last
  last=$(grep -E "passed|failed|cases in|error" "$OUT/$name.log" | tail -n 1 | cut -c1-90)
  row "$name" "$([ $rc = 0 ] && echo ok || echo FAIL)" "$last ($((SECONDS - t0)) s)"
  [ $rc = 0 ] || FAILED=1
}
suite test_onednn_sycl "$PYV" -m pytest -q -p no:cacheprovider tests/test_onednn_sycl.py
suite output_pool "$PYV" -m pytest -q -p no:cacheprovider tests/test_sycl_output_pool.py
suite abi_suite "$PYV" -m pytest -q -p no:cacheprovider tests/abi -k onednn_sycl
suite conformance "$PYV" -m pytest -q -p no:cacheprovider tests/conformance -m accelerator -k "dpnp or dpctl"
suite abi_fuzz "$PYV" tests/abi_fuzz/fuzz.py --shim onednn_sycl --seed 1 --seed 2 --seed 3 --cases 2000

{
  if [ $FAILED = 0 ]; then echo "VERDICT: passed"; else echo "VERDICT: FAILED (logs in $OUT)"; fi
  echo "| step | result | detail |"
  echo "|---|---|---|"
  cat "$TABLE"
} | tee "$OUT/verdict.txt"
exit $FAILED
