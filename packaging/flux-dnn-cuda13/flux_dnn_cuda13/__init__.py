"""flux_dnn's cuDNN shim for CUDA 13: registers the shim library through the
``flux_dnn.shims`` entry point. Nothing here loads a vendor library at import.

Importing it checks that the installed flux_dnn core speaks the ABI major the shim was built
for (ImportError naming both versions otherwise); flux_dnn's discovery, which imports this
package for its entry point, then lists the shim with that reason."""

from __future__ import annotations

import ctypes
import pathlib
import platform

from ._build_info import VERSION, require_core_abi

require_core_abi(__name__)

from flux_dnn._discovery import find_wheel_file, load_wheel_library  # noqa: E402 (after the ABI check)

__version__ = VERSION

CUDA_MAJOR = int(__name__[-2:])  # flux_dnn_cuda13 -> 13, flux_dnn_cuda12 -> 12
CUDNN_DISTRIBUTION = f"nvidia-cudnn-cu{CUDA_MAJOR}"
CUDNN_SONAME = "libcudnn.so.9"
LIBRARY = pathlib.Path(__file__).with_name("libflux_dnn_cudnn.so")

# cuDNN dlopens these by soname for some engines (cuBLASLt: matmul-based ones; NVRTC: the
# runtime-compiled ones); NVIDIA's wheels keep them off the library path, so without a
# preload those engines are silently missing in a process that has not loaded them (a
# CuPy-only one). Each: (soname, distributions that may hold it: CUDA 13's, then 12's names).
COMPANIONS = (
    (f"libcublasLt.so.{CUDA_MAJOR}", ("nvidia-cublas", f"nvidia-cublas-cu{CUDA_MAJOR}")),
    (f"libnvrtc.so.{CUDA_MAJOR}", ("nvidia-cuda-nvrtc", f"nvidia-cuda-nvrtc-cu{CUDA_MAJOR}")),
)

# What scripts/gpu_check.sh has verified on a real GPU, per (CUDA major, machine) (this file
# is also the template of flux-dnn-cuda12, whose build has never run on one, and the aarch64
# build has not either). A build not listed warns on its first use
# (flux_dnn.ShimSpec.verification).
GPU_CHECKS = {
    (13, "x86_64"): "GPU check passed 2026-12-04 on an NVIDIA H200 (sm_90, driver 580.159.04) with cuDNN 9.19.0, "
    "torch 2.11 (cu130), CuPy 14.2 and JAX 0.11.2: ABI suite 375, conformance 482 and JAX 127 tests passed, "
    "none failed (scripts/gpu_check.sh)",
}
VERIFICATION = GPU_CHECKS.get(
    (CUDA_MAJOR, platform.machine()), f"never run on a GPU as this build (CUDA {CUDA_MAJOR}, {platform.machine()})"
)

__all__ = ["shim_spec", "find_libcudnn", "find_in_wheel"]


def find_in_wheel(distribution: str, soname: str) -> pathlib.Path | None:
    """The library `soname` inside an installed wheel, or None (flux_dnn's one lookup)."""
    return find_wheel_file(distribution, soname)


def find_libcudnn() -> pathlib.Path | None:
    """libcudnn.so.9 inside the nvidia-cudnn-cu* wheel, or None when it is not installed."""
    return find_in_wheel(CUDNN_DISTRIBUTION, CUDNN_SONAME)


def _preload_companions() -> None:
    """cuBLASLt and NVRTC from NVIDIA's wheels, globally, where installed (a system CUDA on
    the library path serves otherwise, and cuDNN works without them, with fewer engines)."""
    for soname, distributions in COMPANIONS:
        for distribution in distributions:
            if find_in_wheel(distribution, soname) is not None:
                load_wheel_library(distribution, soname, ctypes.RTLD_GLOBAL)
                break


def _preload() -> None:
    """Loads cuDNN (and its companions) globally so that the shim's dlopen("libcudnn.so.9")
    and cuDNN's own dlopens of its engine libraries find them (a system cuDNN 9 on the
    library path serves when the wheel is absent)."""
    _preload_companions()
    try:
        load_wheel_library(CUDNN_DISTRIBUTION, CUDNN_SONAME, ctypes.RTLD_GLOBAL, fallback=CUDNN_SONAME)
    except OSError:
        if find_libcudnn() is not None:
            raise  # the wheel's cuDNN is there and failed to load: its own words
        raise RuntimeError(
            f"cuDNN 9 not found: {CUDNN_DISTRIBUTION} is not installed (pip install {CUDNN_DISTRIBUTION})"
        ) from None


def shim_spec():
    """The entry point of group ``flux_dnn.shims``."""
    from flux_dnn import ShimSpec, _core

    return ShimSpec(
        name="cudnn",
        device_type=_core.DEVICE_CUDA,
        library=str(LIBRARY),
        preload=_preload,
        install_hint=f"an NVIDIA GPU with a driver for CUDA {CUDA_MAJOR}, and pip install flux-dnn-cuda{CUDA_MAJOR}",
        verification=VERIFICATION,
    )
