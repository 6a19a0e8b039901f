"""The built-in CBLAS CPU shim (OpenBLAS from the scipy-openblas32 wheel): where its library
and OpenBLAS's lie."""

from __future__ import annotations

import ctypes
import pathlib
import sys

from ._discovery import ShimSpec

_SUFFIX = ".dylib" if sys.platform == "darwin" else ".so"  # CMake's shared-library suffix
_LIBOPENBLAS = "libscipy_openblas" + _SUFFIX


def _preload_openblas() -> None:
    """Load libscipy_openblas.so (.dylib on macOS) from the scipy-openblas32 wheel by absolute path, so the shim
    finds it without LD_LIBRARY_PATH wherever pip put the wheel (venv, --user, --prefix)."""
    try:
        import scipy_openblas32
    except ImportError as exc:
        raise OSError(
            f"OpenBLAS ({_LIBOPENBLAS}) not found: the scipy-openblas32 wheel is not installed ({exc})"
        ) from None
    path = pathlib.Path(scipy_openblas32.get_lib_dir()) / _LIBOPENBLAS
    if not path.exists():
        raise OSError(f"OpenBLAS not found: the scipy-openblas32 wheel has no {path}")
    try:
        ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    except OSError as exc:
        raise OSError(f"OpenBLAS ({path}) failed to load: {exc}") from None


def shim_spec() -> ShimSpec:
    return ShimSpec(
        name="blas",
        device_type=1,
        library=str(pathlib.Path(__file__).with_name("libflux_dnn_blas" + _SUFFIX)),
        preload=_preload_openblas,
        install_hint="pip install scipy-openblas32",
    )
