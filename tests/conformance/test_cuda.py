"""What only the CUDA shim (cuDNN) has: its fused conv + bias + ReLU graph. Every
device-generic check is in test_accelerators.py, which runs on every accelerator shim.
Without a CUDA backend these are skipped with the reason (``python -m pytest
tests/conformance -m accelerator``)."""

from __future__ import annotations

import pytest

import flux_dnn
import reference as ref

from . import problems as P
from .libraries import CUDA
from .test_accelerators import _close


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
