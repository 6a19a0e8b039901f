"""The built-in MPS shim (Apple GPUs, MPSGraph): where its library lies. It is built on macOS
only; elsewhere it is listed with the reason it cannot load, so that a Metal array (or
``python -m flux_dnn``) says why instead of finding no shim at all."""

from __future__ import annotations

import pathlib
import sys

from ._discovery import ShimSpec

#: Why the shim is absent on this platform; None on macOS.
NOT_HERE = (
    None
    if sys.platform == "darwin"
    else f"the MPS shim is built on macOS only (this is {sys.platform}): Metal arrays need a Mac"
)


def _not_here() -> None:
    raise OSError(NOT_HERE)


def shim_spec() -> ShimSpec:
    return ShimSpec(
        name="mps",
        device_type=8,  # kDLMetal
        library=str(pathlib.Path(__file__).with_name("libflux_dnn_mps.dylib")),
        # Metal and MPSGraph ship with macOS: nothing to load first, except the reason to stop.
        preload=None if NOT_HERE is None else _not_here,
        # macOS 14: the wheel's deployment target (pyproject.toml, MACOSX_DEPLOYMENT_TARGET).
        install_hint="pip install flux-dnn on macOS 14 or later (Apple silicon)",
        verification="never compiled by Apple's SDK nor run on a Mac (on Linux: its Objective-C++ syntax-checked "
        "against declarations of Apple's headers, its SDK-free decisions unit-tested; scripts/mac_check.sh is the "
        "check to run on one)",
    )
