"""flux_dnn: one convolution API over every accelerator vendor's own library.

``flux_dnn.conv2d(x, w)`` takes arrays of any library that speaks DLPack (NumPy, CuPy,
PyTorch, ...), runs the vendor's convolution (oneDNN on CPUs, cuDNN on NVIDIA GPUs, ...) on
the device where the arrays live, and returns an array of the same library on that device.
Semantics follow ``torch.nn.functional``: cross-correlation, x ``(N, C, *spatial)``,
w ``(K, C/groups, *kernel)``; channels-last arrays are taken as they are.
"""

from ._core import (
    ABI_VERSION,
    DeviceUnavailableError,
    ShimLoadError,
    UnsupportedError,
    VendorError,
)
from ._conv import ConvPlan
from ._discovery import ShimSpec, ShimStatus, shims
from ._api import (
    conv,
    conv1d,
    conv2d,
    conv3d,
    conv_backward_bias,
    conv_backward_data,
    conv_plan,
    conv_backward_weight,
    conv_transpose,
    conv_transpose1d,
    conv_transpose2d,
    conv_transpose3d,
    clear_plan_cache,
    plan_cache_info,
    set_plan_cache_capacity,
)

__version__ = "0.1.0"

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
