"""USM shared memory for suites that drive the onednn_sycl shim through ctypes (flux_dnn's ABI
suite and fuzzer), registered in the entry-point group ``flux_dnn.host_visible_memory``.

A USM shared allocation is device memory that the host reads and writes through the same
pointer, so the suite's NumPy arrays can live there: each is a NumPy view of a dpctl
``MemoryUSMShared`` block, its ``ctypes.data`` the USM pointer the shim receives, and every
check that reads results on the host reads them in place. The shim's stream is a dpctl
in-order queue on device 0 (``queue()``). Without dpctl or a SYCL device, ``available()`` is
False and the suite treats a oneAPI shim as any device shim (descriptors only). The suites
reach it through their device_memory.py, which reads that entry point (``memory()``).

The onednn_sycl shim returns once its work is queued (the ABI's rule for device shims), and the
suites read results on the host right after Conv_Plan_Execute, with no queue to wait on: the
interface has no synchronisation step. So this module sets FLUX_DNN_SYCL_BLOCKING=1 (unless
set), which makes the shim wait for its own work before returning, as CUDA_LAUNCH_BLOCKING does
for CUDA; tests/test_onednn_sycl.py covers the asynchronous path."""

from __future__ import annotations

import functools
import os
import sys

import numpy as np

device_type = 14  # DLPack's kDLOneAPI (the interface of the suites' device_memory.py)


@functools.cache
def queue():
    """An in-order dpctl queue on the first SYCL device, or None."""
    try:
        import dpctl
        import dpctl.memory  # noqa: F401
    except ImportError:
        return None
    if dpctl.get_num_devices() == 0:
        return None
    return dpctl.SyclQueue(dpctl.get_devices()[0], property="in_order")


def available() -> bool:
    os.environ.setdefault("FLUX_DNN_SYCL_BLOCKING", "1")  # before any execute on this memory
    return queue() is not None


def stream() -> int | None:
    q = queue()
    return None if q is None else q.addressof_ref()


def empty(shape, dtype) -> np.ndarray:
    """A C-contiguous NumPy array in USM shared memory (kept alive by the array)."""
    import dpctl.memory

    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64))
    mem = dpctl.memory.MemoryUSMShared(max(n * dtype.itemsize, 64), queue=queue())
    return np.frombuffer(mem, dtype=dtype, count=n).reshape(shape)


def copy(a: np.ndarray) -> np.ndarray:
    """a's values in a USM shared array of the same shape and dtype."""
    out = empty(a.shape, a.dtype)
    out[...] = a
    return out


def workspace(nbytes: int) -> np.ndarray:
    return empty((nbytes,), np.uint8)


def memory():
    """The entry point: this module, which has the interface's names (device_type,
    available, stream, empty)."""
    return sys.modules[__name__]
