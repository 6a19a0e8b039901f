"""The MIOpen test double itself, called with ctypes: that it computes the convolution a
float64 reference does, and that it refuses what MIOpen's documentation refuses, so that the
MIOpen shim passing on it means its plumbing keeps to those contracts. (Whether the real
MIOpen behaves so is not checked here: no AMD GPU.)"""

from __future__ import annotations

import ctypes as C

import numpy as np
import pytest

import reference as ref
from doubles import miopen as double

SUCCESS, BAD_PARM, NOT_IMPLEMENTED = 0, 3, 6
HALF, FLOAT, BFLOAT16, DOUBLE = 0, 1, 5, 6
FORWARD = "miopenConvolutionForward"


class Solution(C.Structure):
    _fields_ = [
        ("time", C.c_float),
        ("workspace_size", C.c_size_t),
        ("solution_id", C.c_uint64),
        ("algorithm", C.c_int),
    ]


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    try:
        return C.CDLL(str(double.build(tmp_path_factory.mktemp("miopen_double"))))
    except RuntimeError as exc:  # no C++ compiler here
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def handle(lib):
    h = C.c_void_p()
    assert lib.miopenCreate(C.byref(h)) == SUCCESS
    return h


def desc(lib, shape, strides=None, dtype=FLOAT):
    d = C.c_void_p()
    assert lib.miopenCreateTensorDescriptor(C.byref(d)) == SUCCESS
    n = len(shape)
    if strides is None:
        strides = [int(np.prod(shape[i + 1 :])) for i in range(n)]
    status = lib.miopenSetTensorDescriptor(d, dtype, n, (C.c_int * n)(*shape), (C.c_int * n)(*strides))
    assert status == SUCCESS
    return d


def conv(lib, pad=1, stride=1, dilation=1, groups=1):
    c = C.c_void_p()
    assert lib.miopenCreateConvolutionDescriptor(C.byref(c)) == SUCCESS
    two = C.c_int * 2
    assert (
        lib.miopenInitConvolutionNdDescriptor(c, 2, two(pad, pad), two(stride, stride), two(dilation, dilation), 0) == 0
    )
    assert lib.miopenSetConvolutionGroupCount(c, groups) == SUCCESS
    return c


def solutions(lib, handle, w, x, c, y, prefix=FORWARD):
    found, n = (Solution * 4)(), C.c_size_t()
    status = getattr(lib, prefix + "GetSolution")(handle, w, x, c, y, C.c_size_t(4), C.byref(n), found)
    return status, list(found[: n.value])


def ptr(a):
    return C.c_void_p(a.ctypes.data)


def immediate(lib, handle, w, wa, x, xa, c, y, ya, ws, ws_size, solution_id):
    return lib.miopenConvolutionForwardImmediate(
        handle, w, ptr(wa), x, ptr(xa), c, y, ptr(ya), ws, C.c_size_t(ws_size), C.c_uint64(solution_id)
    )


def test_forward_matches_the_float64_reference(lib, handle, rng):
    xa = rng.standard_normal((2, 4, 7, 6)).astype(np.float32)
    wa = rng.standard_normal((6, 2, 3, 3)).astype(np.float32)
    ya = np.full((2, 6, 4, 3), np.nan, np.float32)
    x, w, y, c = desc(lib, xa.shape), desc(lib, wa.shape), desc(lib, ya.shape), conv(lib, 1, 2, 1, groups=2)
    status, found = solutions(lib, handle, w, x, c, y)
    assert status == SUCCESS and [s.solution_id for s in found] == [2, 1]
    assert immediate(lib, handle, w, wa, x, xa, c, y, ya, None, 0, 1) == SUCCESS
    expected = ref.conv_forward(xa.astype(np.float64), wa.astype(np.float64), None, (2, 2), (1, 1), (1, 1), (1, 1), 2)
    np.testing.assert_allclose(ya, expected, rtol=1e-5, atol=1e-5)


