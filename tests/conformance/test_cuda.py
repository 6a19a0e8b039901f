"""What a GPU shim (cuDNN's now) must get right that the matrix's random draws reach only by
chance: threads on one plan and on many, forward without bias, GELU (erf), inputs whose data
pointer is one element off, beta != 0 inside every op, the no-workspace fallback where the shim
needs scratch of its own, size-1 dims, a large deterministic bias gradient, that a fusable case
does fuse, and a second device. Every test here runs on CUDA backends only; without one it is
skipped with the reason (``python -m pytest tests/conformance -m accelerator``)."""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import flux_dnn
import reference as ref

from . import problems as P
from .libraries import CUDA, LAYOUTS, numpy_dtype


def on_cuda(lib) -> bool:
    """on a CUDA device"""
    return lib.device_type == CUDA


def strided_on_cuda(lib) -> bool:
    """on a CUDA device, with strides (views, offsets, channels-last)"""
    return lib.device_type == CUDA and lib.strided


def _geometry(nd=2, N=2, C=8, K=16, size=12, kernel=3, pad=1, stride=1, groups=1):
    """A fixed geometry; size, kernel and pad are an int (every dim) or a tuple per dim."""

    def per_dim(v):
        return tuple(v) if isinstance(v, tuple) else (v,) * nd

    return P.Geometry(
        nd=nd,
        N=N,
        C=C,
        K=K,
        groups=groups,
        kernel=per_dim(kernel),
        stride=per_dim(stride),
        dilation=(1,) * nd,
        lo=per_dim(pad),
        hi=per_dim(pad),
        spatial=per_dim(size),
        padding=per_dim(pad),
        form="tuple",
    )


def _features(op, *features) -> tuple:
    return (*features, "bias_gradient") if op == "backward_weight_bias" else features


def _close(lib, got, expected, dtype, what):
    P.assert_close(lib, got, expected, dtype, what, what)


# ---- threads ------------------------------------------------------------------------------


@pytest.mark.matrix(libraries="first", where=on_cuda)
def test_threads_on_one_plan_and_on_many(backend, rng):
    """8 threads at once: one conv_plan shared by all, and one problem of each thread's own
    (each a plan of its own). cuDNN execution plans are per thread (per handle): each thread's
    first call makes its own from the chosen engine, while others run theirs."""
    dtype = "float32"
    backend.require("forward", dtype, 2)
    lib = backend.lib
    x, w = P.grid(rng, (4, 8, 16, 16)), P.grid(rng, (8, 8, 3, 3))
    shared_expected = ref.conv_forward(x, w, None, (1, 1), (1, 1), (1, 1))
    xd, wd = lib.array(x, dtype), lib.array(w, dtype)
    plan = flux_dnn.conv_plan(xd, wd, padding=1)
    own = []
    for t in range(8):  # a different channel count per thread: a different plan each
        xt, wt = P.grid(rng, (2, 4 + t, 10, 10)), P.grid(rng, (6, 4 + t, 3, 3))
        own.append((lib.array(xt, dtype), lib.array(wt, dtype), ref.conv_forward(xt, wt, None, (1, 1), (1, 1), (1, 1))))

    def work(t):
        results = []
        for _ in range(4):
            results.append((lib.numpy(plan(xd)), shared_expected))
            xt, wt, expected = own[t]
            results.append((lib.numpy(flux_dnn.conv2d(xt, wt, padding=1)), expected))
        lib.synchronize()
        return results

    with ThreadPoolExecutor(8) as pool:
        for results in pool.map(work, range(8)):
            for got, expected in results:
                np.testing.assert_allclose(got, expected, rtol=2e-4, atol=2e-4 * np.abs(expected).max())


# ---- forward epilogues --------------------------------------------------------------------


@pytest.mark.matrix(libraries="first", where=on_cuda, layout=LAYOUTS, activation=(None, "relu", "silu"))
def test_forward_without_bias(backend, rng, layout, activation):
    dtype = "float32"
    backend.require("forward", dtype, 2, activation=activation, layout=layout)
    e = P.Epilogue(bias=False, activation=activation, use_out=backend.lib.writable)
    P.run_op("forward", backend, rng, dtype, layout, _geometry(), e)


