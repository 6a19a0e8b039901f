"""What the MIOpen shim must get right that the matrix's random draws reach only by chance,
one case per defect class of the MIOpen review (shared/reviews/miopen.md, issue 26): a bias on
channels-last outputs (MIOpen's bias kernel indexes as NCHW), permuting and gapped views
(miopenOpTensor does not permute: packed operands are copied flat, the last stride is taken
as 1), float16 alpha and clip bounds (SetTensor/ScaleTensor read them in the tensor's type),
bfloat16 with each epilogue (refused at plan time: MIOpen has no bfloat16 tensor ops),
negative inputs to GELU(tanh) (MIOpen's POWER is 0 for bases <= 1e-6), repeated (stride 0)
inputs (MIOpen takes strides > 0 only) and grouped + dilated convolutions. They run on every
ROCm backend: the MIOpen test double here (rocm_host), an AMD GPU under scripts/rocm_check.sh.
References are float64, inputs fresh per run, outputs poisoned (NaN) unless beta reads them."""

from __future__ import annotations

import time

import numpy as np
import pytest

import flux_dnn
import reference as ref

from . import problems as P
from .libraries import LAYOUTS, ROCM

DTYPES_16_32 = ("float32", "float16")
RANKS = (1, 2, 3)


def on_rocm(lib) -> bool:
    """on a ROCm device"""
    return lib.device_type == ROCM


def strided_on_rocm(lib) -> bool:
    """on a ROCm device, with strides (views, channels-last)"""
    return lib.device_type == ROCM and lib.strided


def _geometry(nd=2, C=6, K=8, size=7, kernel=3, lo=1, hi=1, stride=1, dilation=1, groups=1, N=2):
    per = (lambda v: (v,) * nd) if nd else None
    size = 5 if nd == 3 else size
    return P.Geometry(
        nd=nd,
        N=N,
        C=C,
        K=K,
        groups=groups,
        kernel=per(kernel),
        stride=per(stride),
        dilation=per(dilation),
        lo=per(lo),
        hi=per(hi),
        spatial=per(size),
        padding=tuple(zip(per(lo), per(hi))),
        form="pairs",
    )


def _close(lib, got, expected, dtype, what):
    P.assert_close(lib, got, expected, dtype, what, what)


def _host_view(lib, arr, make):
    """A view of a library's array made by `make` (a NumPy function) where the library has no
    such view itself (the double's host arrays)."""
    from .rocm_host import RocmHostArray

    if isinstance(arr, RocmHostArray):
        return RocmHostArray(make(arr.host))
    return None


def _repeated(lib, one, dtype, shape):
    """`one` (leading dim 1) repeated to `shape` without a copy: stride 0 there."""
    a = lib.array(one, dtype)
    if lib.name == "torch":
        return a.expand(*shape)
    if lib.name == "cupy":
        return lib.module.broadcast_to(a, shape)
    view = _host_view(lib, a, lambda h: np.broadcast_to(h, shape))
    if view is None:
        pytest.skip(f"{lib.name} has no views that repeat an element")
    return view


def _gapped(lib, values, dtype, axis):
    """values as every other element of `axis` of an array twice as long (7 between)."""
    shape = list(values.shape)
    shape[axis] *= 2
    big = np.full(shape, 7.0)
    index = [slice(None)] * len(shape)
    index[axis] = slice(0, None, 2)
    big[tuple(index)] = values
    return lib.array(big, dtype)[tuple(index)]


# ---- D1: bias on channels-last outputs ------------------------------------------------------


@pytest.mark.matrix(where=strided_on_rocm, dtype=DTYPES_16_32, nd=RANKS)
def test_bias_on_a_channels_last_output(backend, rng, dtype, nd):
    """NHWC / NDHWC y with a bias, with and without ReLU and alpha."""
    backend.require("forward", dtype, nd, activation="relu", layout="channels_last")
    g = _geometry(nd, C=5, K=7)
    for e in (P.Epilogue(bias=True, use_out=True), P.Epilogue(bias=True, activation="relu", alpha=-1.5)):
        P.run_op("forward", backend, rng, dtype, "channels_last", g, e)


@pytest.mark.matrix(libraries="first", where=strided_on_rocm, dtype=DTYPES_16_32)
def test_bias_gradient_of_a_channels_last_dy(backend, rng, dtype):
    """dy NHWC: MIOpen's bias-gradient kernel reads each channel's map as contiguous."""
    backend.require("backward_weight_bias", dtype, 2, features=("bias_gradient", "alpha_beta"))
    e = P.Epilogue(alpha=0.5, beta=1.0 if backend.lib.writable else 0.0, use_out=backend.lib.writable)
    P.run_op("backward_weight_bias", backend, rng, dtype, "channels_last", _geometry(), e)


# ---- D2: permuting and gapped views ---------------------------------------------------------


