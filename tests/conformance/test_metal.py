"""What the MPS shim risks that the matrix's random draws reach only by chance (review of
issue 27): tensors with a storage offset on every operand (torch <= 2.9.1 exports them as an
address: refused cleanly there), sliced and transposed views, 16-bit results with every
epilogue rounded once, the gradient ops on channels-last tensors, a written dw at an offset,
the filter-dim boundary of MPSGraph's 2-D forward (255 served, 256 refused; backward served)
and the 65536-dim guard (y on forward, dy on backward data, before macOS 15.1). Every test here
runs on Metal backends only; without a Mac each is skipped with the reason
(``python -m pytest tests/conformance -m accelerator``, run by scripts/mac_check.sh)."""

from __future__ import annotations

import dataclasses
import platform

import numpy as np
import pytest

import flux_dnn
import reference as ref

from . import problems as P
from .libraries import METAL, numpy_dtype

DTYPES_16 = ("float16", "bfloat16")


def on_metal(lib) -> bool:
    """on an Apple GPU"""
    return lib.device_type == METAL


def strided_on_metal(lib) -> bool:
    """on an Apple GPU, with views and offsets (PyTorch MPS tensors)"""
    return lib.device_type == METAL and lib.strided


def _macos() -> tuple:
    release = platform.mac_ver()[0] or "0.0"
    return tuple(int(v) for v in (release.split(".") + ["0"])[:2])


def _geometry(C=6, K=8, size=7, kernel=3, pad=1):
    return P.Geometry(
        nd=2, N=2, C=C, K=K, groups=1, kernel=(kernel, kernel), stride=(1, 1), dilation=(1, 1),
        lo=(pad, pad), hi=(pad, pad), spatial=(size, size), padding=(pad, pad), form="tuple",
    )  # fmt: skip


def _at_offset(lib, values, dtype, offset=3):
    """values as a view `offset` elements into a larger array (storage_offset != 0)."""
    flat = lib.array(np.concatenate([np.zeros(offset), np.asarray(values, np.float64).ravel()]), dtype)
    return lib.reshape(flat[offset:], values.shape)


def _close(lib, got, expected, dtype, what):
    P.assert_close(lib, got, expected, dtype, what, what)


def _call_or_clean_refusal(record_property, call):
    """The result, or None when this torch's export of offset MPS tensors is refused (the
    ValueError flux_dnn._metal_dlpack raises names pytorch PR #169272)."""
    try:
        return call()
    except ValueError as exc:
        if "169272" not in str(exc):
            raise
        record_property("offset_export", "refused: this torch exports sliced MPS tensors as addresses")
        return None


@pytest.mark.matrix(where=strided_on_metal, which=("x", "w", "y", "bias", "dw", "dy"), dtype=("float32", "float16"))
def test_operand_with_a_storage_offset(backend, rng, which, dtype, record_property):
    """One operand a view 3 elements into its storage: computed right (fixed torch), or
    refused by name (torch exporting the offset as an address); never a crash."""
    op = "backward_weight" if which in ("dw", "dy") else "forward"
    backend.require(op, dtype, 2)
    lib, g = backend.lib, _geometry()
    x, w, b, dy = P.grid(rng, g.x_shape), P.grid(rng, g.w_shape), P.grid(rng, (g.K,)), P.grid(rng, g.y_shape)

    def arr(name, values):
        return _at_offset(lib, values, dtype) if name == which else lib.array(values, dtype)

    if op == "forward":
        out = _at_offset(lib, np.full(g.y_shape, np.nan), dtype) if which == "y" else None
        expected = ref.conv_forward(x, w, b, *g.ref())
        got = _call_or_clean_refusal(
            record_property, lambda: flux_dnn.conv(arr("x", x), arr("w", w), arr("bias", b), **g.kwargs(), out=out)
        )
    else:
        out = _at_offset(lib, np.full(g.w_shape, np.nan), dtype) if which == "dw" else None
        expected = ref.conv_backward_weight(x, dy, g.w_shape, *g.ref())
        got = _call_or_clean_refusal(
            record_property,
            lambda: flux_dnn.conv_backward_weight(lib.array(x, dtype), arr("dy", dy), g.w_shape, **g.kwargs(), out=out),
        )
    if got is not None:
        assert out is None or got is out
        _close(lib, got, expected, dtype, f"{which} at a storage offset")


