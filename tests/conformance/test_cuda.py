"""What only the CUDA shim (cuDNN) and CUDA devices have: cuDNN's fused conv + bias + ReLU
graph, and arrays on a second CUDA device (device switching through torch's and CuPy's own
APIs). Every device-generic check is in test_accelerators.py, which runs on every
accelerator shim. Without a CUDA backend these are skipped with the reason
(``python -m pytest tests/conformance -m accelerator``)."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

import flux_dnn
import reference as ref

from . import problems as P
from .libraries import CUDA, numpy_dtype
from .test_accelerators import _close, _geometry


def on_cuda(lib) -> bool:
    """on a CUDA device"""
    return lib.device_type == CUDA


@pytest.mark.matrix(libraries="first", where=on_cuda)
def test_nhwc_float16_bias_relu_runs_fused(backend, rng, record_property):
    """One case cuDNN's fusion engines exist for: conv + bias + ReLU, NHWC float16. Unfused,
    results stay right (our epilogue kernel), so only this assertion notices a refused graph."""
    if backend.shim != "cudnn":
        pytest.skip(f"fusion is cuDNN's; this backend's shim is {backend.shim!r}")
    dtype = "float16"
    backend.require("forward", dtype, 2, activation="relu", layout="channels_last")
    lib = backend.lib
    x, w, b = P.grid(rng, (8, 64, 28, 28)), P.grid(rng, (64, 64, 3, 3)) / 8, P.grid(rng, (64,))
    plan = flux_dnn.conv_plan(
        lib.array(x, dtype, "channels_last"),
        lib.array(w, dtype, "channels_last"),
        lib.array(b, dtype),
        padding=1,
        activation="relu",
    )
    record_property("algorithm", plan.algorithm)  # the GPU check's table shows it, pass or fail
    assert "fused" in plan.algorithm, plan.algorithm
    got = plan(lib.array(x, dtype, "channels_last"))
    _close(lib, got, ref.epilogue(ref.conv_forward(x, w, b, (1, 1), (1, 1), (1, 1)), activation="relu"), dtype, "fused")


# ---- a second device -------------------------------------------------------------------------


def _device_count(lib) -> int:
    if lib.name == "torch":
        return lib.module.cuda.device_count()
    if lib.name == "cupy":
        return lib.module.cuda.runtime.getDeviceCount()
    if lib.name == "jax":
        return len(lib.module.devices(lib.platform))
    return 0


def _on_device(lib, index):
    if lib.name == "torch":
        return lib.module.cuda.device(index)
    if lib.name == "cupy":
        return lib.module.cuda.Device(index)
    return contextlib.nullcontext()  # JAX: arrays are placed explicitly (_array_on)


def _array_on(lib, values, dtype, device):
    """lib's array of values on CUDA device `device` (current there for torch and CuPy)."""
    if lib.name == "jax":  # (the suite's JAX arrays go to the first GPU)
        return lib.module.device_put(
            np.asarray(values).astype(numpy_dtype(dtype)), lib.module.devices(lib.platform)[device]
        )
    return lib.array(values, dtype)


@pytest.mark.matrix(where=on_cuda)
def test_second_device(backend, rng):
    """Arrays on device 1 are computed there (the shim makes that device current for the call
    and puts the caller's back), and device 0 still works after."""
    lib = backend.lib
    count = _device_count(lib)
    if count < 2:
        pytest.skip(f"one CUDA device here ({lib.name} sees {count}): the multi-device test needs two")
    dtype = "float32"
    backend.require("forward", dtype, 2)
    g = _geometry()
    for device in (1, 0):
        x, w, b = P.grid(rng, g.x_shape), P.grid(rng, g.w_shape), P.grid(rng, (g.K,))
        with _on_device(lib, device):
            xd, wd, bd = (_array_on(lib, v, dtype, device) for v in (x, w, b))
            got = flux_dnn.conv(xd, wd, bd, **g.kwargs(), activation="relu")
            if lib.name == "torch":
                assert got.device.index == device, got.device
            elif lib.name == "cupy":
                assert got.device.id == device, got.device
            elif lib.name == "jax":
                assert {d.id for d in got.devices()} == {device}, got.devices()
            _close(
                lib,
                got,
                ref.epilogue(ref.conv_forward(x, w, b, *g.ref()), activation="relu"),
                dtype,
                f"device {device}",
            )
