"""flux_dnn's oneDNN SYCL shim (``onednn_sycl``): arrays on SYCL devices (DLPack kDLOneAPI:
dpnp/dpctl arrays, PyTorch XPU tensors) through oneDNN's SYCL runtime. Registers the shim
through the ``flux_dnn.shims`` entry point.

The wheel's start-up hook (flux_dnn_sycl.pth) points the OpenCL ICD loader at the wheel's CPU
runtime (``OCL_ICD_FILENAMES``) when Python starts, so that the CPU is a SYCL device without
any setting by the user; importing this package does the same where the hook did not run
(``_runtime.py`` says why and when that works). It loads no vendor library: the entry point's
preload does, on the first SYCL array.

It checks that the installed flux_dnn core speaks the ABI major the shim was built for
(ImportError naming both versions otherwise)."""

from __future__ import annotations

import pathlib

from . import _runtime

_runtime.configure_opencl()

try:
    from ._build_info import VERSION, require_core_abi
except ImportError:  # a source tree without the build's _build_info.py (tests before a build)
    VERSION, require_core_abi = "0+unknown", None
if require_core_abi is not None:
    require_core_abi(__name__)

__version__ = VERSION

LIBRARY = pathlib.Path(__file__).with_name("libflux_dnn_onednn_sycl.so")

#: What ran for real, and what did not (``python -m flux_dnn info`` prints it).
VERIFICATION = (
    "run here on the CPU as a SYCL device (Intel's OpenCL CPU runtime, intel-opencl-rt 2025.3.3, "
    "oneDNN 3.9.1 SYCL): ABI suite, fuzzer and tests/test_onednn_sycl.py against float64 on dpctl "
    "USM arrays; Intel GPUs (Level Zero) unverified: scripts/xpu_check.sh"
)

__all__ = ["LIBRARY", "VERIFICATION", "preload", "release_output_pool", "shim_spec"]


def preload() -> None:
    """Loads oneDNN (SYCL) and its runtime libraries by path (see _runtime.preload)."""
    _runtime.preload()


def release_output_pool() -> int:
    """Frees the USM memory that dpnp and dpctl outputs of flux_dnn keep for reuse (the blocks
    no array uses now; ``FLUX_DNN_SYCL_OUTPUT_POOL_BYTES`` bounds it) and returns how many
    bytes. As ``torch.cuda.empty_cache()``: for giving memory back to other users of the
    device, never needed for correctness."""
    from .providers import release_output_pool as release

    return release()


def shim_spec():
    """The entry point of group ``flux_dnn.shims``."""
    from flux_dnn import ShimSpec, _core

    return ShimSpec(
        name="onednn_sycl",
        device_type=_core.DEVICE_ONEAPI,
        library=str(LIBRARY),
        preload=preload,
        install_hint=(
            "pip install flux-dnn-sycl (Intel GPUs: with Intel's GPU driver); "
            "pip install 'flux-dnn-sycl[cpu]' for the CPU as a SYCL device (OpenCL CPU runtime)"
        ),
        verification=VERIFICATION,
    )