@pytest.mark.matrix(
    where=strided_on_metal, op=("forward", "backward_data", "backward_weight"), dtype=("float32", "float16")
)
def test_transposed_and_sliced_views(backend, rng, op, dtype):
    """Inputs as views whose strides are a permutation (H and W swapped) or leave gaps (every
    other channel): the graph reads them through a transpose or a gather."""
    backend.require(op, dtype, 2)
    lib, g = backend.lib, _geometry(C=4, K=6, size=6)
    x, w, dy = P.grid(rng, g.x_shape), P.grid(rng, g.w_shape), P.grid(rng, g.y_shape)
    xt = lib.array(np.ascontiguousarray(x.transpose(0, 1, 3, 2)), dtype).transpose(2, 3)  # H/W swapped in memory
    big_w = np.zeros((g.K, 2 * g.C, *g.kernel))
    big_w[:, ::2] = w
    wg = lib.array(big_w, dtype)[:, ::2]  # gaps between the input channels
    dyt = lib.array(np.ascontiguousarray(dy.transpose(0, 1, 3, 2)), dtype).transpose(2, 3)
    if op == "forward":
        got, expected = flux_dnn.conv(xt, wg, **g.kwargs()), ref.conv_forward(x, w, None, *g.ref())
    elif op == "backward_data":
        got = flux_dnn.conv_backward_data(dyt, wg, g.x_shape, **g.kwargs())
        expected = ref.conv_backward_data(dy, w, g.x_shape, *g.ref())
    else:
        got = flux_dnn.conv_backward_weight(xt, dyt, g.w_shape, **g.kwargs())
        expected = ref.conv_backward_weight(x, dy, g.w_shape, *g.ref())
    _close(lib, got, expected, dtype, f"{op} on transposed and gapped views")


EPILOGUES = {
    "bias": dict(bias=True),
    "relu": dict(activation="relu"),
    "alpha": dict(alpha=0.375),
    "beta": dict(beta=1.0),
    "all": dict(bias=True, activation="relu", alpha=-1.5, beta=1.0),
}


@pytest.mark.matrix(where=on_metal, dtype=DTYPES_16, epilogue=tuple(EPILOGUES))
def test_16bit_results_with_an_epilogue_are_rounded_once(backend, rng, dtype, epilogue):
    """Exact float32 sums whose 16-bit results need rounding: with bias, ReLU, alpha or beta
    the result must still be the exact value rounded once (the shim then convolves in float32,
    since MPSGraph's 16-bit convolution returns a rounded 16-bit value)."""
    e = EPILOGUES[epilogue]
    backend.require("forward", dtype, 2, activation=e.get("activation"), features=("alpha_beta",))
    lib = backend.lib
    if e.get("beta") and not lib.writable:
        pytest.skip(f"{lib.name} arrays cannot be accumulated into (no out=)")
    x = rng.integers(-64, 65, (2, 5, 6, 7)) / 64  # 7 significant bits: exact in bfloat16
    w = rng.integers(-64, 65, (3, 5, 3, 3)) / 64
    b = rng.integers(-64, 65, (3,)) / 64 if e.get("bias") else None
    old = rng.integers(-64, 65, (2, 3, 6, 7)) / 64
    alpha, beta = e.get("alpha", 1.0), e.get("beta", 0.0)
    exact = ref.epilogue(ref.conv_forward(x, w, b, (1, 1), (1, 1), (1, 1)), alpha, beta, old, e.get("activation"))
    out = lib.array(old, dtype) if beta else None
    got = flux_dnn.conv2d(
        lib.array(x, dtype), lib.array(w, dtype), None if b is None else lib.array(b, dtype), padding=1,
        activation=e.get("activation"), alpha=alpha, beta=beta, out=out,
    )  # fmt: skip
    once = exact.astype(numpy_dtype(dtype)).astype(np.float64)
    np.testing.assert_array_equal(lib.numpy(got), once)


