#!/usr/bin/env bash
# CI step of issue 13: the MIOpen shim's plug-in wheel (packaging/flux-dnn-rocm), built with
# warnings as errors against the shim's own declarations of MIOpen/HIP (no ROCm needed),
# installed, and both suites run with it on the MIOpen test double (tests/doubles/miopen,
# built by the tests). The double checks plumbing only; nothing here runs on an AMD GPU.
# Usage: bash .ci/rocm.sh <work folder>   (the CI venv active)
set -euo pipefail
work="$1"
start=$SECONDS
# The HIP half of the shim's own declarations against Debian's HIP header (libamdhip64-dev),
# compiled only: a wrong arity, size or error code fails here.
if [ ! -f /usr/include/hip/hip_runtime_api.h ] && command -v apt-get >/dev/null; then
  apt-get install -y --no-install-recommends libamdhip64-dev >/dev/null 2>&1 ||
    echo "WARNING: libamdhip64-dev could not be installed"
fi
if [ -f /usr/include/hip/hip_runtime_api.h ]; then
  c++ -std=c++17 -fsyntax-only -Wall -Wextra -Werror csrc/shims/miopen/check_hip_declarations.cpp
else
  echo "WARNING: no HIP header: the shim's HIP declarations were not checked against it"
fi
python -m pip install --quiet scikit-build-core
python -m pip wheel --quiet --no-build-isolation --no-deps -w "$work/wheels-rocm" \
  ./packaging/flux-dnn-rocm -C cmake.define.FLUX_DNN_WERROR=ON -C build-dir="$work/build-rocm"
python -m pip install --quiet --no-deps "$work"/wheels-rocm/flux_dnn_rocm-*.whl
# Without MIOpen the shim loads and says why (info), before the double is in the process.
python -m flux_dnn info | grep -A2 -i miopen
python -m pytest -q tests/abi -k miopen
# MIOpen\'s one known gap (16-bit results with beta != 0 rounded twice) is a strict xfail in
# tests/conformance/conftest.py (KNOWN_SHIM_GAPS).
python -m pytest -q tests/conformance -k miopen
# No AMD GPU: the HIP runtime double reports none, and the shim says so.
FLUX_DNN_HIP_DOUBLE_DEVICES=0 FLUX_DNN_MIOPEN_LIBRARY="$(ls -d "${TMPDIR:-/tmp}"/flux_dnn_miopen_double-"$(id -u)"-* | head -1)/libMIOpen.so.1" \
  python -m flux_dnn info | grep "no AMD GPU found"
echo "rocm step: $((SECONDS - start)) s"
