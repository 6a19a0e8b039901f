"""flux_dnn's MIOpen shim for AMD GPUs (ROCm): registers the shim library through the
``flux_dnn.shims`` entry point. Nothing here loads a vendor library at import.

Importing it checks that the installed flux_dnn core speaks the ABI major the shim was built
for (ImportError naming both versions otherwise)."""

from __future__ import annotations

import importlib.util
import os
import pathlib

from ._build_info import VERSION, require_core_abi

require_core_abi(__name__)

__version__ = VERSION

LIBRARY = pathlib.Path(__file__).with_name("libflux_dnn_miopen.so")

__all__ = ["shim_spec", "find_torch_miopen"]


def find_torch_miopen() -> pathlib.Path | None:
    """libMIOpen.so* inside an installed PyTorch ROCm wheel (torch/lib), without importing
    torch; None when there is none (a CUDA or CPU build of PyTorch has none)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        for candidate in sorted(pathlib.Path(location, "lib").glob("libMIOpen.so*")):
            return candidate
    return None


def _preload() -> None:
    """Points the shim at PyTorch's MIOpen when no other is named, whatever ROCm the system
    has: torch loads its own copies (torch/lib), and a system MIOpen loaded first would bring
    a second HIP runtime into the process (review D10; the shim refuses two). Without a ROCm
    torch the shim's own search covers ROCm installs ($ROCM_PATH/lib, /opt/rocm/lib)."""
    if os.environ.get("FLUX_DNN_MIOPEN_LIBRARY"):
        return
    found = find_torch_miopen()
    if found is not None:
        os.environ["FLUX_DNN_MIOPEN_LIBRARY"] = str(found)


def shim_spec():
    """The entry point of group ``flux_dnn.shims``."""
    from flux_dnn import ShimSpec, _core

    return ShimSpec(
        name="miopen",
        device_type=_core.DEVICE_ROCM,
        library=str(LIBRARY),
        preload=_preload,
        install_hint="an AMD GPU with ROCm's MIOpen (or PyTorch for ROCm), and pip install flux-dnn-rocm",
        verification="never run on an AMD GPU or a real MIOpen (its plumbing passes the ABI and conformance "
        "suites on a MIOpen test double)",
    )
