"""What a shim of a device other than the CPU must get right that the matrix's random draws
reach only by chance, for every such shim and array library (the way PyTorch's
instantiate_device_type_tests runs one suite on every backend): threads on one plan and on
many, forward without bias, GELU (erf), inputs whose data pointer is one element off, beta !=
0 inside every op, the no-workspace fallback where the shim needs scratch of its own, size-1
dims, a large deterministic bias gradient, a bias gradient of more channels than a CUDA grid
dim holds, NaN through ReLU, asymmetric padding, views with gaps and repeated elements on
every operand (what a vendor may refuse as given, which the shim then copies through its
workspace), and a second device. The backends are the usable accelerator shims crossed with the array libraries
of their devices (flux-dnn's own and those plug-ins register); a shim that cannot run here
gives skipped tests with the reason (``python -m pytest tests/conformance -m accelerator``).
What is one vendor's alone (cuDNN's fused graph) is in test_cuda.py."""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import flux_dnn
import reference as ref

from . import problems as P
from .libraries import LAYOUTS, off_cpu

DTYPES_16_32 = ("float32", "float16")


def on_accelerator(lib) -> bool:
    """on a device other than the CPU"""
    return off_cpu(lib)


def strided_on_accelerator(lib) -> bool:
    """on a device other than the CPU, with strides (views, offsets, channels-last)"""
    return off_cpu(lib) and lib.strided


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


@pytest.mark.matrix(libraries="first", where=on_accelerator)
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


@pytest.mark.matrix(libraries="first", where=on_accelerator, layout=LAYOUTS, activation=(None, "relu", "silu"))
def test_forward_without_bias(backend, rng, layout, activation):
    dtype = "float32"
    backend.require("forward", dtype, 2, activation=activation, layout=layout)
    e = P.Epilogue(bias=False, activation=activation, use_out=backend.lib.writable)
    P.run_op("forward", backend, rng, dtype, layout, _geometry(), e)


@pytest.mark.matrix(where=on_accelerator, dtype=("float32", "float16"), bias=(True, False), layout=LAYOUTS)
def test_gelu_erf(backend, rng, dtype, bias, layout):
    """GELU with erf (cuDNN's GELU_FWD when fused, erf in our kernel otherwise)."""
    backend.require("forward", dtype, 2, activation="gelu", layout=layout)
    e = P.Epilogue(bias=bias, activation="gelu")
    P.run_op("forward", backend, rng, dtype, layout, _geometry(C=16, K=32), e)