@pytest.mark.matrix(
    libraries="first", where=strided_on_rocm, op=("forward", "backward_data", "backward_weight"), layout=LAYOUTS
)
def test_layouts_mixed_with_asymmetric_padding_and_beta(backend, rng, op, layout):
    """x (or dy) in `layout`, w always contiguous: one of them is permuted into the other's
    layout, and x is copied into a padded buffer (asymmetric padding); beta reads the output."""
    dtype = "float32"
    backend.require(op, dtype, 2, layout=layout, features=("alpha_beta",))
    beta = 0.5 if backend.lib.writable else 0.0
    e = P.Epilogue(alpha=-1.5, beta=beta, use_out=backend.lib.writable, bias=op == "forward")
    P.run_op(op, backend, rng, dtype, layout, _geometry(lo=2, hi=1), e)


@pytest.mark.matrix(
    libraries="first", where=strided_on_rocm, op=("forward", "backward_data", "backward_weight"), dtype=DTYPES_16_32
)
def test_views_with_gaps_on_every_operand(backend, rng, op, dtype):
    """Every operand a view whose last stride is 2, or whose channels skip: read and written
    through its strides only (the elements between hold 7 and must stay 7)."""
    backend.require(op, dtype, 2, features=("alpha_beta",))
    lib = backend.lib
    if not lib.writable:
        pytest.skip(f"{lib.name} arrays cannot be accumulated into (no out=)")
    g = _geometry()
    x, w, dy = P.grid(rng, g.x_shape), P.grid(rng, g.w_shape), P.grid(rng, g.y_shape)
    xd, wd, dyd = _gapped(lib, x, dtype, 3), _gapped(lib, w, dtype, 1), _gapped(lib, dy, dtype, 3)
    out_shape = {"forward": g.y_shape, "backward_data": g.x_shape, "backward_weight": g.w_shape}[op]
    old = P.grid(rng, out_shape)
    out = _gapped(lib, old, dtype, 3)
    if op == "forward":
        expected = 0.5 * ref.conv_forward(x, w, None, *g.ref()) + old
        got = flux_dnn.conv(xd, wd, **g.kwargs(), alpha=0.5, beta=1.0, out=out)
    elif op == "backward_data":
        expected = 0.5 * ref.conv_backward_data(dy, w, g.x_shape, *g.ref()) + old
        got = flux_dnn.conv_backward_data(dyd, wd, g.x_shape, **g.kwargs(), alpha=0.5, beta=1.0, out=out)
    else:
        expected = 0.5 * ref.conv_backward_weight(x, dy, g.w_shape, *g.ref()) + old
        got = flux_dnn.conv_backward_weight(xd, dyd, g.w_shape, **g.kwargs(), alpha=0.5, beta=1.0, out=out)
    _close(lib, got, expected, dtype, f"{op} on views with gaps")


# ---- D3: float16 alpha and clip bounds ------------------------------------------------------


@pytest.mark.matrix(where=on_rocm, dtype=DTYPES_16_32)
def test_alpha_and_clip_bounds_in_16_bit(backend, rng, dtype):
    """alpha 0.75 and CLIP(0, 6) (a float 0.75 or 6 read as half is 0)."""
    backend.require("forward", dtype, 2, activation="clip", features=("alpha_beta",))
    lib = backend.lib
    g = _geometry(C=4, K=6)
    x, w = P.grid(rng, g.x_shape) * 4, P.grid(rng, g.w_shape)  # outputs well beyond 6 and below 0
    conv = ref.conv_forward(x, w, None, *g.ref())
    for alpha, lo, hi in ((0.75, 0.0, 6.0), (2.0, -1.5, 6.0), (-1.5, 0.0, 6.0)):
        expected = alpha * np.clip(conv, lo, hi)
        got = flux_dnn.conv(
            lib.array(x, dtype), lib.array(w, dtype), **g.kwargs(), activation=("clip", lo, hi), alpha=alpha
        )
        _close(lib, got, expected, dtype, f"alpha {alpha} clip({lo}, {hi})")
    got = flux_dnn.conv(lib.array(x, dtype), lib.array(w, dtype), **g.kwargs(), alpha=0.75)
    _close(lib, got, 0.75 * conv, dtype, "alpha 0.75")


# ---- D4: bfloat16 with each epilogue --------------------------------------------------------


