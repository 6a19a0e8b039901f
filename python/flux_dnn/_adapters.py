"""flux-dnn's own array-library providers (flux_dnn.providers has the interface): NumPy,
PyTorch, CuPy, MLX and JAX. They are registered through the entry-point group
``flux_dnn.providers`` in flux-dnn's pyproject.toml, as a plug-in package registers its own;
nothing else in flux_dnn names an array library. Each library keeps to its own small class."""

from __future__ import annotations

import operator
import sys

from . import _core
from ._geometry import is_channels_last  # noqa: F401 (its old home; the rule lives in _geometry)
from .providers import _BY_TYPE, Provider, Streams, channels_last_empty, provider_for  # noqa: F401 (old names)

CPU = _core.DEVICE_CPU
CUDA = _core.DEVICE_CUDA
ROCM = _core.DEVICE_ROCM  # kDLROCM: PyTorch ROCm tensors, CuPy ROCm arrays, JAX ROCm arrays
METAL = _core.DEVICE_METAL  # kDLMetal: PyTorch MPS tensors, MLX arrays
ONEAPI = _core.DEVICE_ONEAPI  # kDLOneAPI: PyTorch XPU tensors (SYCL), dpnp/dpctl arrays
DTYPE_BFLOAT = _core.DTYPE_BFLOAT  # DLPack's dtype code for bfloat16 (kDLBfloat)

# What flux_dnn convolves; a NumPy array of another dtype is refused naming these.
ACCEPTED_DTYPES = ("float64", "float32", "float16", "bfloat16")
_ACCEPTED_TEXT = "float64, float32, float16 and bfloat16 (ml_dtypes.bfloat16 for NumPy)"

# The names this module had before providers (tests and benchmarks use them).
ArrayAPIAdapter = Provider
_channels_last_empty = channels_last_empty
adapter_for = provider_for


def _is_ml_bfloat16(dtype) -> bool:
    ml_dtypes = sys.modules.get("ml_dtypes")  # imported wherever such an array exists
    return ml_dtypes is not None and dtype == ml_dtypes.bfloat16


def _numpy_uint16():
    # Rebinds itself to a function returning numpy's uint16 dtype on first use.
    global _numpy_uint16
    import numpy

    uint16 = numpy.dtype(numpy.uint16)
    _numpy_uint16 = lambda: uint16  # noqa: E731
    return uint16


def _numpy_refusal(a, argname: str) -> str:
    return (
        f"{argname}: dtype {a.dtype} is not supported for NumPy arrays; flux_dnn accepts "
        f"{_ACCEPTED_TEXT}: convert it first, e.g. with .astype(numpy.float32)"
    )


def _numpy_empty(*args, **kwargs):
    # Rebinds itself to numpy.empty on first use: numpy is imported only when an array of
    # it is seen, and the per-call path then pays no import statement.
    global _numpy_empty
    import numpy

    _numpy_empty = numpy.empty
    return numpy.empty(*args, **kwargs)