@pytest.mark.matrix(
    libraries="first", where=on_accelerator, op=("forward", "backward_data", "backward_weight_bias", "transposed")
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


# ---- pointers, layouts, size-1 dims ---------------------------------------------------------


def _offset_by_one(lib, values, dtype):
    """An array whose first element is one element past an aligned address (a view)."""
    flat = lib.array(np.concatenate([[0.0], np.asarray(values, dtype=np.float64).ravel()]), dtype)
    return lib.reshape(flat[1:], values.shape)


@pytest.mark.matrix(where=strided_on_accelerator, dtype=("float32", "float16"), which=("x", "w", "y", "bias"))
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


@pytest.mark.matrix(where=strided_on_accelerator, case=("C1_nhwc", "W1_nhwc", "H1W1_nhwc", "C1_nchw", "K1"))
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


@pytest.mark.matrix(
    libraries="first", where=strided_on_accelerator, op=("forward", "backward_data", "backward_weight_bias")
)
def test_workspace_limit_zero_where_the_shim_needs_scratch(backend, rng, op):
    """workspace_limit=0 is the core's fallback when the array library refuses workspace.
    Where the shim would stage w (channels-last x, w in the other order), with a bias and
    beta != 0, it computes right, or refuses naming the workspace (the MIOpen shim, whose
    copies need scratch). The cuDNN shim has a path without copies: it must compute."""
    dtype = "float32"
    backend.require(op, dtype, 2, layout="channels_last", features=_features(op, "alpha_beta"))
    lib = backend.lib
    g = _geometry(C=16, K=32)
    # channels-last x and dy with a w in NCHW order: the shim's staged-w case
    e = P.Epilogue(bias=op == "forward", alpha=1.0, beta=0.5 if lib.writable else 0.0, use_out=lib.writable)
    try:
        P.run_op(op, backend, rng, dtype, "channels_last", g, e, workspace_limit=0)
    except flux_dnn.UnsupportedError as exc:
        if backend.shim == "cudnn":
            raise
        assert "workspace" in str(exc), exc


@pytest.mark.matrix(libraries="first", where=on_accelerator)
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


# ---- repeated elements, NaN ------------------------------------------------------------------


def _repeated(lib, values, dtype, shape, layout="contiguous"):
    """values (a leading dim of size 1) repeated to `shape` without a copy: stride 0 where
    values has size 1, as torch's expand and CuPy's broadcast_to give."""
    repeated = lib.repeated(lib.array(values, dtype, layout), shape)
    if repeated is None:
        pytest.skip(f"{lib.name} has no views that repeat an element")
    return repeated


@pytest.mark.matrix(libraries="first", where=strided_on_accelerator, activation=(None, "relu"), layout=LAYOUTS)
def test_repeated_bias(backend, rng, activation, layout):
    """A bias of stride 0 (torch's b0.expand(K)): one value for every channel, never K values
    read from a buffer of one (cuDNN takes no stride 0: such a bias is added by our epilogue)."""
    dtype = "float32"
    backend.require("forward", dtype, 2, activation=activation, layout=layout)
    lib = backend.lib
    g = _geometry(C=8, K=16)
    x, w, b0 = P.grid(rng, g.x_shape), P.grid(rng, g.w_shape), P.grid(rng, (1,))
    b = np.broadcast_to(b0, (g.K,))
    expected = ref.epilogue(ref.conv_forward(x, w, b, *g.ref()), activation=activation)
    bias = _repeated(lib, b0, dtype, (g.K,))
    got = flux_dnn.conv(
        lib.array(x, dtype, layout), lib.array(w, dtype, layout), bias, **g.kwargs(), activation=activation
    )
    _close(lib, got, expected, dtype, "repeated bias")


@pytest.mark.matrix(libraries="first", where=strided_on_accelerator, fused=(True, False))
def test_nan_stays_nan_through_relu(backend, rng, fused):
    """ReLU keeps NaN (torch.relu(nan) is nan), in cuDNN's fused graph (NaN propagation set)
    and in our epilogue (alpha != 1 is never fused); every other element is right."""
    dtype = "float16"
    backend.require("forward", dtype, 2, activation="relu", layout="channels_last", features=("alpha_beta",))
    lib = backend.lib
    g = _geometry(N=2, C=32, K=32, size=8, kernel=1, pad=0)
    x, w, b = P.grid(rng, g.x_shape), P.grid(rng, g.w_shape) / 4, P.grid(rng, (g.K,))
    x[1, 3, 5, 2] = np.nan  # a 1x1 kernel: output pixel (1, :, 5, 2) only
    alpha = 1.0 if fused else 0.5
    expected = ref.epilogue(ref.conv_forward(x, w, b, *g.ref()), alpha, activation="relu")
    plan = flux_dnn.conv_plan(
        lib.array(x, dtype, "channels_last"),
        lib.array(w, dtype, "channels_last"),
        lib.array(b, dtype),
        **g.kwargs(),
        activation="relu",
        alpha=alpha,
    )
    assert fused or "fused" not in plan.algorithm, plan.algorithm
    got = lib.numpy(plan(lib.array(x, dtype, "channels_last")))
    nan = np.isnan(expected)
    assert nan[1, :, 5, 2].all() and nan.sum() == g.K, "the reference has NaN where the input's reaches"
    assert np.array_equal(np.isnan(got), nan), f"NaN where expected: {np.isnan(got)[nan].mean():.2f} ({plan.algorithm})"
    tol = P.TOLERANCE[dtype]
    np.testing.assert_allclose(got[~nan], expected[~nan], rtol=tol, atol=tol * np.abs(expected[~nan]).max())


# ---- what cuDNN may refuse as given: asymmetric padding, gaps, repeated elements -------------


def _asymmetric(nd, N=2, C=8, K=16, size=9):
    """pre != post padding in every spatial dim (kernel 3): (2, 0) in 1-D, (0, 2) and (1, 0)
    in 2-D, so the larger side is before in one dim and after in another."""
    lo, hi = {1: ((2,), (0,)), 2: ((0, 1), (2, 0))}[nd]
    g = _geometry(nd=nd, N=N, C=C, K=K, size=size, pad=0)
    return dataclasses.replace(g, lo=lo, hi=hi, padding=tuple(zip(lo, hi)), form="pairs")


@pytest.mark.matrix(
    libraries="first",
    where=on_accelerator,
    op=("forward", "backward_data", "backward_weight"),
    nd=(1, 2),
    dtype=("float32", "float16"),
    layout=LAYOUTS,
)
def test_asymmetric_padding(backend, rng, op, nd, dtype, layout):
    """pre != post padding, with alpha and beta: cuDNN's own pre/post paddings, or, where it
    has no engine for them, x zero-padded by the difference in the workspace (dx cropped out
    of such a buffer), checked against float64 either way."""
    backend.require(op, dtype, nd, layout=layout, features=("alpha_beta",))
    lib = backend.lib
    e = P.Epilogue(bias=op == "forward", alpha=-1.5, beta=0.5 if lib.writable else 0.0, use_out=lib.writable)
    P.run_op(op, backend, rng, dtype, layout, _asymmetric(nd), e)


@pytest.mark.matrix(
    libraries="first", where=strided_on_accelerator, op=("forward", "backward_data", "backward_weight"), layout=LAYOUTS
)
def test_repeated_input_with_asymmetric_padding(backend, rng, op, layout):
    """The operand an op only reads, repeating one image over the batch (stride 0): cuDNN
    takes no stride 0, so the shim copies it compactly (x zero-padded for the asymmetric
    padding, dx computed padded and cropped out with beta). Against float64; the forward plan's
    name says a padded copy ran."""
    dtype = "float32"
    backend.require(op, dtype, 2, layout=layout, features=("alpha_beta",))
    lib = backend.lib
    g = _asymmetric(2)
    beta = 0.5 if lib.writable else 0.0
    read = g.y_shape if op == "backward_data" else g.x_shape
    one = P.grid(rng, (1, *read[1:]))
    repeated = np.broadcast_to(one, read)
    arr = _repeated(lib, one, dtype, read, layout)
    w = P.grid(rng, g.w_shape)
    if op == "forward":
        old = P.grid(rng, g.y_shape)
        out = lib.array(old, dtype, layout) if lib.writable else None
        expected = ref.epilogue(ref.conv_forward(repeated, w, None, *g.ref()), 0.5, beta, old)
        if backend.shim == "cudnn":  # cuDNN takes no stride 0: its shim names the copy it made
            plan = flux_dnn.conv_plan(arr, lib.array(w, dtype), **g.kwargs(), alpha=0.5)
            assert "padded copy" in plan.algorithm, plan.algorithm
        got = flux_dnn.conv(arr, lib.array(w, dtype), **g.kwargs(), alpha=0.5, beta=beta, out=out)
    elif op == "backward_data":
        old = P.grid(rng, g.x_shape)
        out = lib.array(old, dtype, layout) if lib.writable else None
        expected = ref.epilogue(ref.conv_backward_data(repeated, w, g.x_shape, *g.ref()), 0.5, beta, old)
        got = flux_dnn.conv_backward_data(
            arr, lib.array(w, dtype), g.x_shape, **g.kwargs(), alpha=0.5, beta=beta, out=out
        )
    else:
        dy, old = P.grid(rng, g.y_shape), P.grid(rng, g.w_shape)
        out = lib.array(old, dtype) if lib.writable else None
        expected = ref.epilogue(ref.conv_backward_weight(repeated, dy, g.w_shape, *g.ref()), 0.5, beta, old)
        got = flux_dnn.conv_backward_weight(
            arr, lib.array(dy, dtype, layout), g.w_shape, **g.kwargs(), alpha=0.5, beta=beta, out=out
        )
    _close(lib, got, expected, dtype, f"{op} of a repeated input")


def _gapped(lib, values, dtype, layout, axis):
    """values as a view with gaps: every other element of `axis` of an array twice as long
    there (the elements between hold 7, which nothing may read or write)."""
    shape = list(values.shape)
    shape[axis] *= 2
    big = np.full(shape, 7.0)
    index = [slice(None)] * len(shape)
    index[axis] = slice(0, None, 2)
    big[tuple(index)] = values
    arr = lib.array(big, dtype, layout)
    return arr, arr[tuple(index)], tuple(index)


@pytest.mark.matrix(
    libraries="first",
    where=strided_on_accelerator,
    op=("forward", "backward_data", "backward_weight"),
    dtype=DTYPES_16_32,
)
def test_views_with_gaps_on_every_operand(backend, rng, op, dtype):
    """Every operand a view with gaps (channels of x, the width of dy, the output's width, or
    dw's input channels): read through its strides, the output written only at its own
    elements with beta (the shim may copy each compactly through its workspace)."""
    backend.require(op, dtype, 2, features=("alpha_beta",))
    lib = backend.lib
    if not lib.writable:
        pytest.skip(f"{lib.name} arrays cannot be accumulated into (no out=)")
    g = _geometry(C=6, K=8, size=7, pad=(1, 2))
    x, w, dy = P.grid(rng, g.x_shape), P.grid(rng, g.w_shape), P.grid(rng, g.y_shape)
    xd, dyd = _gapped(lib, x, dtype, "contiguous", 1)[1], _gapped(lib, dy, dtype, "contiguous", 3)[1]
    out_shape = {"forward": g.y_shape, "backward_data": g.x_shape, "backward_weight": g.w_shape}[op]
    old = P.grid(rng, out_shape)
    big, view, index = _gapped(lib, old, dtype, "contiguous", 3 if op != "backward_weight" else 1)
    if op == "forward":
        expected = ref.epilogue(ref.conv_forward(x, w, None, *g.ref()), 0.5, 1.0, old)
        got = flux_dnn.conv(xd, lib.array(w, dtype), **g.kwargs(), alpha=0.5, beta=1.0, out=view)
    elif op == "backward_data":
        expected = ref.epilogue(ref.conv_backward_data(dy, w, g.x_shape, *g.ref()), 0.5, 1.0, old)
        got = flux_dnn.conv_backward_data(
            dyd, lib.array(w, dtype), g.x_shape, **g.kwargs(), alpha=0.5, beta=1.0, out=view
        )
    else:
        expected = ref.epilogue(ref.conv_backward_weight(x, dy, g.w_shape, *g.ref()), 0.5, 1.0, old)
        got = flux_dnn.conv_backward_weight(xd, dyd, g.w_shape, **g.kwargs(), alpha=0.5, beta=1.0, out=view)
    assert got is view
    _close(lib, view, expected, dtype, f"{op} into a view with gaps")
    between = np.ones(lib.numpy(big).shape, bool)
    between[index] = False
    assert (lib.numpy(big)[between] == 7.0).all(), "elements between the output's were written"


# ---- the bias gradient ---------------------------------------------------------------------


@pytest.mark.matrix(libraries="first", where=strided_on_accelerator, layout=LAYOUTS)
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


@pytest.mark.matrix(libraries="first", where=strided_on_accelerator, layout=LAYOUTS)
def test_bias_gradient_of_more_channels_than_a_grid_dim(backend, rng, layout):
    """K = 70000 channels: more than a CUDA grid's y dim takes (65535), where the bias
    gradient once put its channels; dy is (1, K, 2, 1), 0.6 MB in float32."""
    dtype = "float32"
    backend.require("backward_weight", dtype, 2, features=("bias_gradient",), layout=layout)
    lib = backend.lib
    K = 70000
    x, dy = P.grid(rng, (1, 1, 2, 1)), P.grid(rng, (1, K, 2, 1))
    dw, db = flux_dnn.conv_backward_weight(
        lib.array(x, dtype, layout), lib.array(dy, dtype, layout), (K, 1, 1, 1), bias_grad=True
    )
    _close(lib, db, dy.sum(axis=(0, 2, 3)), dtype, "bias gradient of 70000 channels")
    _close(lib, dw, ref.conv_backward_weight(x, dy, (K, 1, 1, 1), (1, 1), (0, 0), (0, 0)), dtype, "dw")


# ---- benchmark -------------------------------------------------------------------------------


@pytest.mark.matrix(libraries="first", where=on_accelerator, layout=LAYOUTS)
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


@pytest.mark.matrix(where=on_accelerator)
def test_second_device(backend, rng):
    """Arrays on device 1 are computed there (the shim makes that device current for the call
    and puts the caller's back), and device 0 still works after."""
    lib = backend.lib
    count = lib.device_count()
    if count < 2:
        pytest.skip(f"one device here ({lib.name} sees {count}): the multi-device test needs two")
    dtype = "float32"
    backend.require("forward", dtype, 2)
    g = _geometry()
    for device in (1, 0):
        x, w, b = P.grid(rng, g.x_shape), P.grid(rng, g.w_shape), P.grid(rng, (g.K,))
        with lib.on_device(device):
            xd, wd, bd = (lib.array_on(v, dtype, device) for v in (x, w, b))
            got = flux_dnn.conv(xd, wd, bd, **g.kwargs(), activation="relu")
            assert lib.device_index(got) == device
            _close(
                lib,
                got,
                ref.epilogue(ref.conv_forward(x, w, b, *g.ref()), activation="relu"),
                dtype,
                f"device {device}",
            )
