"""What the conformance suite needs of an array library, for packages that add one.

The conformance suite (tests/conformance in flux-dnn's source) runs every usable shim with
every array library that holds its device's arrays. flux-dnn's own libraries (NumPy,
PyTorch, CuPy, JAX, MLX) live with the suite; a plug-in package adds its array libraries
through the entry-point group ``flux_dnn.conformance_libraries``: each entry point gives a
zero-argument callable returning a list of :class:`ArrayLibrary` instances (one per device
type the library holds), e.g.::

    [project.entry-points."flux_dnn.conformance_libraries"]
    dpnp = "flux_dnn_sycl.conformance:libraries"

An ArrayLibrary turns float64 NumPy values into its own arrays of a dtype and memory layout,
reads results back as float64 NumPy, and says why it cannot run here (not installed, no
device, no such dtype), so that a test skips with that reason. Nothing here knows about
shims. Importing this module imports NumPy only."""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util

import numpy as np

CONFORMANCE_GROUP = "flux_dnn.conformance_libraries"

CPU, CUDA, METAL, ROCM, ONEAPI = 1, 2, 8, 10, 14  # DLPack device types
DEVICE_WORDS = {CPU: "CPU", CUDA: "CUDA", METAL: "Metal", ROCM: "ROCm", ONEAPI: "oneAPI"}
LAYOUTS = ("contiguous", "channels_last")


def _channels_last_perm(ndim: int) -> tuple:
    """(to (N, *spatial, C), back to (N, C, *spatial))."""
    return (0, *range(2, ndim), 1), (0, ndim - 1, *range(1, ndim - 1))


class ArrayLibrary:
    name = ""  # the module's name
    device_type = CPU
    #: whether flux_dnn may write into an existing array of this library (out=)
    writable = True
    #: whether its arrays have strides of their own (channels-last, views with gaps)
    strided = True

    def __init__(self):
        self.module = None

    # -- availability ------------------------------------------------------------------
    def unavailable(self):
        """None, or why this library cannot hold arrays of its device here."""
        if importlib.util.find_spec(self.name) is None:
            return f"{self.name} is not installed"
        return None

    def load(self):
        if self.module is None:
            self.module = importlib.import_module(self.name)
        return self

    def missing_dtype(self, dtype: str):
        """None, or why this library has no arrays of `dtype` here."""
        return None

    def missing_layout(self, layout: str):
        if layout != "contiguous" and not self.strided:
            return f"{self.name} arrays carry no strides (the library picks their layout)"
        return None

    def context(self):
        """Entered around each test (JAX's float64 switch)."""
        return contextlib.nullcontext()

    # -- arrays ------------------------------------------------------------------------
    def array(self, values, dtype: str, layout: str = "contiguous"):
        """values (float64 NumPy, exact in `dtype`) as this library's array."""
        raise NotImplementedError

    def numpy(self, a):
        """An array of this library as float64 NumPy."""
        raise NotImplementedError

    def nan(self, shape, dtype: str, layout: str = "contiguous"):
        """A poisoned output: every element NaN, so any element a call leaves unwritten shows."""
        return self.array(np.full(shape, np.nan), dtype, layout)

    def is_array(self, a) -> bool:
        raise NotImplementedError

    def reshape(self, a, shape: tuple):
        """a with a new shape: a view where a's strides allow it, else a copy. The suite calls
        this instead of ``a.reshape(shape)`` because not every array type has that method
        (dpctl's usm_ndarray has only the array API's function ``xp.reshape(a, shape)``);
        such a library overrides this."""
        return a.reshape(shape)

    def dtype_name(self, a) -> str:
        return str(a.dtype).replace("torch.", "")

    def element_strides(self, a):
        """Strides in elements, or None when the library does not expose them."""
        return None

    def stream(self):
        """A context manager that makes a stream other than the default current, or None."""
        return None

    def synchronize(self):
        pass

    def source(self, shape: tuple, dtype: str) -> str:
        """Python source that builds an array of ones of this library (for subprocess tests)."""
        raise NotImplementedError

    def repeated(self, a, shape: tuple):
        """a (size 1 where shape is larger) repeated to shape without a copy (stride 0 there,
        as torch's expand), or None when the library has no such views."""
        return None

    # -- devices (the suite's second-device check) ----------------------------------------
    def device_count(self) -> int:
        """How many devices of this library's device type it sees here."""
        return 1

    def on_device(self, index: int):
        """A context manager making device `index` current, for libraries with a current
        device (torch, CuPy); nothing otherwise."""
        return contextlib.nullcontext()

    def array_on(self, values, dtype: str, index: int):
        """values as an array on device `index` (called inside on_device(index))."""
        return self.array(values, dtype)

    def device_index(self, a) -> int:
        """The index of the device a lives on."""
        return int(a.__dlpack_device__()[1])

    # -- shared ------------------------------------------------------------------------
    def has_layout(self, a, layout: str) -> bool:
        """Whether a's strides are those of `layout` (dims of size 1 may have any stride)."""
        strides = self.element_strides(a)
        if strides is None:
            return True
        order = _channels_last_perm(len(a.shape))[0] if layout == "channels_last" else range(len(a.shape))
        expected, step = [0] * len(a.shape), 1
        for d in reversed(list(order)):
            expected[d] = step
            step *= a.shape[d]
        return all(s == 1 or x == y for s, x, y in zip(a.shape, strides, expected))

    def __repr__(self):
        return f"{self.name}[{DEVICE_WORDS.get(self.device_type, self.device_type)}]"


def registered_libraries() -> list:
    """The ArrayLibrary instances that installed packages register (CONFORMANCE_GROUP), in
    entry-point order. An entry point that fails gives an :class:`UnloadableLibrary`, whose
    tests skip with the reason, rather than breaking the suite's collection."""
    found = []
    for ep in importlib.metadata.entry_points(group=CONFORMANCE_GROUP):
        try:
            libraries = list(ep.load()())
            bad = [lib for lib in libraries if not isinstance(lib, ArrayLibrary)]
            if bad:
                raise TypeError(f"{type(bad[0]).__name__} is not a flux_dnn.conformance.ArrayLibrary")
        except Exception as exc:  # noqa: BLE001 -- reported as the library's skip reason
            found.append(UnloadableLibrary(ep.name, f"entry point {ep.value!r} failed: {type(exc).__name__}: {exc}"))
            continue
        found.extend(libraries)
    return found


class UnloadableLibrary(ArrayLibrary):
    """A registered library whose entry point failed: every test of it skips saying why."""

    def __init__(self, name: str, reason: str):
        super().__init__()
        self.name, self.reason = name, reason

    def unavailable(self):
        return self.reason
