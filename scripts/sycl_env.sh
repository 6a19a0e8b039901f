#!/usr/bin/env bash
# The SYCL environment of the onednn_sycl shim (issue 28): a venv with one consistent set of
# Intel's runtime wheels from PyPI, cached outside the checkout and remade only when its pins
# (this file's PINS) change.
#
#   bash scripts/sycl_env.sh            # makes (or reuses) the venv, prints its path last
#   FLUX_DNN_SYCL_VENV=DIR bash scripts/sycl_env.sh
#
# Why these versions (measured, issue 28): the 2026.x intel-cmplr-lib-ur wheel ships only the
# Level Zero adapters, so SYCL sees no device on a machine without an Intel GPU. The 2025.3
# wheels ship libur_adapter_opencl.so, and with intel-opencl-rt's CPU runtime (libintelocl.so)
# SYCL lists the CPU as an OpenCL device ("opencl:cpu"), on which oneDNN's SYCL runtime runs
# for real. onednn 2025.3.0 is oneDNN 3.9.1 with CPU and GPU runtimes SYCL; dpctl 0.21.1 and
# dpnp 0.19.1 are the releases built against the 2025.3 SYCL runtime.
# dpnp pulls MKL (the venv is ~3 GB with it); FLUX_DNN_SYCL_NO_DPNP=1 leaves it out.
set -euo pipefail

PY="${PYTHON:-python3}"
PINS=(
  "intel-sycl-rt==2025.3.3"
  "intel-opencl-rt==2025.3.3"
  "intel-cmplr-lib-ur==2025.3.3"
  "intel-cmplr-lib-rt==2025.3.3"
  "dpctl==0.21.1"
  "onednn==2025.3.0"
  "onednn-devel==2025.3.0"
  "tbb"
  "numpy"
  "pytest"
  "ml_dtypes"
  # to build the plug-in and the core in this venv (pip --no-build-isolation)
  "scikit-build-core" "pybind11" "cmake" "ninja"
  # Not onednn-cpu-gomp / onednn-devel-cpu-gomp (the CPU shim's oneDNN 3.2): their files
  # lie at the same paths as onednn's and onednn-devel's (lib/libdnnl.so.3, include/oneapi/
  # dnnl/*.h, lib/cmake/dnnl), and the last wheel installed wins. The core brings
  # onednn-cpu-gomp when it is installed here; the plug-in is built before that.
)
if [ "${FLUX_DNN_SYCL_NO_DPNP:-0}" != 1 ]; then
  PINS+=("dpnp==0.19.1")
fi

key=$(printf '%s\n' "$("$PY" -c 'import sys; print(sys.version_info[:2])')" "${PINS[@]}" |
  sha256sum | cut -c1-12)
VENV="${FLUX_DNN_SYCL_VENV:-$HOME/.cache/flux_dnn/sycl-venv-$key}"

if [ -f "$VENV/.complete" ]; then
  echo "$VENV"
  exit 0
fi
mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
flock 9
if [ ! -f "$VENV/.complete" ]; then
  rm -rf "$VENV"
  "$PY" -m venv "$VENV" >&2
  "$VENV/bin/python" -m pip install --quiet --upgrade pip >&2
  # The wheels are large (MKL with dpnp): resume an interrupted download rather than fail.
  "$VENV/bin/python" -m pip install --quiet --resume-retries 20 "${PINS[@]}" >&2
  printf '%s\n' "${PINS[@]}" >"$VENV/.pins"
  touch "$VENV/.complete"
fi
echo "$VENV"
