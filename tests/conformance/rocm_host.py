"""An array type that reports DLPack device kDLROCM (10) on host memory: with the MIOpen test
double (tests/doubles/miopen), whose "device" memory is host memory, the conformance suite
runs the MIOpen shim end to end through flux_dnn's public API. It checks the shim's plumbing
(descriptors, strides, workspace, epilogue, the order of MIOpen calls), never that the shim
works on an AMD GPU. Its adapter is registered with flux_dnn's adapters for this type only,
as a plug-in library's own adapter would be."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib.metadata
import os
import pathlib
import tempfile

import numpy as np

ROCM = 10  # kDLROCM

_DTYPE_CODES = {"float": 2, "bfloat16": 4, "uint": 1, "int": 0}


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


# A prototype of our own: ctypes.pythonapi.PyCapsule_New's argtypes are shared by every
# module of the process, and other tests set them differently.
_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
    ("PyCapsule_New", ctypes.pythonapi)
)


def _dtype_code(a: np.ndarray) -> tuple:
    if a.dtype.name == "bfloat16":
        return 4, 16
    return (2 if a.dtype.kind == "f" else 1 if a.dtype.kind == "u" else 0), a.dtype.itemsize * 8


def _host(v):
    return v.host if isinstance(v, RocmHostArray) else v


class RocmHostArray:
    """A NumPy array (`host`) that DLPack reports as on ROCm device 0."""

    def __init__(self, host: np.ndarray):
        self.host = host
        self._exports = []  # the structs of the last capsules (the consumer reads them in the call)

    shape = property(lambda self: self.host.shape)
    dtype = property(lambda self: self.host.dtype)
    ndim = property(lambda self: self.host.ndim)

    def __getitem__(self, index):
        return RocmHostArray(self.host[index])  # a view, as device arrays' slices are

    def __setitem__(self, index, value):
        self.host[index] = value.host if isinstance(value, RocmHostArray) else value

    def __float__(self):
        return float(self.host)

    def reshape(self, *shape):
        return RocmHostArray(self.host.reshape(*shape))

    # The little arithmetic flux_dnn's transposed path does on output rows (output_padding).
    def __mul__(self, other):
        return RocmHostArray(self.host * _host(other))

    __rmul__ = __mul__

    def __add__(self, other):
        return RocmHostArray(self.host + _host(other))

    def __iadd__(self, other):
        self.host += _host(other)
        return self

    def __dlpack_device__(self):
        return (ROCM, 0)

    def __dlpack__(self, stream=None):
        a = self.host
        code, bits = _dtype_code(a)
        shape = (ctypes.c_int64 * max(a.ndim, 1))(*a.shape)
        strides = (ctypes.c_int64 * max(a.ndim, 1))(*(s // a.itemsize for s in a.strides))
        managed = _DLManagedTensor()
        managed.dl_tensor = _DLTensor(
            a.ctypes.data, _DLDevice(ROCM, 0), a.ndim, _DLDataType(code, bits, 1), shape, strides, 0
        )
        managed.manager_ctx = None
        managed.deleter = None
        self._exports = [*self._exports[-7:], (managed, shape, strides)]
        return _capsule_new(ctypes.addressof(managed), b"dltensor", None)


def _adapter():
    from flux_dnn._adapters import ArrayAPIAdapter, _channels_last_empty

    class RocmHostAdapter(ArrayAPIAdapter):
        name = "rocm_host"
        has_views = True

        def key(self, a):
            return (type(a), a.host.shape, a.host.strides, a.host.dtype.num)

        def device(self, a):
            return (ROCM, 0)

        def dtype_name(self, a, argname="array"):
            return a.host.dtype.name

        def strides(self, a):
            return tuple(s // a.host.itemsize for s in a.host.strides)

        def empty(self, like, shape, channels_last):
            if channels_last:
                buf, perm = _channels_last_empty(np.empty, shape, dtype=like.host.dtype)
                return RocmHostArray(buf.transpose(perm))
            return RocmHostArray(np.empty(shape, like.host.dtype))

        def stream(self, like):
            return None  # host memory: nothing to order (the double runs each call at once)

        def sum_over(self, a, axes):
            return RocmHostArray(a.host.astype(np.float32).sum(axis=axes).astype(a.host.dtype))

        def workspace(self, like, nbytes):
            raw = np.zeros(nbytes + 256, np.uint8)  # 64-byte aligned, as the header asks
            start = (-raw.ctypes.data) % 256
            return RocmHostArray(raw[start : start + nbytes])

    return RocmHostAdapter()


@functools.cache
def register_adapter():
    from flux_dnn import _adapters

    _adapters._BY_TYPE[RocmHostArray] = _adapter()


#: why the double is not in this process, when building it failed
double_failure = None


def miopen_shim_installed() -> bool:
    return any(ep.name == "miopen" for ep in importlib.metadata.entry_points(group="flux_dnn.shims"))


def use_double_if_wanted() -> None:
    """Builds the MIOpen test double (once per version of its sources) and makes it this
    process's MIOpen, when the MIOpen shim is installed and FLUX_DNN_MIOPEN_REAL is not 1."""
    from doubles import miopen as double

    if not (double.wanted() and miopen_shim_installed()):
        return
    digest = hashlib.sha256()
    for source in sorted(double.HERE.glob("*.cpp")) + sorted(double.INCLUDES[0].glob("*.hpp")):
        digest.update(source.read_bytes())
    global double_failure
    directory = pathlib.Path(tempfile.gettempdir()) / f"flux_dnn_miopen_double-{os.getuid()}-{digest.hexdigest()[:12]}"
    try:
        double.use(directory)
    except (RuntimeError, OSError) as exc:  # no C++ compiler: the rocm_host rows say so
        double_failure = f"the MIOpen test double could not be built: {exc}"


def ones(shape: tuple, dtype: str) -> RocmHostArray:
    """An array of ones, for a subprocess of a test (ArrayLibrary.source): sets the double up
    in that process as the suite's conftest does in its own."""
    use_double_if_wanted()
    register_adapter()
    if dtype == "bfloat16":
        import ml_dtypes

        return RocmHostArray(np.ones(shape, ml_dtypes.bfloat16))
    return RocmHostArray(np.ones(shape, dtype))
