"""The array libraries the conformance suite feeds to flux_dnn, one small class each: flux-dnn's
own (their base class, ArrayLibrary, is flux_dnn.conformance's), and those that installed
plug-in packages register (entry-point group ``flux_dnn.conformance_libraries``).

A library serves one DLPack device type (NumPy the CPU; CuPy CUDA; PyTorch and JAX either,
as two entries). Each class turns float64 NumPy values into its own arrays of a dtype and
memory layout, reads results back as float64 NumPy, and says why it cannot run here (not
installed, no device, no such dtype) so that a test skips with that reason. Nothing here
knows about shims."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util

import numpy as np

from flux_dnn.conformance import (  # noqa: F401 (the suite imports these names from here)
    CPU,
    CUDA,
    DEVICE_WORDS,
    LAYOUTS,
    METAL,
    ONEAPI,
    ROCM,
    ArrayLibrary,
    _channels_last_perm,
    registered_libraries,
)


def numpy_dtype(name: str):
    """The NumPy dtype of an ABI dtype name (bfloat16 is ml_dtypes')."""
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


class NumpyLibrary(ArrayLibrary):
    name = "numpy"

    def missing_dtype(self, dtype):
        if dtype == "bfloat16" and importlib.util.find_spec("ml_dtypes") is None:
            return "NumPy's bfloat16 comes from ml_dtypes, which is not installed"
        return None

    def array(self, values, dtype, layout="contiguous"):
        a = np.asarray(values).astype(numpy_dtype(dtype))
        if layout == "channels_last":  # (not ascontiguousarray: it keeps odd strides of size-1 dims)
            to, back = _channels_last_perm(a.ndim)
            buf = np.empty([a.shape[d] for d in to], a.dtype)
            buf[...] = a.transpose(to)
            a = buf.transpose(back)
        return a

    def numpy(self, a):
        return np.asarray(a).astype(np.float64)

    def is_array(self, a):
        return isinstance(a, np.ndarray)

    def dtype_name(self, a):
        return a.dtype.name

    def element_strides(self, a):
        return tuple(s // a.itemsize for s in a.strides)

    def source(self, shape, dtype):
        return f"__import__('numpy').ones({shape!r}, {dtype!r})"


class TorchLibrary(ArrayLibrary):
    name = "torch"

    def __init__(self, device_type=CPU):
        super().__init__()
        self.device_type = device_type
        # (torch ROCm calls its HIP devices "cuda")
        self.device = {CPU: "cpu", CUDA: "cuda", ROCM: "cuda", METAL: "mps"}[device_type]

    def unavailable(self):
        reason = super().unavailable()
        if reason is None and self.device_type == CUDA:
            self.load()
            if not self.module.cuda.is_available():
                return "no CUDA device: torch sees none"
        if reason is None and self.device_type == ROCM:
            self.load()
            if self.module.version.hip is None:
                return "not a ROCm build of torch (torch.version.hip is None)"
            if not self.module.cuda.is_available():
                return "no AMD GPU: torch (ROCm) sees none"
        if reason is None and self.device_type == METAL:
            self.load()
            if not self.module.backends.mps.is_available():
                return "no Metal device: torch.backends.mps.is_available() is False (not a Mac with MPS)"
        return reason

    def missing_dtype(self, dtype):
        if self.device_type == METAL and dtype == "float64":
            return "PyTorch's MPS backend has no float64"
        return None

    def array(self, values, dtype, layout="contiguous"):
        torch = self.module
        # (a copy: torch.from_numpy alone would share the caller's values, which a test
        # still needs after flux_dnn has written into the tensor)
        a = torch.from_numpy(np.array(values, dtype=np.float64)).to(self.device, getattr(torch, dtype))
        if layout == "channels_last":  # (not .contiguous(): it keeps odd strides of size-1 dims)
            to, back = _channels_last_perm(a.ndim)
            a = a.new_empty([a.shape[d] for d in to]).copy_(a.permute(*to)).permute(*back)
        return a

    def numpy(self, a):
        return a.detach().to(self.module.float64).cpu().numpy()

    def is_array(self, a):
        return isinstance(a, self.module.Tensor) and a.device.type == self.device

    def element_strides(self, a):
        return tuple(a.stride())

    def stream(self):
        if self.device_type in (CPU, METAL):
            return None  # (MPS: DLPack has no Metal stream)
        return self.module.cuda.stream(self.module.cuda.Stream())  # CUDA, and ROCm (HIP as torch.cuda)

    def synchronize(self):
        if self.device_type == METAL:
            self.module.mps.synchronize()
        elif self.device_type != CPU:
            self.module.cuda.synchronize()

    def source(self, shape, dtype):
        return f"__import__('torch').ones({shape!r}, dtype=__import__('torch').{dtype}, device={self.device!r})"

    def repeated(self, a, shape):
        return a.expand(*shape)

    def device_count(self):
        return self.module.cuda.device_count() if self.device in ("cuda",) else 1

    def on_device(self, index):
        return self.module.cuda.device(index) if self.device == "cuda" else contextlib.nullcontext()

    def device_index(self, a):
        return a.device.index or 0


class CupyLibrary(ArrayLibrary):
    name = "cupy"
    device_type = CUDA

    def __init__(self, device_type=CUDA):
        super().__init__()
        self.device_type = device_type

    def unavailable(self):
        reason = super().unavailable()
        if reason is None:
            self.load()
            if self.module.cuda.runtime.is_hip != (self.device_type == ROCM):
                return "CuPy is built for " + ("ROCm" if self.module.cuda.runtime.is_hip else "CUDA")
            try:
                if self.module.cuda.runtime.getDeviceCount() == 0:
                    return "no CUDA device: CuPy sees none"
            except Exception as exc:  # CUDA runtime missing or no driver
                return f"no CUDA device: CuPy says {exc}"
        return reason

    def missing_dtype(self, dtype):
        return "CuPy has no bfloat16" if dtype == "bfloat16" else None

    def array(self, values, dtype, layout="contiguous"):
        cp = self.module
        a = cp.asarray(np.ascontiguousarray(values, dtype=np.float64).astype(dtype))
        if layout == "channels_last":  # (not ascontiguousarray: it keeps odd strides of size-1 dims)
            to, back = _channels_last_perm(a.ndim)
            buf = cp.empty([a.shape[d] for d in to], a.dtype)
            buf[...] = a.transpose(to)
            a = buf.transpose(back)
        return a

    def numpy(self, a):
        return self.module.asnumpy(a).astype(np.float64)

    def is_array(self, a):
        return isinstance(a, self.module.ndarray)

    def dtype_name(self, a):
        return a.dtype.name

    def element_strides(self, a):
        return tuple(s // a.itemsize for s in a.strides)

    def stream(self):
        return self.module.cuda.Stream(non_blocking=True)

    def synchronize(self):
        self.module.cuda.get_current_stream().synchronize()
        self.module.cuda.Device().synchronize()

    def source(self, shape, dtype):
        return f"__import__('cupy').ones({shape!r}, {dtype!r})"

    def repeated(self, a, shape):
        return self.module.broadcast_to(a, shape)

    def device_count(self):
        return self.module.cuda.runtime.getDeviceCount()

    def on_device(self, index):
        return self.module.cuda.Device(index)

    def device_index(self, a):
        return a.device.id


class JaxLibrary(ArrayLibrary):
    """JAX arrays are immutable and carry no strides: no out=, contiguous layout only.
    float64 needs JAX's x64 mode, switched on around each test (jax.enable_x64)."""

    name = "jax"
    writable = False
    strided = False

    def __init__(self, device_type=CPU):
        super().__init__()
        self.device_type = device_type
        self.platform = "cpu" if device_type == CPU else "gpu"

    def unavailable(self):
        reason = super().unavailable()
        if reason is None:
            self.load()
            try:
                self._device = self.module.devices(self.platform)[0]
            except RuntimeError as exc:
                return f"no JAX {self.platform.upper()} device: {exc}"
        return reason

    def context(self):
        return self.module.enable_x64(True)

    def array(self, values, dtype, layout="contiguous"):
        assert layout == "contiguous", "JAX arrays have no layout of their own"
        host = np.asarray(values).astype(numpy_dtype(dtype))
        return self.module.device_put(host, self._device)

    def numpy(self, a):
        return np.asarray(a).astype(np.float64)

    def is_array(self, a):
        return isinstance(a, self.module.Array)

    def source(self, shape, dtype):
        return f"__import__('jax').numpy.ones({shape!r}, {dtype!r})"

    def device_count(self):
        return len(self.module.devices(self.platform))

    def array_on(self, values, dtype, index):
        host = np.asarray(values).astype(numpy_dtype(dtype))
        return self.module.device_put(host, self.module.devices(self.platform)[index])

    def device_index(self, a):
        (device,) = a.devices()
        return device.id


class MlxLibrary(ArrayLibrary):
    """MLX arrays on the Apple GPU (kDLMetal, MLX >= 0.32): immutable and without strides of
    their own, like JAX's: no out=, contiguous layout only; no float64 on the GPU."""

    name = "mlx"
    device_type = METAL
    writable = False
    strided = False

    def unavailable(self):
        if importlib.util.find_spec("mlx") is None:
            return "mlx is not installed"
        self.load()
        if not self.module.metal.is_available():
            return "no Metal device: mlx.core.metal.is_available() is False"
        return None

    def load(self):
        if self.module is None:
            self.module = importlib.import_module("mlx.core")
        return self

    def missing_dtype(self, dtype):
        return "MLX computes no float64 on the GPU" if dtype == "float64" else None

    def array(self, values, dtype, layout="contiguous"):
        assert layout == "contiguous", "MLX arrays have no layout of their own"
        mx = self.module
        host = np.asarray(values, dtype=np.float64).astype(np.float32)
        a = mx.array(host).astype(getattr(mx, dtype))  # (bfloat16 by way of float32: exact)
        mx.eval(a)
        return a

    def numpy(self, a):
        return np.array(a.astype(self.module.float32)).astype(np.float64)

    def is_array(self, a):
        return isinstance(a, self.module.array)

    def dtype_name(self, a):
        return str(a.dtype).rsplit(".", 1)[-1]

    def synchronize(self):
        self.module.synchronize()

    def source(self, shape, dtype):
        return f"__import__('mlx.core').core.ones({shape!r}, dtype=__import__('mlx.core').core.{dtype})"


# Which libraries a test concerns (matrix(where=...)); the docstring completes "a library ...".
def on_cpu(lib) -> bool:
    """on the CPU"""
    return lib.device_type == CPU


def off_cpu(lib) -> bool:
    """on a device other than the CPU (with streams of its own)"""
    return lib.device_type != CPU


def with_strides(lib) -> bool:
    """whose arrays have strides (views with gaps, channels-last)"""
    return lib.strided


def all_libraries() -> list:
    """Every library the suite knows, one entry per device type it can hold: flux-dnn's own,
    then those installed plug-ins register."""
    return [*_own_libraries(), *registered_libraries()]


def _own_libraries() -> list:
    return [
        NumpyLibrary(),
        TorchLibrary(CPU),
        JaxLibrary(CPU),
        TorchLibrary(CUDA),
        CupyLibrary(),
        JaxLibrary(CUDA),
        TorchLibrary(ROCM),
        CupyLibrary(ROCM),
        RocmHostLibrary(),
        TorchLibrary(METAL),
        MlxLibrary(),
    ]


class RocmHostLibrary(ArrayLibrary):
    """NumPy memory reported as ROCm device 0 (rocm_host.py): the MIOpen shim on its test
    double, tests/doubles/miopen. Plumbing only; never evidence about AMD GPUs."""

    name = "rocm_host"
    device_type = ROCM

    def load(self):
        return self  # no module of its own: NumPy memory behind a DLPack ROCm face

    def unavailable(self):
        import os

        if os.environ.get("FLUX_DNN_MIOPEN_REAL") == "1":
            return "FLUX_DNN_MIOPEN_REAL=1: host memory is not AMD GPU memory (the test double is off)"
        from . import rocm_host

        if rocm_host.double_failure:
            return rocm_host.double_failure
        rocm_host.register_adapter()
        return None

    def missing_dtype(self, dtype):
        if dtype == "bfloat16" and importlib.util.find_spec("ml_dtypes") is None:
            return "bfloat16 host arrays come from ml_dtypes, which is not installed"
        return None

    def array(self, values, dtype, layout="contiguous"):
        from .rocm_host import RocmHostArray

        return RocmHostArray(NumpyLibrary().array(values, dtype, layout))

    def numpy(self, a):
        return np.asarray(a.host).astype(np.float64)

    def is_array(self, a):
        from .rocm_host import RocmHostArray

        return isinstance(a, RocmHostArray)

    def dtype_name(self, a):
        return a.host.dtype.name

    def element_strides(self, a):
        return tuple(s // a.host.itemsize for s in a.host.strides)

    def repeated(self, a, shape):
        from .rocm_host import RocmHostArray

        return RocmHostArray(np.broadcast_to(a.host, shape))

    def source(self, shape, dtype):
        import pathlib

        tests = str(pathlib.Path(__file__).resolve().parent.parent)  # for conformance and doubles
        return (
            f"(__import__('sys').path.insert(0, {tests!r}), "
            f"__import__('conformance.rocm_host', fromlist=['ones']).ones({shape!r}, {dtype!r}))[1]"
        )
