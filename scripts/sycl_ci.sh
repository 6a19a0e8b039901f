#!/usr/bin/env bash
# The onednn_sycl shim's CI step (issue 28): its suites on a real SYCL device, the CPU through
# Intel's OpenCL CPU runtime, for .ci/run to call.
#
#   bash scripts/sycl_ci.sh [CORE]    # CORE: what `pip install` takes for flux-dnn (default:
#                                     # this checkout; a built wheel's path also works)
#
# 1. the cached venv of the pinned Intel set (scripts/sycl_env.sh, ~/.cache/flux_dnn);
# 2. the plug-in wheel, built in that venv without build isolation (onednn-devel 3.9's C
#    headers, no SYCL compiler), warnings as errors;
# 3. the core installed into the venv from CORE *with* build isolation: its CPU oneDNN shim
#    must be built against onednn-devel-cpu-gomp (3.2), whose headers lie at the same paths
#    as onednn-devel's and must not meet them; then the plug-in wheel (--no-deps);
# 4. `python -m flux_dnn info` must list onednn_sycl usable with a device;
# 5. tests/test_onednn_sycl.py (every op/dtype/option against float64, both oneDNNs in one
#    process in both orders), the ABI suite on onednn_sycl (USM shared memory), the conformance
#    suite on dpnp and dpctl arrays (-m accelerator), and the ABI fuzzer on onednn_sycl (seeds
#    1-3, 2000 cases each, as .ci/fuzz.sh).
# Exit status non-zero on any failure. Prints its time per step and in all.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CORE="${1:-$ROOT}"
start=$SECONDS
step() { echo "== sycl_ci: $* ($((SECONDS - start)) s)"; }

step "environment"
VENV="$(bash scripts/sycl_env.sh | tail -n 1)"
PY="$VENV/bin/python"
# This run installs its core and plug-in into the cached venv (and swaps the two oneDNN wheels
# for the install-order step): hold the venv's lock to the end, so that a second run on the
# machine waits instead of installing other builds under this one's tests.
exec 8>"$VENV.lock"
flock 8
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

step "plug-in wheel"
CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" "$PY" -m pip wheel --quiet --no-build-isolation \
  --no-deps -w "$work/wheels" ./packaging/flux-dnn-sycl -C build-dir="$work/build-sycl" \
  -C cmake.define.FLUX_DNN_WERROR=ON

step "core ($CORE) and plug-in into the venv"
CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" "$PY" -m pip install --quiet --force-reinstall \
  --no-deps "$CORE"
# The core's own dependencies (onednn-cpu-gomp, scipy-openblas32), without touching the pins.
"$PY" -m pip install --quiet "onednn-cpu-gomp==2023.2.0" "scipy-openblas32>=0.3.27"
"$PY" -m pip install --quiet --force-reinstall --no-deps "$work"/wheels/flux_dnn_sycl-*.whl

step "info"
"$PY" -m flux_dnn info | tee "$work/info.txt"
"$PY" - "$work/info.txt" <<'EOF'
import sys
text = open(sys.argv[1]).read()
block = text.split("shim onednn_sycl", 1)[-1].split("\nshim ", 1)[0]
assert "shim onednn_sycl" in text and ": usable" in block.splitlines()[0], "onednn_sycl is not usable:\n" + block
EOF

step "tests/test_onednn_sycl.py, the output pool, ABI suite, conformance suite"
"$PY" -m pytest -q -p no:cacheprovider tests/test_onednn_sycl.py
"$PY" -m pytest -q -p no:cacheprovider tests/test_sycl_output_pool.py
"$PY" -m pytest -q -p no:cacheprovider tests/abi -k onednn_sycl
"$PY" -m pytest -q -p no:cacheprovider tests/conformance -m accelerator -k "dpnp or dpctl"

step "install order: onednn (SYCL) installed after onednn-cpu-gomp, as 'pip install flux-dnn-sycl' after flux-dnn does"
# Both wheels install <prefix>/lib/libdnnl.so.3; the last one installed owns it. Before the CPU
# preload loaded onednn-cpu-gomp's versioned libdnnl.so.3.2 (9027644) it loaded that file:
# with the SYCL wheel last the CPU shim ran on oneDNN 3.9.1 and a process using both shims
# crashed at exit (SIGSEGV). Both orders through flux_dnn again, in that state; the venv is
# put back after (onednn-cpu-gomp reinstalled last), pass or fail.
"$PY" -m pip install --quiet --no-deps --force-reinstall "onednn==2025.3.0"
order_rc=0
"$PY" -m pytest -q -p no:cacheprovider tests/test_onednn_sycl.py -k one_process || order_rc=$?
"$PY" -m pip install --quiet --no-deps --force-reinstall "onednn-cpu-gomp==2023.2.0"
[ "$order_rc" = 0 ] || { echo "sycl_ci: with the SYCL oneDNN installed last, a shim got the other's oneDNN"; exit 1; }

step "ABI fuzz"
"$PY" tests/abi_fuzz/fuzz.py --shim onednn_sycl --seed 1 --seed 2 --seed 3 --cases 2000

step "done"
echo "sycl_ci: passed in $((SECONDS - start)) s"