@pytest.mark.matrix(
    libraries="first", where=on_rocm, epilogue=("plain", "bias", "relu", "gelu_tanh", "alpha", "beta", "channels_last")
)
def test_bfloat16_is_refused_at_plan_time_with_every_epilogue(backend, rng, epilogue):
    """MIOpen convolves bfloat16 but has no bfloat16 tensor ops for what surrounds it: the
    shim says so from its capabilities, before any MIOpen call, whatever the epilogue; never a
    failure at execute after a plan succeeded."""
    lib = backend.lib
    cap = backend.capability("forward", "bfloat16")
    if cap.computes:
        pytest.skip(f"shim {backend.shim!r} computes bfloat16 here: {cap.detail}")  # a future bf16 path
    backend.require_array("bfloat16")
    assert "bfloat16" in cap.detail
    g = _geometry(C=4, K=6)
    layout = "channels_last" if epilogue == "channels_last" else "contiguous"
    x, w = lib.array(P.grid(rng, g.x_shape), "bfloat16", layout), lib.array(P.grid(rng, g.w_shape), "bfloat16")
    kwargs = {
        "bias": dict(bias=lib.array(P.grid(rng, (g.K,)), "bfloat16")),
        "relu": dict(activation="relu"),
        "gelu_tanh": dict(activation="gelu_tanh"),
        "alpha": dict(alpha=0.75),
    }.get(epilogue, {})
    # the core's words: "dtype bfloat16 is not supported by any shim ...", with the shim's reason
    with pytest.raises((TypeError, flux_dnn.UnsupportedError), match="no bfloat16 tensor ops"):
        flux_dnn.conv_plan(x, w, **kwargs, **g.kwargs())


# ---- D5: GELU (tanh) of negative values -----------------------------------------------------


@pytest.mark.matrix(where=on_rocm, dtype=DTYPES_16_32)
def test_gelu_tanh_of_negative_values(backend, rng, dtype):
    """A 1x1 identity convolution of values in [-4, 4], most negative: GELU(tanh) written
    out in float64 here (v = -2 gives -0.0454, not the -0.0790 of a v^3 clamped to 0)."""
    backend.require("forward", dtype, 2, activation="gelu_tanh")
    lib = backend.lib
    x = -rng.integers(0, 17, (2, 3, 5, 5)) / 4.0  # [-4, 0] in quarters: exact in 16 bits
    x[0, 0, 0, :3] = (-2.0, -3.0, 1.5)
    w = np.eye(3).reshape(3, 3, 1, 1)
    expected = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    got = flux_dnn.conv(lib.array(x, dtype), lib.array(w, dtype), activation="gelu_tanh")
    _close(lib, got, expected, dtype, "gelu_tanh")


# ---- D6: repeated (stride 0) inputs ---------------------------------------------------------


@pytest.mark.matrix(libraries="first", where=on_rocm, op=("forward", "backward_data", "backward_weight"))
def test_repeated_inputs(backend, rng, op):
    """One image repeated over the batch (stride 0 on N) and a repeated bias: MIOpen takes
    strides > 0 only, so the shim copies them compactly."""
    dtype = "float32"
    backend.require(op, dtype, 2)
    lib = backend.lib
    g = _geometry(N=3)
    read = g.y_shape if op == "backward_data" else g.x_shape
    one = P.grid(rng, (1, *read[1:]))
    repeated, arr = np.broadcast_to(one, read), _repeated(lib, one, dtype, read)
    w = P.grid(rng, g.w_shape)
    if op == "forward":
        b0 = P.grid(rng, (1,))
        bias = _repeated(lib, b0, dtype, (g.K,))
        expected = ref.conv_forward(repeated, w, np.broadcast_to(b0, (g.K,)), *g.ref())
        got = flux_dnn.conv(arr, lib.array(w, dtype), bias, **g.kwargs())
    elif op == "backward_data":
        expected = ref.conv_backward_data(repeated, w, g.x_shape, *g.ref())
        got = flux_dnn.conv_backward_data(arr, lib.array(w, dtype), g.x_shape, **g.kwargs())
    else:
        dy = P.grid(rng, g.y_shape)
        expected = ref.conv_backward_weight(repeated, dy, g.w_shape, *g.ref())
        got = flux_dnn.conv_backward_weight(arr, lib.array(dy, dtype), g.w_shape, **g.kwargs())
    _close(lib, got, expected, dtype, f"{op} of a repeated input")


# ---- D9: grouped + dilated ------------------------------------------------------------------


@pytest.mark.matrix(
    libraries="first", where=on_rocm, op=("forward", "backward_data", "backward_weight_bias"), nd=(1, 2, 3)
)
def test_grouped_and_dilated(backend, rng, op, nd):
    """Groups with dilation, depthwise included, in one MIOpen call (its time recorded: a
    per-group split ran C launches)."""
    dtype = "float32"
    backend.require(op, dtype, nd, features=("groups", "dilation", *(("bias_gradient",) if "bias" in op else ())))
    for groups, C, K in ((2, 4, 6), (4, 4, 8)):
        g = _geometry(nd, C=C, K=K, groups=groups, dilation=2, lo=2, hi=2)
        start = time.perf_counter()
        P.run_op(op, backend, rng, dtype, "contiguous", g, P.Epilogue(bias=op == "forward"))
        print(f"{op} {nd}-D groups {groups} dilation 2: {time.perf_counter() - start:.4f} s")