@pytest.mark.matrix(where=on_cuda, dtype=("float32", "float16"), bias=(True, False), layout=LAYOUTS)
def test_gelu_erf(backend, rng, dtype, bias, layout):
    """GELU with erf (cuDNN's GELU_FWD when fused, erf in our kernel otherwise)."""
    backend.require("forward", dtype, 2, activation="gelu", layout=layout)
    e = P.Epilogue(bias=bias, activation="gelu")
    P.run_op("forward", backend, rng, dtype, layout, _geometry(C=16, K=32), e)


@pytest.mark.matrix(
    libraries="first", where=on_cuda, op=("forward", "backward_data", "backward_weight_bias", "transposed")
)
def test_beta_accumulates_in_each_op(backend, rng, op):
    """beta != 0 inside cuDNN's operation (backward ops; forward without epilogue or with a
    bias alone) and in our epilogue (forward with an activation)."""
    dtype = "float32"
    backend.require(op, dtype, 2, features=_features(op, "alpha_beta"))
    if not backend.lib.writable:
        pytest.skip(f"{backend.lib.name} arrays cannot be accumulated into (no out=)")
    cases = [P.Epilogue(alpha=a, beta=b, use_out=True) for a, b in ((1.0, 0.5), (-1.5, 1.0))]
    if op == "forward":
        cases += [
            P.Epilogue(bias=True, alpha=0.5, beta=0.5, use_out=True),
            P.Epilogue(bias=True, activation="relu", alpha=1.0, beta=0.5, use_out=True),
            P.Epilogue(bias=False, activation="tanh", alpha=-1.5, beta=1.0, use_out=True),
        ]
    g = _geometry() if op != "transposed" else P.draw_transposed(rng, 2, "int", grouped=False, dilated=False)
    for e in cases:
        P.run_op(op, backend, rng, dtype, "contiguous", g, e)


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


# ---- pointers, layouts, size-1 dims ---------------------------------------------------------


def _offset_by_one(lib, values, dtype):
    """An array whose first element is one element past an aligned address (a view)."""
    flat = lib.array(np.concatenate([[0.0], np.asarray(values, dtype=np.float64).ravel()]), dtype)
    return flat[1:].reshape(values.shape)


@pytest.mark.matrix(where=strided_on_cuda, dtype=("float32", "float16"), which=("x", "w", "y", "bias"))
def test_misaligned_operand(backend, rng, dtype, which):
    """A data pointer one element past alignment (a slice of a larger array): planned with
    that pointer, computed right, never read past its end."""
    backend.require("forward", dtype, 2)
    lib = backend.lib
    g = _geometry(C=8, K=8)
    x, w, b = P.grid(rng, g.x_shape), P.grid(rng, g.w_shape), P.grid(rng, (g.K,))
    expected = ref.conv_forward(x, w, b, *g.ref())
    arrays = {
        "x": _offset_by_one(lib, x, dtype) if which == "x" else lib.array(x, dtype),
        "w": _offset_by_one(lib, w, dtype) if which == "w" else lib.array(w, dtype),
        "bias": _offset_by_one(lib, b, dtype) if which == "bias" else lib.array(b, dtype),
    }
    out = _offset_by_one(lib, np.full(g.y_shape, np.nan), dtype) if which == "y" else None
    got = flux_dnn.conv(arrays["x"], arrays["w"], arrays["bias"], **g.kwargs(), out=out)
    _close(lib, got, expected, dtype, f"misaligned {which}")


@pytest.mark.matrix(where=strided_on_cuda, case=("C1_nhwc", "W1_nhwc", "H1W1_nhwc", "C1_nchw", "K1"))
def test_size_one_dims(backend, rng, case):
    """Size-1 dims: their strides are arbitrary (canonicalised by the shim), and a tensor with
    one channel or width 1 is still seen as channels-last when its model is."""
    dtype = "float32"
    backend.require("forward", dtype, 2, layout="channels_last")
    backend.require("backward_weight_bias", dtype, 2, layout="channels_last", features=("bias_gradient",))
    sizes = {
        "C1_nhwc": dict(C=1, size=16),
        "W1_nhwc": dict(C=8, size=(12, 1), kernel=(3, 1), pad=(1, 0)),
        "H1W1_nhwc": dict(C=8, size=1, kernel=1, pad=0),
        "C1_nchw": dict(C=1, size=16),
        "K1": dict(C=8, K=1),
    }[case]
    g = _geometry(**sizes)
    layout = "contiguous" if case.endswith("nchw") else "channels_last"
    P.run_op("forward", backend, rng, dtype, layout, g, P.Epilogue(bias=True, activation="relu"))
    P.run_op("backward_weight_bias", backend, rng, dtype, layout, g, P.Epilogue())
    P.run_op("backward_data", backend, rng, dtype, layout, g, P.Epilogue())


