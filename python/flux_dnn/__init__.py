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

__version__ = "0.1.0"


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
    "plan_cache_info",
    "set_plan_cache_capacity",
    "shims",
]
