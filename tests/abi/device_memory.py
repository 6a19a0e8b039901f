"""Host-visible device memory for the suites that drive a shim through ctypes, without an
array library (the ABI suite, the fuzzer): memory of a device type that the host reads and
writes through the same pointer, such as SYCL's USM shared memory. With it, a device shim's
problems execute and are checked on the host, as a CPU shim's are.

A plug-in registers one for its device type in the entry-point group
``flux_dnn.host_visible_memory``: a zero-argument callable returning an object with

- ``device_type``: the DLPack device type it serves;
- ``available() -> bool``: whether it can allocate here (a runtime and a device);
- ``stream() -> int | None``: the shim's stream for calls on this memory (a ``sycl::queue*``);
- ``empty(shape, dtype) -> numpy.ndarray``: a C-contiguous array in that memory, whose
  ``ctypes.data`` is the pointer the shim receives (kept alive by the array).

The suite names no vendor here (flux-dnn-sycl registers SYCL's USM shared memory)."""

from __future__ import annotations

import functools
import importlib.metadata

import numpy as np

GROUP = "flux_dnn.host_visible_memory"


@functools.cache
def for_device(device_type: int):
    """The available host-visible memory of device_type, or None (the suite then treats the
    shim's device memory as out of the host's reach: descriptors only)."""
    registered = []
    for ep in importlib.metadata.entry_points(group=GROUP):
        try:
            registered.append(ep.load()())
        except Exception:  # noqa: BLE001, S112 -- a broken plug-in leaves its device without memory
            continue
    for memory in registered:
        if memory.device_type == device_type and memory.available():
            return memory
    return None


def copy(memory, a: np.ndarray) -> np.ndarray:
    """a's values in memory, same shape and dtype."""
    out = memory.empty(a.shape, a.dtype)
    out[...] = a
    return out
