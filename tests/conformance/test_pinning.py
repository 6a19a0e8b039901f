"""The suite's own pin (conftest.ShimPin) must route every call to the pinned shim only, also
a call pattern that flux_dnn has remembered from before the pin moved; otherwise a backend's
tests would silently run on another shim."""

import itertools

import numpy as np
import pytest

import flux_dnn

from .conftest import DTYPES, discovered_backends, shim_capabilities


def _usable_by_device() -> dict:
    found = {}
    for b in discovered_backends():
        if b.status.usable and all(b.status.name != s.name for s, _ in found.get(b.status.device_type, [])):
            found.setdefault(b.status.device_type, []).append((b.status, b.selector))
    return found


def _calls(dtype):
    """Every public op on small NumPy arrays of dtype."""
    from .libraries import numpy_dtype

    x = np.ones((1, 2, 5, 5), numpy_dtype(dtype))
    w = np.ones((3, 2, 3, 3), numpy_dtype(dtype))
    dy = np.ones((1, 3, 3, 3), numpy_dtype(dtype))
    return {
        "conv": lambda: flux_dnn.conv(x, w),
        "conv_plan": lambda: flux_dnn.conv_plan(x, w)(x),
        "conv_backward_data": lambda: flux_dnn.conv_backward_data(dy, w, x.shape),
        "conv_backward_weight": lambda: flux_dnn.conv_backward_weight(x, dy, w.shape),
        "conv_transpose": lambda: flux_dnn.conv_transpose(dy, np.ones((3, 2, 3, 3), numpy_dtype(dtype))),
    }


def test_pin_leaves_only_the_pinned_shim(shim_pin):
    for statuses in _usable_by_device().values():
        for status, selector in statuses:
            shim_pin.pin(selector)
            usable = [s.name for s in flux_dnn.shims() if s.usable and s.device_type == status.device_type]
            assert usable == [status.name]


def test_pin_moves_remembered_calls_to_the_new_shim(shim_pin):
    """A dtype that shim A computes and shim B does not: calls warmed up under A must be
    refused under B, not served by A from memory."""
    from flux_dnn import _core

    cases = []
    for statuses in _usable_by_device().values():
        for (a, a_sel), (b, b_sel) in itertools.permutations(statuses, 2):
            shim_a, shim_b = _core.load_shim(a.path), _core.load_shim(b.path)
            for dtype in DTYPES:
                if a.device_type == 1 and all(
                    shim_capabilities(shim_a, op, dtype).computes and not shim_capabilities(shim_b, op, dtype).computes
                    for op in (_core.CONV_FORWARD, _core.CONV_BACKWARD_DATA, _core.CONV_BACKWARD_WEIGHT)
                ):
                    cases.append((a_sel, b_sel, dtype))
    if not cases:
        pytest.skip("no two CPU shims here differ in a dtype they compute")
    for a_sel, b_sel, dtype in cases:
        shim_pin.pin(a_sel)
        calls = _calls(dtype)
        for call in calls.values():
            call()
        shim_pin.pin(b_sel)
        for name, call in calls.items():
            with pytest.raises(TypeError, match=f"dtype {dtype} is not supported"):
                call()
                pytest.fail(f"{name} in {dtype} ran on the previously pinned shim {a_sel!r}")
