"""The built-in CBLAS CPU shim (OpenBLAS from the scipy-openblas32 wheel): where its library
and OpenBLAS's lie."""

from __future__ import annotations

import os
import pathlib
import sys

from ._discovery import ShimSpec, load_wheel_library

_SUFFIX = ".dylib" if sys.platform == "darwin" else ".so"  # CMake's shared-library suffix
_LIBOPENBLAS = "libscipy_openblas" + _SUFFIX
_WHEEL = "scipy-openblas32"


def _preload_openblas() -> None:
    """Load libscipy_openblas.so (.dylib on macOS) from the scipy-openblas32 wheel by absolute
    path, so the shim finds it without LD_LIBRARY_PATH wherever pip put the wheel. Global, as
    before: OpenBLAS is the process's BLAS for whoever links it by its own (unique) soname."""
    try:
        load_wheel_library(_WHEEL, _LIBOPENBLAS, os.RTLD_GLOBAL)
    except OSError as exc:
        raise OSError(f"OpenBLAS ({_LIBOPENBLAS}) not found or not loadable: {exc}") from None


def shim_spec() -> ShimSpec:
    return ShimSpec(
        name="blas",
        device_type=1,
        library=str(pathlib.Path(__file__).with_name("libflux_dnn_blas" + _SUFFIX)),
        preload=_preload_openblas,
        install_hint="pip install scipy-openblas32",
    )