# ---- the no-workspace fallback -------------------------------------------------------------


@pytest.mark.matrix(libraries="first", where=strided_on_cuda, op=("forward", "backward_data", "backward_weight_bias"))
def test_workspace_limit_zero_where_the_shim_needs_scratch(backend, rng, op):
    """workspace_limit=0 is the core's fallback when the array library refuses workspace. It
    must compute where the shim would stage w (channels-last x, w in the other order), and
    with a bias and beta != 0."""
    dtype = "float32"
    backend.require(op, dtype, 2, layout="channels_last", features=_features(op, "alpha_beta"))
    lib = backend.lib
    g = _geometry(C=16, K=32)
    # channels-last x and dy with a w in NCHW order: the shim's staged-w case
    e = P.Epilogue(bias=op == "forward", alpha=1.0, beta=0.5 if lib.writable else 0.0, use_out=lib.writable)
    P.run_op(op, backend, rng, dtype, "channels_last", g, e, workspace_limit=0)


@pytest.mark.matrix(libraries="first", where=on_cuda)
def test_activation_with_beta_at_limit_zero_is_refused_or_computed(backend, rng):
    """act(conv) + beta * y_old needs the conv result apart from y: at limit 0 a shim refuses
    naming the workspace (the cuDNN shim), or computes it right."""
    dtype = "float32"
    backend.require("forward", dtype, 2, activation="relu", features=("alpha_beta",))
    if not backend.lib.writable:
        pytest.skip(f"{backend.lib.name} arrays cannot be accumulated into (no out=)")
    e = P.Epilogue(bias=True, activation="relu", beta=0.5, use_out=True)
    try:
        P.run_op("forward", backend, rng, dtype, "contiguous", _geometry(), e, workspace_limit=0)
    except flux_dnn.UnsupportedError as exc:
        assert "workspace" in str(exc), exc


# ---- the bias gradient ---------------------------------------------------------------------


@pytest.mark.matrix(libraries="first", where=strided_on_cuda, layout=LAYOUTS)
def test_large_bias_gradient_is_right_and_deterministic(backend, rng, layout):
    """A bias gradient over 6.4 million elements (many chunks of the two-pass reduction):
    right against float64, and bitwise the same on every run."""
    dtype = "float32"
    backend.require("backward_weight", dtype, 2, features=("bias_gradient", "deterministic"), layout=layout)
    lib = backend.lib
    dy = P.grid(rng, (32, 64, 56, 56))
    x = P.grid(rng, (32, 16, 56, 56))
    dyd, xd = lib.array(dy, dtype, layout), lib.array(x, dtype, layout)
    runs = [
        lib.numpy(flux_dnn.conv_backward_weight(xd, dyd, (64, 16, 1, 1), bias_grad=True, deterministic=True)[1])
        for _ in range(3)
    ]
    expected = dy.sum(axis=(0, 2, 3))
    np.testing.assert_allclose(runs[0], expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())
    assert all(np.array_equal(runs[0], r) for r in runs[1:]), "bias gradient differs between runs"


# ---- benchmark -------------------------------------------------------------------------------


@pytest.mark.matrix(libraries="first", where=on_cuda, layout=LAYOUTS)
def test_benchmark_with_a_fusable_epilogue_computes(backend, rng, layout):
    """Benchmark times the fused graph against conv + epilogue and keeps either: both right."""
    dtype = "float16"
    backend.require("forward", dtype, 2, activation="relu", layout=layout, features=("benchmark",))
    P.run_op(
        "forward",
        backend,
        rng,
        dtype,
        layout,
        _geometry(N=4, C=32, K=32, size=28),
        P.Epilogue(bias=True, activation="relu"),
        algorithm="benchmark",
    )


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