@pytest.mark.matrix(where=strided_on_metal, op=("backward_data", "backward_weight"), dtype=("float32", "float16"))
def test_gradients_of_channels_last_tensors(backend, rng, op, dtype):
    """Channels-last x and dy through the gradient ops (the shim runs them in NCHW with
    transposes in the graph, as PyTorch does, on every macOS)."""
    backend.require(op, dtype, 2, layout="channels_last")
    for alpha, beta in ((1.0, 0.0), (0.5, 1.0)):
        e = P.Epilogue(alpha=alpha, beta=beta, use_out=beta != 0.0 and backend.lib.writable)
        P.run_op(op, backend, rng, dtype, "channels_last", _geometry(C=8, K=16, size=9), e)


def _run(op, lib, g, x, w, dy):
    """op on float32 arrays of lib: flux_dnn's result and the float64 reference."""
    a = {k: lib.array(v, "float32") for k, v in (("x", x), ("w", w), ("dy", dy))}
    if op == "forward":
        return flux_dnn.conv(a["x"], a["w"], **g.kwargs()), ref.conv_forward(x, w, None, *g.ref())
    if op == "backward_data":
        got = flux_dnn.conv_backward_data(a["dy"], a["w"], g.x_shape, **g.kwargs())
        return got, ref.conv_backward_data(dy, w, g.x_shape, *g.ref())
    got = flux_dnn.conv_backward_weight(a["x"], a["dy"], g.w_shape, **g.kwargs())
    return got, ref.conv_backward_weight(x, dy, g.w_shape, *g.ref())


@pytest.mark.matrix(where=on_metal, op=("forward", "backward_data", "backward_weight"))
def test_filter_dims_at_the_2d_forward_boundary(backend, rng, op):
    """A 1x255 filter is served everywhere; 1x256 is refused on forward (MPSGraph's 2-D
    forward miscomputes it, PyTorch avoids it) and computed right by the gradient ops."""
    backend.require(op, "float32", 2)
    lib = backend.lib
    for width in (255, 256):
        g = dataclasses.replace(_geometry(C=2, K=3, kernel=1, pad=0), kernel=(1, width), spatial=(3, width + 4))
        x, w, dy = P.grid(rng, g.x_shape), P.grid(rng, g.w_shape) / 16, P.grid(rng, g.y_shape)
        if op == "forward" and width == 256:
            with pytest.raises(flux_dnn.UnsupportedError, match="256"):
                _run(op, lib, g, x, w, dy)
            continue
        got, expected = _run(op, lib, g, x, w, dy)
        _close(lib, got, expected, "float32", f"{op} with a 1x{width} filter")


@pytest.mark.matrix(where=on_metal, case=("forward_K", "backward_data_dy_channels", "backward_data_dx_channels"))
def test_dims_at_the_65536_boundary(backend, rng, case):
    """65537 channels: before macOS 15.1 refused where PyTorch refuses (y on forward, dy on
    backward data), served where it does not (dx on backward data); computed right when served."""
    backend.require("forward", "float32", 2)
    lib = backend.lib
    C, K = (1, 65537) if case != "backward_data_dx_channels" else (65537, 1)
    g = _geometry(C=C, K=K, size=2, kernel=1, pad=0)
    x, w, dy = P.grid(rng, g.x_shape), P.grid(rng, g.w_shape), P.grid(rng, g.y_shape)
    op = "forward" if case == "forward_K" else "backward_data"
    if _macos() < (15, 1) and case != "backward_data_dx_channels":
        with pytest.raises(flux_dnn.UnsupportedError, match="65536"):
            _run(op, lib, g, x, w, dy)
        return
    got, expected = _run(op, lib, g, x, w, dy)
    _close(lib, got, expected, "float32", case)
