"""NumPy's 16-bit float dtypes through every op: ml_dtypes.bfloat16 (what JAX hands out on the
CPU through np.asarray), which NumPy's __dlpack__ refuses, and float16, which it exports.
Results come back as NumPy arrays of the same dtype; arrays of dtypes that flux_dnn does not
take (float8, int8, complex, object, structured) get a TypeError naming the argument and the
dtype before any vendor call.

Inputs lie on a grid of quarters in [-1, 1], exact in both dtypes, so only the output's
rounding differs from the float64 reference. The computing tests need a CPU whose oneDNN
computes these dtypes (or the shim's float32 fallback); the intake tests check, on any
machine, what the core receives: DLPack bfloat16 over the array's own memory."""

import re

import ml_dtypes
import numpy as np
import pytest

import flux_dnn
import reference as ref
from flux_dnn import _core

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = {"bfloat16": BF16, "float16": np.dtype(np.float16)}
TOLERANCE = {"bfloat16": 1e-2, "float16": 2e-3}
DLPACK_DTYPE = {"bfloat16": (4, 16, 1), "float16": (2, 16, 1)}  # (code, bits, lanes)
ACCEPTED = r"accepts float64, float32, float16 and bfloat16 \(ml_dtypes\.bfloat16 for NumPy\)"

# (stride, padding, dilation, groups) per case; C = 4, K = 6.
CASES = [(1, 0, 1, 1), (2, 1, 1, 2), (1, 2, 2, 1)]


def grid(rng, shape, dtype):
    return (rng.integers(-4, 5, shape) / 4).astype(dtype)


def assert_close(actual, expected, dtype_name):
    assert isinstance(actual, np.ndarray) and actual.dtype == DTYPES[dtype_name]
    tol = TOLERANCE[dtype_name]
    np.testing.assert_allclose(
        np.asarray(actual, dtype=np.float64), expected, rtol=tol, atol=tol * max(1.0, float(np.abs(expected).max()))
    )


