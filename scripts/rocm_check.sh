#!/usr/bin/env bash
# The MIOpen shim on an AMD GPU: run on a machine with ROCm and PyTorch for ROCm (CuPy for ROCm
# too, when installed). In order: the tools (cmake, ninja, a C++ compiler) and the GPU are
# checked before anything is built; a venv of its own that sees the machine's packages
# (--system-site-packages: the ROCm torch stays, pip is told not to replace it); flux_dnn and
# the flux-dnn-rocm wheel built there; which libMIOpen and libamdhip64 a torch process really
# loaded (/proc/self/maps: exactly one of each), torch.version.hip, the GPU's gcnArchName and
# MIOpen's version recorded; the MIOpen ABI cases, the targeted ROCm conformance cases
# (tests/conformance/test_rocm.py) and the conformance suite on torch/CuPy ROCm arrays; one
# summary table last. Exit 1 when anything failed or no GPU test ran.
#   --dry-run   check the tools and the GPU only, say what would run, build nothing
#   T_SUITE     seconds for the conformance suite (default 3600: a cold MIOpen cache compiles
#               kernels for every shape); MIOPEN_USER_DB_PATH / MIOPEN_CUSTOM_CACHE_DIR default
#               to build/rocm-check/miopen-{db,cache} (a warm cache for the next run)
# NOT RUN YET on an AMD GPU: none was reachable when it was written.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
dry_run=0
[ "${1:-}" = "--dry-run" ] && dry_run=1
out=build/rocm-check
mkdir -p "$out"
summary="$out/summary.txt"
: >"$summary"
row() { printf '%-34s %-8s %s\n' "$1" "$2" "$3" | tee -a "$summary"; }
failed=0
fail_row() { row "$1" FAILED "$2"; failed=1; }
finish() {
  echo
  echo "== rocm_check summary =="
  cat "$summary"
  [ "$failed" = 0 ] && [ "${gpu_tests_ran:-0}" = 1 ] && exit 0
  exit 1
}
py=${PYTHON:-python3}

# 1. Tools, before anything else.
for tool in cmake ninja c++ "$py"; do
  if command -v "$tool" >/dev/null; then row "tool $tool" ok "$(command -v "$tool")"; else fail_row "tool $tool" "not found"; fi
done

# 2. The GPU, through the machine's torch, before anything is built.
gpu=$("$py" - 2>&1 <<'EOF'
try:
    import torch
except ImportError:
    print("NO: no AMD GPU usable here: torch is not installed (PyTorch for ROCm is needed)")
    raise SystemExit
if not getattr(torch.version, "hip", None):
    print(f"NO: no AMD GPU usable here: torch {torch.__version__} is not a ROCm build (torch.version.hip is None)")
elif not torch.cuda.is_available() or torch.cuda.device_count() == 0:
    print(f"NO: no AMD GPU here: torch {torch.__version__} (HIP {torch.version.hip}) sees none")
else:
    p = torch.cuda.get_device_properties(0)
    print(f"YES: {p.name} ({getattr(p, 'gcnArchName', '?')}), torch {torch.__version__}, HIP {torch.version.hip}")
EOF
)
case "$gpu" in
  YES:*) row "AMD GPU" ok "${gpu#YES: }" ;;
  *) fail_row "AMD GPU" "${gpu#NO: }" ;;
esac
if [ "$dry_run" = 1 ]; then
  row "dry run" "done" "would build flux_dnn and flux-dnn-rocm in $out/venv, record the loaded libraries, run the suites"
  finish
fi
[ "$failed" = 1 ] && finish

# 3. A venv that keeps the machine's torch; build and install flux_dnn and the ROCm wheel.
venv="$out/venv"
"$py" -m venv --system-site-packages "$venv" && vpy="$venv/bin/python" || { fail_row venv "python -m venv failed"; finish; }
"$vpy" -c "import torch; print(f'torch=={torch.__version__}')" >"$out/constraints.txt"
pip_in() { "$vpy" -m pip install --quiet -c "$out/constraints.txt" "$@"; }
if pip_in pytest numpy ml_dtypes scikit-build-core pybind11 >"$out/pip.log" 2>&1 &&
  pip_in --no-build-isolation . >>"$out/pip.log" 2>&1 &&
  "$vpy" -m pip wheel --quiet --no-build-isolation --no-deps -w "$out/wheels" ./packaging/flux-dnn-rocm \
    -C cmake.define.FLUX_DNN_WERROR=ON >>"$out/pip.log" 2>&1 &&
  pip_in --no-deps --force-reinstall "$out"/wheels/flux_dnn_rocm-*.whl >>"$out/pip.log" 2>&1; then
  row build ok "flux_dnn and flux-dnn-rocm in $venv (torch kept: $(cat "$out/constraints.txt"))"
else
  fail_row build "see $out/pip.log"
  finish
fi

# 4. What a torch process really loads when it runs a convolution through the shim.
export FLUX_DNN_MIOPEN_REAL=1 MIOPEN_USER_DB_PATH="${MIOPEN_USER_DB_PATH:-$PWD/$out/miopen-db}"
export MIOPEN_CUSTOM_CACHE_DIR="${MIOPEN_CUSTOM_CACHE_DIR:-$PWD/$out/miopen-cache}"
loaded=$("$vpy" - 2>&1 <<'EOF'
import torch, flux_dnn
x = torch.ones(1, 2, 5, 5, device="cuda")
y = flux_dnn.conv2d(x, torch.ones(3, 2, 3, 3, device="cuda"))
assert float(y[0, 0, 2, 2]) == 18.0, y
maps = {line.split()[-1] for line in open("/proc/self/maps") if line.count("/") and ".so" in line}
mi = sorted(m for m in maps if "libMIOpen" in m)
hip = sorted(m for m in maps if "libamdhip64" in m)
print(f"{mi}; {hip}")
print("ONE" if len(mi) == 1 and len(hip) == 1 else "MANY")
EOF
)
echo "$loaded" >"$out/loaded.txt"
if [ "$(tail -1 "$out/loaded.txt")" = ONE ]; then
  row "loaded libraries" ok "$(head -1 "$out/loaded.txt")"
else
  fail_row "loaded libraries" "$(tr '\n' ' ' <"$out/loaded.txt" | cut -c1-300)"
fi
"$vpy" -m flux_dnn info >"$out/info.txt" 2>&1

# 5. The suites; a pytest exit of 5 (nothing collected or all deselected) counts as no test.
suite() {
  local name=$1 limit=$2
  shift 2
  timeout "$limit" "$vpy" -m pytest -q -p no:cacheprovider "$@" >"$out/$name.log" 2>&1
  local rc=$?
  local last
  last=$(grep -E "passed|failed|error" "$out/$name.log" | tail -1)
  if [ $rc = 0 ] && grep -q passed <<<"$last"; then
    row "$name" passed "$last"
    gpu_tests_ran=1
  else
    fail_row "$name" "rc $rc: ${last:-no result line} ($out/$name.log)"
  fi
}
suite abi-miopen 1800 tests/abi -k miopen
suite conformance-rocm-targeted "${T_SUITE:-3600}" tests/conformance/test_rocm.py -k "torch or cupy" -m accelerator
suite conformance-rocm "${T_SUITE:-3600}" tests/conformance -k "miopen and (torch or cupy)" -m accelerator
finish
