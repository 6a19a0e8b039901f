"""The built-in oneDNN CPU shim: where its library and oneDNN's lie."""

from __future__ import annotations

import ctypes
import importlib.metadata
import pathlib

from ._discovery import ShimSpec

_LIBDNNL = "libdnnl.so.3"


def _preload_onednn() -> None:
    """Load libdnnl.so.3 from the onednn-cpu-gomp wheel by path, so the shim finds it without
    LD_LIBRARY_PATH wherever pip put the wheel's data files (venv, --user, --prefix)."""
    try:
        files = importlib.metadata.distribution("onednn-cpu-gomp").files or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for f in files:
        if f.name == _LIBDNNL:
            path = pathlib.Path(f.locate()).resolve()
            if path.exists():
                ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
                return
    # Not from the wheel: a system oneDNN the dynamic loader can find is fine too.
    try:
        ctypes.CDLL(_LIBDNNL, mode=ctypes.RTLD_GLOBAL)
    except OSError as exc:
        raise OSError(
            f"oneDNN ({_LIBDNNL}) not found: the onednn-cpu-gomp==2023.2.0 wheel is not installed ({exc})"
        ) from None


def _not_built() -> None:
    raise FileNotFoundError(
        "this flux_dnn build has no oneDNN shim (built with FLUX_DNN_BUILD_ONEDNN=OFF, "
        "or for a platform without oneDNN wheels); the BLAS shim serves CPU arrays"
    )


def shim_spec() -> ShimSpec:
    library = pathlib.Path(__file__).with_name("libflux_dnn_onednn.so")
    return ShimSpec(
        name="onednn",
        device_type=1,
        library=str(library),
        # A build without the library records why when CPU arrays ask for it, and only then.
        preload=_preload_onednn if library.exists() else _not_built,
        install_hint="pip install --force-reinstall onednn-cpu-gomp==2023.2.0",
    )