class NumpyProvider(Provider):
    name = "numpy"
    has_views = True
    core_native = core_memo = True  # the core reads ndarrays and makes them itself (numpy_arrays.cpp)
    # key(a) = (a.shape, a.strides, a.dtype.num), read in C (no Python frame per array). The
    # type number hashes faster than the dtype; it leaves out the byte order, which changes
    # no decision here (the core refuses a non-native byte order on every call). The type
    # leaves nothing out: NumPy's arrays all take this adapter, and a key of 3 never equals
    # another adapter's.
    key = staticmethod(operator.attrgetter("shape", "strides", "dtype.num"))

    def device(self, a):
        return (CPU, 0)

    def dtype_name(self, a, argname="array"):
        name = a.dtype.name
        if name not in ACCEPTED_DTYPES or (name == "bfloat16" and not _is_ml_bfloat16(a.dtype)):
            raise TypeError(_numpy_refusal(a, argname))
        return name

    def export_fallback(self, a, argname):
        # NumPy's __dlpack__ refuses ml_dtypes' bfloat16 (JAX's CPU arrays through
        # np.asarray): the core takes a uint16 view of the same memory, with the same
        # strides, as DLPack bfloat16.
        if _is_ml_bfloat16(a.dtype):
            return a.view(_numpy_uint16()), DTYPE_BFLOAT, 16
        if a.dtype.name in ACCEPTED_DTYPES:
            return None  # refused for another reason (such as its strides): NumPy's words stand
        raise TypeError(_numpy_refusal(a, argname))

    def strides(self, a):
        item = a.itemsize
        return tuple(s // item for s in a.strides) if all(s % item == 0 for s in a.strides) else None

    def empty(self, like, shape, channels_last):
        if channels_last:
            buf, perm = channels_last_empty(_numpy_empty, shape, dtype=like.dtype)
            return buf.transpose(perm)
        return _numpy_empty(shape, like.dtype)

    def stream(self, like):
        return None

    def sum_over(self, a, axes):
        # NumPy adds float16 and ml_dtypes' bfloat16 in their own precision, which loses the
        # small terms of a long sum; add in float32 and round once, as the vendors do.
        if a.dtype.itemsize == 2:
            return a.sum(axis=axes, dtype="float32").astype(a.dtype)
        return a.sum(axis=axes)


def _torch_to_dlpack(tensor):
    # Rebinds itself to torch.utils.dlpack.to_dlpack on first use (no import per call).
    global _torch_to_dlpack
    from torch.utils.dlpack import to_dlpack

    _torch_to_dlpack = to_dlpack
    return to_dlpack(tensor)


def _has_exchange_api(array_type) -> bool:
    """Whether array_type has DLPack's exchange API (dlpack.h 1.3, ``__dlpack_c_exchange_api__``:
    torch >= 2.11), through which the core reads its arrays, and makes new ones, in C."""
    return type(getattr(array_type, "__dlpack_c_exchange_api__", None)).__name__ == "PyCapsule"


class TorchProvider(Provider):
    name = "torch"
    has_views = True
    exports_itself = False  # True where torch has the exchange API (__init__)

    def __init__(self):
        import torch  # loaded when a tensor is first seen: torch is imported already

        # With the exchange API the core reads tensors itself (no capsule, no Python frame:
        # CPU calls go to the core as they are) and its memo answers repeated CPU forward
        # calls, making their outputs through torch's allocator.
        self.exports_itself = self.core_memo = _has_exchange_api(torch.Tensor)

    def key(self, a):
        return (type(a), a.shape, a.dtype, a.stride(), a.get_device())  # an int: no torch.device built

    def export(self, a):
        if self.exports_itself and not a.is_mps:
            return a  # the core reads it through the exchange API (dlpack_exchange.hpp)
        # torch's own C exporter: Tensor.__dlpack__ is Python code that costs microseconds
        # per call. No stream handshake is needed: flux_dnn runs on torch's current stream.
        capsule = _torch_to_dlpack(a.detach() if a.requires_grad else a)
        if a.is_mps and a.storage_offset():
            # Older torch exports such a tensor as an address, not an MTLBuffer: refused
            # (flux_dnn._metal_dlpack) rather than handed to the MPS shim as an object.
            from ._metal_dlpack import check_torch_export

            check_torch_export(a, capsule)
        return capsule

    def device(self, a):
        dev = a.device
        if dev.type == "cpu":
            return (CPU, 0)
        return tuple(int(v) for v in a.__dlpack_device__())

    def dtype_name(self, a, argname="array"):
        return str(a.dtype).replace("torch.", "")

    def strides(self, a):
        return tuple(a.stride())

    def empty(self, like, shape, channels_last):
        if channels_last:
            n = len(shape)
            return like.new_empty((shape[0], *shape[2:], shape[1])).permute(0, n - 1, *range(1, n - 1))
        return like.new_empty(shape)  # like's dtype and device, with less argument parsing

    def streams(self, like):
        kind = like.device.type
        if kind == "cpu":
            return None
        import torch

        if kind == "mps":
            # DLPack carries no Metal stream: torch's queued MPS work finishes before the MPS
            # shim reads the tensors (the shim finishes its own work before it returns).
            torch.mps.synchronize()
            return None
        if kind == "xpu":
            return _xpu_streams(torch, like)
        stream = torch.cuda.current_stream(like.device).cuda_stream
        if torch.version.hip is not None:
            return stream  # ROCm (torch.cuda is HIP there): 0 is DLPack's default stream
        # DLPack disallows 0 on CUDA; torch's default stream is the legacy one: say 1.
        return stream or 1

    def workspace(self, like, nbytes):
        import torch

        return torch.empty((nbytes,), dtype=torch.uint8, device=like.device)


def _xpu_streams(torch, like) -> Streams:
    """torch XPU (Intel GPU, SYCL): the shim enqueues on the current stream's SYCL queue and
    __dlpack__ gets no stream.

    Written from PyTorch's documentation, NOT run here (no XPU device or XPU build of torch on
    this machine): torch.xpu.current_stream(device) returns a torch.xpu.Stream whose
    ``sycl_queue`` is "the sycl_queue_t" (a ``sycl::queue*``) as an int, and XPU tensors
    export DLPack as (kDLOneAPI = 14, index). Tensor.__dlpack__(stream=) is documented for
    CUDA/ROCm stream ints only, so None is sent: torch's XPU queues are in-order, and work on
    the current queue is ordered after what torch already enqueued there."""
    return Streams(torch.xpu.current_stream(like.device).sycl_queue, None)


class CupyProvider(Provider):
    name = "cupy"
    has_views = True

    def key(self, a):
        return (type(a), a.shape, a.dtype, a.strides, a.device.id)

    def device(self, a):
        import cupy

        return (ROCM if cupy.cuda.runtime.is_hip else CUDA, int(a.device.id))

    def dtype_name(self, a, argname="array"):
        return a.dtype.name

    def strides(self, a):
        return tuple(s // a.itemsize for s in a.strides)

    def empty(self, like, shape, channels_last):
        import cupy

        with like.device:
            if channels_last:
                buf, perm = channels_last_empty(cupy.empty, shape, dtype=like.dtype)
                return buf.transpose(perm)
            return cupy.empty(shape, dtype=like.dtype)

    def stream(self, like):
        import cupy

        with like.device:
            ptr = cupy.cuda.get_current_stream().ptr
            if cupy.cuda.runtime.is_hip:
                return ptr  # ROCm: 0 is DLPack's default stream
            return ptr or 1  # 0 means legacy default: say 1

    def workspace(self, like, nbytes):
        import cupy

        with like.device:
            return cupy.empty((nbytes,), dtype=cupy.uint8)


class MlxProvider(Provider):
    """MLX arrays (MLX >= 0.32 exports kDLMetal). Lazy and without strides of their own:
    outputs are allocated contiguous and evaluated, so they have memory to be written."""

    name = "mlx"
    has_views = False

    def key(self, a):
        return (type(a), tuple(a.shape), a.dtype, self.device(a))

    def strides(self, a):
        return None

    def empty(self, like, shape, channels_last):
        import mlx.core as mx

        out = mx.zeros(shape, dtype=like.dtype)
        mx.eval(out)
        return out

    def stream(self, like):
        if self.device(like)[0] != METAL:
            return None
        import mlx.core as mx

        # DLPack carries no Metal stream: MLX evaluates what is pending and waits for the
        # GPU before the MPS shim reads the arrays.
        mx.eval(like)
        mx.synchronize()
        return None

    def sum_over(self, a, axes):
        return a.sum(axis=tuple(axes))

    def workspace(self, like, nbytes):
        import mlx.core as mx

        out = mx.zeros((nbytes,), dtype=mx.uint8)
        mx.eval(out)
        return out


class JaxProvider(Provider):
    """JAX arrays (jaxlib's ArrayImpl): DLPack and the array API, immutable (no views)."""

    name = "jax"


# The old adapter names (tests and benchmarks use them).
NumpyAdapter, TorchAdapter, CupyAdapter, MlxAdapter = NumpyProvider, TorchProvider, CupyProvider, MlxProvider