def test_immediate_needs_an_id_from_get_solution_and_its_workspace(lib, handle, rng):
    xa, wa = np.ones((1, 2, 5, 5), np.float32), np.ones((3, 2, 3, 3), np.float32)
    ya = np.zeros((1, 3, 5, 5), np.float32)
    x, w, y, c = desc(lib, xa.shape), desc(lib, wa.shape), desc(lib, ya.shape), conv(lib)
    assert immediate(lib, handle, w, wa, x, xa, c, y, ya, None, 0, 1) == BAD_PARM  # no GetSolution yet
    status, found = solutions(lib, handle, w, x, c, y)
    gemm = next(s for s in found if s.workspace_size > 0)
    small = np.zeros(gemm.workspace_size - 1, np.uint8)
    assert immediate(lib, handle, w, wa, x, xa, c, y, ya, ptr(small), small.size, gemm.solution_id) == BAD_PARM
    enough = np.zeros(gemm.workspace_size, np.uint8)
    assert immediate(lib, handle, w, wa, x, xa, c, y, ya, ptr(enough), enough.size, gemm.solution_id) == SUCCESS
    assert (enough == 0xFF).all()  # scribbled: nothing the caller keeps there survives


def _count(lib, handle, w, x, c, y):
    n = C.c_size_t()
    return lib.miopenConvolutionForwardGetSolutionCount(handle, w, x, c, y, C.byref(n))


def test_refuses_what_miopen_does_not_do(lib, handle):
    nchw = desc(lib, (1, 4, 6, 6))
    y = desc(lib, (1, 4, 6, 6))
    # layouts read from the strides: x NCHW with w NHWC is not one layout
    w_nhwc = desc(lib, (4, 4, 3, 3), strides=(36, 1, 12, 4))
    assert _count(lib, handle, w_nhwc, nchw, conv(lib), y) == NOT_IMPLEMENTED
    # grouped and dilated
    w_grouped = desc(lib, (4, 2, 3, 3))
    y_dilated = desc(lib, (1, 4, 4, 4))
    assert _count(lib, handle, w_grouped, nchw, conv(lib, dilation=2, groups=2), y_dilated) == NOT_IMPLEMENTED
    assert _count(lib, handle, w_grouped, nchw, conv(lib, pad=2, dilation=2, groups=1), y) == BAD_PARM
    # float64
    x64, w64, y64 = desc(lib, (1, 4, 6, 6), dtype=DOUBLE), desc(lib, (4, 4, 3, 3), dtype=DOUBLE), None
    y64 = desc(lib, (1, 4, 6, 6), dtype=DOUBLE)
    assert _count(lib, handle, w64, x64, conv(lib), y64) == NOT_IMPLEMENTED
    # a wrong output size
    assert _count(lib, handle, desc(lib, (4, 4, 3, 3)), nchw, conv(lib, pad=0), y) == BAD_PARM


def _bias_gradient(lib, handle, dy_desc, dy, alpha=1.0, beta=0.0, dtype=FLOAT):
    db = np.zeros(4, np.float32 if dtype == FLOAT else np.uint16)
    a, b = C.c_float(alpha), C.c_float(beta)
    db_desc = desc(lib, (1, 4, 1, 1), dtype=dtype)
    status = lib.miopenConvolutionBackwardBias(handle, C.byref(a), dy_desc, ptr(dy), C.byref(b), db_desc, ptr(db))
    return status, db


def test_bias_gradient_is_nchw_float_and_plain_only(lib, handle, rng):
    dy = rng.standard_normal((2, 4, 3, 5)).astype(np.float32)
    status, db = _bias_gradient(lib, handle, desc(lib, dy.shape), dy)
    assert status == SUCCESS
    np.testing.assert_allclose(db, dy.astype(np.float64).sum(axis=(0, 2, 3)), rtol=1e-5)
    nhwc = desc(lib, (2, 4, 3, 5), strides=(60, 1, 20, 4))
    assert _bias_gradient(lib, handle, nhwc, dy)[0] == NOT_IMPLEMENTED
    assert _bias_gradient(lib, handle, desc(lib, dy.shape), dy, alpha=2.0)[0] == NOT_IMPLEMENTED
    bf16 = desc(lib, dy.shape, dtype=BFLOAT16)
    assert _bias_gradient(lib, handle, bf16, dy.view(np.uint16), dtype=BFLOAT16)[0] == NOT_IMPLEMENTED


def test_op_tensor_with_beta_zero_does_not_read_the_output(lib, handle, rng):
    a = rng.standard_normal((1, 3, 2, 2)).astype(np.float32)
    out = np.full_like(a, np.nan)
    d = desc(lib, a.shape)
    one, zero = C.c_float(1.0), C.c_float(0.0)
    status = lib.miopenOpTensor(
        handle, 3, C.byref(one), d, ptr(a), C.byref(one), d, ptr(a), C.byref(zero), d, ptr(out)
    )  # max(a, a) + 0 * out
    assert status == SUCCESS
    np.testing.assert_array_equal(out, a)