def problem(rng, nd, dtype_name, case):
    stride, padding, dilation, groups = CASES[case]
    dtype = DTYPES[dtype_name]
    x = grid(rng, (2, 4, *[7] * nd), dtype)
    w = grid(rng, (6, 4 // groups, *[3] * nd), dtype)
    bias = grid(rng, (6,), dtype)
    geometry = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    rg = ((stride,) * nd, (padding,) * nd, (padding,) * nd, (dilation,) * nd, groups)
    return x, w, bias, geometry, rg


def channels_last(a):
    return ref.channels_last(a)


@pytest.fixture
def no_vendor_call(monkeypatch):
    """Any call into the core's convolution entry points fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("a vendor call was made")

    monkeypatch.setattr(_core, "run_conv", refuse)
    monkeypatch.setattr(_core, "PackedConv", refuse)


# ------------------------------------------------------------------------------------------
# What the core receives (runs everywhere)


@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16"])
def test_intake_takes_the_arrays_own_memory_as_its_dtype(rng, dtype_name):
    a = grid(rng, (2, 3, 4, 5), DTYPES[dtype_name])
    views = {
        "contiguous": a,
        "channels_last": channels_last(a),
        "sliced": a[:, 1:, ::2, 1:4],
    }
    for what, v in views.items():
        d = _core.describe_intake(v, "x")
        assert d["dtype"] == DLPACK_DTYPE[dtype_name], what
        assert d["shape"] == v.shape, what
        assert d["strides"] == tuple(s // 2 for s in v.strides), what
        assert d["data"] + d["byte_offset"] == v.ctypes.data, what  # no copy
        assert d["device"] == (1, 0) and not d["read_only"], what
    assert a.dtype == DTYPES[dtype_name]  # the caller's array is left as it was


def test_intake_of_a_jax_bfloat16_array(rng):
    jnp = pytest.importorskip("jax.numpy")
    a = np.asarray(jnp.asarray(grid(rng, (2, 3, 4), np.float32)).astype(jnp.bfloat16))
    assert a.dtype == BF16
    d = _core.describe_intake(a, "x")
    assert d["dtype"] == (4, 16, 1) and d["shape"] == a.shape and d["data"] + d["byte_offset"] == a.ctypes.data


def test_bfloat16_reaches_the_plan_check_as_bfloat16(rng):
    """A plan for float32 given a bfloat16 input: the core reads it (no DLPack error) and
    refuses it by its dtype, DLPack code 4, before any vendor work."""
    x = grid(rng, (2, 4, 7, 7), np.float32)
    w = grid(rng, (6, 4, 3, 3), np.float32)
    plan = flux_dnn.conv_plan(x, w)
    with pytest.raises(TypeError, match=r"x: does not fit this convolution plan: its dtype \(16-bit, DLPack code 4\)"):
        plan(x.astype(BF16), out=np.empty(plan.output_shape, np.float32))


@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16"])
def test_empty_batch_results_keep_the_dtype(dtype_name):
    """An empty batch needs no vendor call: the outputs' library, type and dtype."""
    dtype = DTYPES[dtype_name]
    x, w, dy = np.zeros((0, 4, 7, 7), dtype), np.zeros((6, 4, 3, 3), dtype), np.zeros((0, 6, 5, 5), dtype)
    results = [
        flux_dnn.conv2d(x, w, np.zeros(6, dtype)),
        flux_dnn.conv_backward_data(dy, w, x.shape),
        *flux_dnn.conv_backward_weight(x, dy, w.shape, bias_grad=True),
    ]
    assert [r.shape for r in results] == [(0, 6, 5, 5), (0, 4, 7, 7), (6, 4, 3, 3), (6,)]
    assert all(type(r) is np.ndarray and r.dtype == dtype for r in results)
    assert not results[2].any() and not results[3].any()


@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16"])
def test_conv_backward_bias(rng, dtype_name):
    dy = grid(rng, (2, 6, 5, 5), DTYPES[dtype_name])
    assert_close(flux_dnn.conv_backward_bias(dy), dy.astype(np.float64).sum(axis=(0, 2, 3)), dtype_name)


# ------------------------------------------------------------------------------------------
# Every op, against the float64 reference (needs a oneDNN that computes 16-bit floats here,
# or the oneDNN shim's float32 fallback)


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("nd", [1, 2, 3])
@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16"])
def test_forward_with_bias_and_activation(rng, dtype_name, nd, case):
    x, w, bias, geometry, rg = problem(rng, nd, dtype_name, case)
    expected = np.maximum(ref.conv_forward(x, w, bias, *rg), 0)
    assert_close(flux_dnn.conv(x, w, bias, activation="relu", **geometry), expected, dtype_name)
    by_rank = {1: flux_dnn.conv1d, 2: flux_dnn.conv2d, 3: flux_dnn.conv3d}[nd]
    assert_close(by_rank(x, w, bias, activation="relu", **geometry), expected, dtype_name)


@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16"])
def test_forward_into_out_is_zero_copy(rng, dtype_name):
    x, w, bias, geometry, rg = problem(rng, 2, dtype_name, 1)
    expected = ref.conv_forward(x, w, bias, *rg)
    out = ref.poisoned_like(expected.shape, DTYPES[dtype_name])
    result = flux_dnn.conv2d(x, w, bias, out=out, **geometry)
    assert result is out and np.shares_memory(result, out) and not np.isnan(out).any()
    assert_close(out, expected, dtype_name)


@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16"])
def test_channels_last_input(rng, dtype_name):
    x, w, bias, geometry, rg = problem(rng, 2, dtype_name, 0)
    expected = ref.conv_forward(x, w, bias, *rg)
    y = flux_dnn.conv2d(channels_last(x), w, bias, **geometry)
    assert_close(y, expected, dtype_name)
    out = ref.poisoned_like(expected.shape, DTYPES[dtype_name], channels_last_layout=True)
    assert flux_dnn.conv2d(channels_last(x), w, bias, out=out, **geometry) is out
    assert_close(out, expected, dtype_name)


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16"])
def test_backward_data(rng, dtype_name, case):
    x, w, _, geometry, rg = problem(rng, 2, dtype_name, case)
    dy = grid(rng, ref.conv_forward(x, w, None, *rg).shape, DTYPES[dtype_name])
    expected = ref.conv_backward_data(dy, w, x.shape, *rg)
    assert_close(flux_dnn.conv_backward_data(dy, w, x.shape, **geometry), expected, dtype_name)
    out = ref.poisoned_like(x.shape, DTYPES[dtype_name])
    assert flux_dnn.conv_backward_data(dy, w, x.shape, out=out, **geometry) is out
    assert not np.isnan(out).any()
    assert_close(out, expected, dtype_name)


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16"])
def test_backward_weight_and_bias(rng, dtype_name, case):
    x, w, _, geometry, rg = problem(rng, 2, dtype_name, case)
    dy = grid(rng, ref.conv_forward(x, w, None, *rg).shape, DTYPES[dtype_name])
    expected_dw = ref.conv_backward_weight(x, dy, w.shape, *rg)
    expected_db = dy.astype(np.float64).sum(axis=(0, 2, 3))
    dw, db = flux_dnn.conv_backward_weight(x, dy, w.shape, bias_grad=True, **geometry)
    assert_close(dw, expected_dw, dtype_name)
    assert_close(db, expected_db, dtype_name)
    dw_out, db_out = ref.poisoned_like(w.shape, DTYPES[dtype_name]), ref.poisoned_like((6,), DTYPES[dtype_name])
    dw, db = flux_dnn.conv_backward_weight(x, dy, w.shape, bias_grad=True, out=(dw_out, db_out), **geometry)
    assert dw is dw_out and db is db_out
    assert_close(dw, expected_dw, dtype_name)
    assert_close(db, expected_db, dtype_name)


@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16"])
def test_conv_transpose2d(rng, dtype_name):
    dtype = DTYPES[dtype_name]
    x = grid(rng, (2, 4, 5, 6), dtype)
    w = grid(rng, (4, 3, 3, 3), dtype)  # (C_in, C_out/groups, kh, kw)
    bias = grid(rng, (6,), dtype)
    expected = ref.conv_transpose(x, w, bias, (2, 2), (1, 1), (1, 0), (1, 1), groups=2)
    y = flux_dnn.conv_transpose2d(x, w, bias, stride=2, padding=1, output_padding=(1, 0), groups=2)
    assert_close(y, expected, dtype_name)
    out = ref.poisoned_like(expected.shape, dtype)
    assert flux_dnn.conv_transpose2d(x, w, bias, stride=2, padding=1, output_padding=(1, 0), groups=2, out=out) is out
    assert_close(out, expected, dtype_name)


@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16"])
def test_conv_plan(rng, dtype_name):
    x, w, bias, geometry, rg = problem(rng, 2, dtype_name, 1)
    plan = flux_dnn.conv_plan(x, w, bias, **geometry)
    expected = ref.conv_forward(x, w, bias, *rg)
    assert_close(plan(x), expected, dtype_name)
    out = ref.poisoned_like(expected.shape, DTYPES[dtype_name])
    assert plan(x, out=out) is out
    assert_close(out, expected, dtype_name)


def test_jax_bfloat16_through_numpy(rng):
    jnp = pytest.importorskip("jax.numpy")
    x, w, bias, geometry, rg = problem(rng, 2, "bfloat16", 0)
    xj, wj = np.asarray(jnp.asarray(x)), np.asarray(jnp.asarray(w))  # read-only NumPy views of JAX buffers
    assert xj.dtype == BF16
    assert_close(flux_dnn.conv2d(xj, wj, **geometry), ref.conv_forward(x, w, None, *rg), "bfloat16")


# ------------------------------------------------------------------------------------------
# Dtypes flux_dnn does not take: a TypeError naming argument and dtype, before any vendor call

REFUSED = {
    "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
    "int8": np.dtype(np.int8),
    "complex64": np.dtype(np.complex64),
    "object": np.dtype(object),
    "structured": np.dtype([("re", np.float32), ("im", np.float32)]),
}


def refused(shape, dtype):
    return np.zeros(shape, dtype)


def check_refusal(call, argname, dtype):
    with pytest.raises(TypeError) as info:
        call()
    message = str(info.value)
    assert not isinstance(info.value, BufferError)
    assert message.startswith(f"{argname}: dtype {dtype} is not supported for NumPy arrays"), message
    assert "DLPack" not in message, message
    assert re.search(ACCEPTED, message), message


@pytest.mark.parametrize("dtype_key", list(REFUSED))
@pytest.mark.parametrize("argname", ["x", "w", "bias", "out"])
@pytest.mark.parametrize("like", ["float32", "bfloat16"])
def test_refused_dtypes_name_argument_and_dtype(no_vendor_call, dtype_key, argname, like):
    dtype = REFUSED[dtype_key]
    good = np.dtype(np.float32) if like == "float32" else BF16
    args = {
        "x": np.zeros((1, 4, 5, 5), good),
        "w": np.zeros((6, 4, 3, 3), good),
        "bias": np.zeros(6, good),
        "out": np.zeros((1, 6, 3, 3), good),
    }
    args[argname] = refused(args[argname].shape, dtype)
    check_refusal(lambda: flux_dnn.conv2d(args["x"], args["w"], args["bias"], out=args["out"]), argname, dtype)


@pytest.mark.parametrize("dtype_key", ["float8_e4m3fn", "int8", "complex64"])
def test_refused_dtypes_in_every_op(no_vendor_call, dtype_key):
    dtype = REFUSED[dtype_key]
    bad, bf = refused((1, 4, 5, 5), dtype), np.zeros((1, 4, 5, 5), BF16)
    w, dy = np.zeros((6, 4, 3, 3), BF16), np.zeros((1, 6, 3, 3), BF16)
    check_refusal(lambda: flux_dnn.conv_backward_data(refused(dy.shape, dtype), w, bf.shape), "dy", dtype)
    check_refusal(lambda: flux_dnn.conv_backward_data(dy, refused(w.shape, dtype), bf.shape), "w", dtype)
    check_refusal(lambda: flux_dnn.conv_backward_weight(bad, dy, w.shape, bias_grad=True), "x", dtype)
    check_refusal(
        lambda: flux_dnn.conv_backward_weight(
            bf, dy, w.shape, bias_grad=True, out=(refused(w.shape, dtype), np.zeros(6, BF16))
        ),
        "out",
        dtype,
    )
    check_refusal(lambda: flux_dnn.conv_transpose2d(refused(dy.shape, dtype), np.zeros((6, 4, 3, 3), BF16)), "x", dtype)
    check_refusal(
        lambda: flux_dnn.conv_transpose2d(dy, np.zeros((6, 4, 3, 3), BF16), refused((4,), dtype)), "bias", dtype
    )
    check_refusal(lambda: flux_dnn.conv_plan(bad, w), "x", dtype)
    check_refusal(lambda: flux_dnn.conv1d(refused((1, 4, 5), dtype), np.zeros((6, 4, 3), BF16)), "x", dtype)
    check_refusal(lambda: flux_dnn.conv3d(refused((1, 4, 5, 5, 5), dtype), np.zeros((6, 4, 3, 3, 3), BF16)), "x", dtype)


def test_refused_dtype_given_to_a_plan(rng):
    """A plan's per-call path does not check dtypes in Python: an array NumPy cannot export
    is refused by the core's intake, with the same words, before the vendor runs."""
    x = grid(rng, (1, 4, 5, 5), np.float32)
    plan = flux_dnn.conv_plan(x, grid(rng, (6, 4, 3, 3), np.float32))
    f8 = REFUSED["float8_e4m3fn"]
    check_refusal(lambda: plan(x.astype(f8)), "x", f8)


@pytest.mark.parametrize("op", ["forward", "backward_data", "backward_weight"])
def test_bfloat16_3d_with_outputs_that_read_padding_only(rng, op):
    """A 3-D problem whose output has elements that read padding only (H: one input row, a
    dilation-2 kernel of 2 taps padded by 1 on both sides; W: lo 2 >= the kernel's extent).
    oneDNN 3.2's AMX brgemm kernel crashed creating this bfloat16 primitive on CPUs with AMX
    (ABI fuzzer, seed 1, case 820): the shim must skip it there, and compute it everywhere."""
    bf16 = ml_dtypes.bfloat16
    x = rng.integers(-8, 9, (1, 2, 2, 1, 2)) / 8
    w = rng.integers(-8, 9, (4, 1, 3, 2, 2)) / 8
    geo = dict(stride=(1, 2, 1), dilation=(1, 2, 1), groups=2)
    lo, hi = (1, 1, 2), (2, 1, 0)
    padding = tuple(zip(lo, hi))
    y_ref = ref.conv_forward(x, w, None, geo["stride"], lo, hi, geo["dilation"], groups=2)
    if op == "forward":
        got, expected = flux_dnn.conv3d(x.astype(bf16), w.astype(bf16), padding=padding, **geo), y_ref
    elif op == "backward_data":
        dy = rng.integers(-8, 9, y_ref.shape) / 8
        got = flux_dnn.conv_backward_data(dy.astype(bf16), w.astype(bf16), x.shape, padding=padding, **geo)
        expected = ref.conv_backward_data(dy, w, x.shape, geo["stride"], lo, hi, geo["dilation"], groups=2)
    else:
        dy = rng.integers(-8, 9, y_ref.shape) / 8
        got = flux_dnn.conv_backward_weight(x.astype(bf16), dy.astype(bf16), w.shape, padding=padding, **geo)
        expected = ref.conv_backward_weight(x, dy, w.shape, geo["stride"], lo, hi, geo["dilation"], groups=2)
    # Inputs in eighths: every product and sum is exact in float32, so one rounding to
    # bfloat16 (8 significant bits) is the only error.
    np.testing.assert_allclose(np.asarray(got, np.float64), expected, rtol=2**-8, atol=2**-8 * np.abs(expected).max())
