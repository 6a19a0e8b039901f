"""The built-in oneDNN CPU shim: where its library and oneDNN's lie."""

from __future__ import annotations

import os
import pathlib
import platform

from ._discovery import ShimSpec, find_wheel_file, load_wheel_library, onednn_wheel_here

_LIBDNNL = "libdnnl.so.3"
# The wheel's versioned file, which only oneDNN 3.2 installs. The SYCL plug-in's onednn wheel
# (oneDNN 3.9) installs <prefix>/lib/libdnnl.so.3 at the same path as this wheel does, and pip
# lets the last wheel installed own it: after `pip install flux-dnn-sycl`, libdnnl.so.3 is
# oneDNN 3.9 (measured: the CPU shim then ran on 3.9 and the process crashed at exit).
_LIBDNNL_VERSIONED = "libdnnl.so.3.2"
_WHEEL = "onednn-cpu-gomp"


def _preload_onednn() -> None:
    """Load oneDNN 3.2 from the onednn-cpu-gomp wheel by path: its libdnnl.so.3.2 (soname
    libdnnl.so.3), else its libdnnl.so.3, else a system oneDNN the loader finds. So the shim
    finds it without LD_LIBRARY_PATH wherever pip put the wheel.

    RTLD_LOCAL: the shim's DT_NEEDED libdnnl.so.3 binds to this object (the loader matches a
    loaded object by soname, whatever its mode), while its symbols stay out of the global
    scope, where another oneDNN of the same soname (the SYCL plug-in's, loaded by path) or a
    library linking oneDNN statically could otherwise meet them. The registry runs this
    preload before any non-CPU shim loads, so this is the first libdnnl.so.3 in the process."""
    try:
        versioned = find_wheel_file(_WHEEL, _LIBDNNL_VERSIONED) is not None
        load_wheel_library(_WHEEL, _LIBDNNL_VERSIONED if versioned else _LIBDNNL, os.RTLD_LOCAL, fallback=_LIBDNNL)
    except OSError as exc:
        raise OSError(f"oneDNN ({_LIBDNNL}) not found: the {_WHEEL}==2023.2.0 wheel is not installed ({exc})") from None


def _why_not_built(wheel_here: bool) -> str:
    """Why this build has no oneDNN shim: a platform without oneDNN's wheel never has one (the
    BLAS shim is its CPU path); elsewhere the build was made without it."""
    if not wheel_here:
        return (
            f"flux_dnn has no oneDNN shim on {platform.system()} {platform.machine()}: oneDNN's wheel "
            "(onednn-cpu-gomp) exists for Linux x86-64 only; the BLAS shim serves CPU arrays here"
        )
    return (
        "this flux_dnn build has no oneDNN shim (built with FLUX_DNN_BUILD_ONEDNN=OFF); the BLAS shim serves CPU arrays"
    )


def install_hint(built: bool, wheel_here: bool) -> str:
    """What to install for the oneDNN shim: oneDNN's wheel when the shim is built and only its
    library is missing; a build with the shim where oneDNN has a wheel; nothing elsewhere (no
    install gives this platform a oneDNN shim)."""
    if built:
        return "pip install --force-reinstall onednn-cpu-gomp==2023.2.0"
    if wheel_here:
        return (
            "pip install --force-reinstall flux-dnn (the wheel has the oneDNN shim), "
            "or build without FLUX_DNN_BUILD_ONEDNN=OFF"
        )
    return ""


def shim_spec() -> ShimSpec:
    library = pathlib.Path(__file__).with_name("libflux_dnn_onednn.so")
    built, wheel_here = library.exists(), onednn_wheel_here()

    def not_built() -> None:
        raise FileNotFoundError(_why_not_built(wheel_here))

    return ShimSpec(
        name="onednn",
        device_type=1,
        library=str(library),
        # A build without the library records why when CPU arrays ask for it, and only then.
        preload=_preload_onednn if built else not_built,
        install_hint=install_hint(built, wheel_here),
    )
