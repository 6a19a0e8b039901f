"""flux_dnn: one convolution API over every accelerator vendor's own library.

``flux_dnn.conv2d(x, w)`` takes arrays of any library that speaks DLPack (NumPy, CuPy,
PyTorch, ...), runs the vendor's convolution (oneDNN on CPUs, cuDNN on NVIDIA GPUs, ...) on
the device where the arrays live, and returns an array of the same library on that device.
Semantics follow ``torch.nn.functional``: cross-correlation, x ``(N, C, *spatial)``,
w ``(K, C/groups, *kernel)``; channels-last arrays are taken as they are.
"""

from . import _core
from ._api import (
    clear_plan_cache,
    conv,
    conv1d,
    conv2d,
    conv3d,
    conv_backward_bias,
    conv_backward_data,
    conv_backward_weight,
    conv_plan,
    conv_transpose,
    conv_transpose1d,
    conv_transpose2d,
    conv_transpose3d,
    plan_cache_info,
    set_plan_cache_capacity,
)
from ._conv import ConvPlan
from ._core import (
    ABI_VERSION,
    DeviceUnavailableError,
    ShimLoadError,
    UnsupportedError,
    VendorError,
)
from ._discovery import ShimSpec, ShimStatus, shims


def _installed_version() -> str:
    """The version pip installed (from the file VERSION, like every flux_dnn package)."""
    import importlib.metadata

    try:
        return importlib.metadata.version("flux-dnn")
    except importlib.metadata.PackageNotFoundError:  # on sys.path without being installed:
        return getattr(_core, "__version__", "unknown")  # what the build compiled in


__version__ = _installed_version()


def get_include() -> str:
    """The folder holding ``flux_dnn/flux_dnn.h``, the C ABI of the shims, for C and C++
    programs that load a shim library themselves (see examples/c): pass it to the compiler
    as ``-I``, like ``numpy.get_include()``."""
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    installed = os.path.join(here, "include")  # the wheel's copy
    checkout = os.path.join(here, os.pardir, os.pardir, "csrc", "include")  # an editable install
    for folder in (installed, checkout):
        if os.path.isfile(os.path.join(folder, "flux_dnn", "flux_dnn.h")):
            return os.path.normpath(folder)
    raise FileNotFoundError(
        f"flux_dnn/flux_dnn.h is in neither {installed} nor {os.path.normpath(checkout)}: "
        "this flux_dnn install is incomplete (reinstall flux-dnn)"
    )


def _default_autotune_path() -> str:
    import os

    base = os.environ.get("FLUX_DNN_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "flux_dnn"
    )
    return os.path.join(base, "autotune-v1.txt")


# Where algorithm="benchmark" keeps its choices (written on the first benchmark only).
_core.set_autotune_path(_default_autotune_path())

__all__ = [
    "ABI_VERSION",
    "DeviceUnavailableError",
    "ShimLoadError",
    "ShimSpec",
    "ShimStatus",
    "UnsupportedError",
    "VendorError",
    "clear_plan_cache",
    "conv",
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_backward_bias",
    "conv_plan",
    "ConvPlan",
    "conv_backward_data",
    "conv_backward_weight",
    "conv_transpose",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
    "get_include",
    "plan_cache_info",
    "set_plan_cache_capacity",
    "shims",
]
