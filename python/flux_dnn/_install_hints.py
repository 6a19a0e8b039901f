"""flux-dnn's own install hints: what to install for a device type when no installed package
serves it. Registered in the entry-point group ``flux_dnn.install_hints`` (pyproject.toml)
as a plug-in package registers its own; flux_dnn._discovery reads the group and names no
package itself. These name flux-dnn's own shims and the plug-ins pyproject.toml offers as
extras ([project.optional-dependencies]); a plug-in that is not an extra registers its hint
from its own package (used once it is installed, e.g. when its shim cannot load)."""

from __future__ import annotations

from . import _core
from ._discovery import onednn_wheel_here


def hints() -> dict:
    """{DLPack device type: what to install}."""
    cpu_wheels = "onednn-cpu-gomp and scipy-openblas32 wheels" if onednn_wheel_here() else "scipy-openblas32 wheel"
    return {
        _core.DEVICE_CPU: f"pip install flux-dnn (its CPU shims need the {cpu_wheels})",
        _core.DEVICE_CUDA: "pip install flux-dnn-cuda13 (or flux-dnn-cuda12 for CUDA 12)",
        _core.DEVICE_METAL: "pip install flux-dnn on macOS 14 or later (the MPS shim is built into it there)",
        _core.DEVICE_ROCM: "pip install flux-dnn-rocm",
    }
