"""The MIOpen test double itself, called with ctypes: that it computes the convolution a
float64 reference does, and that it behaves as MIOpen's source does where that surprises
(miopen_double.cpp names each source): OpTensor's flat, NCHW-bias and last-stride-1 kernels,
alpha in the tensor's type, the bfloat16 refusals, POWER's clamp, strides > 0, any applicable
solution id, grouped + dilated served, the bias gradient's NCHW reading and contiguous write.
(Whether the real MIOpen behaves so is not checked here: no AMD GPU.)"""

from __future__ import annotations

import ctypes as C

import numpy as np
import pytest

import reference as ref
from doubles import miopen as double

SUCCESS, BAD_PARM, NOT_IMPLEMENTED, UNKNOWN = 0, 3, 6, 7
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


def raw_desc_status(lib, shape, strides, dtype=FLOAT):
    d = C.c_void_p()
    assert lib.miopenCreateTensorDescriptor(C.byref(d)) == SUCCESS
    n = len(shape)
    return lib.miopenSetTensorDescriptor(d, dtype, n, (C.c_int * n)(*shape), (C.c_int * n)(*strides))


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


def test_immediate_takes_any_applicable_id_and_its_workspace(lib, handle, rng):
    """No GetSolution needed first: CompileSolution and Immediate take any applicable solver
    id (MIOpen's convolutionocl.cpp), and a find-db record changes what GetSolution lists."""
    xa, wa = np.ones((1, 2, 5, 5), np.float32), np.ones((3, 2, 3, 3), np.float32)
    ya = np.zeros((1, 3, 5, 5), np.float32)
    x, w, y, c = desc(lib, xa.shape), desc(lib, wa.shape), desc(lib, ya.shape), conv(lib)
    assert immediate(lib, handle, w, wa, x, xa, c, y, ya, None, 0, 1) == SUCCESS
    assert immediate(lib, handle, w, wa, x, xa, c, y, ya, None, 0, 99) == BAD_PARM  # not applicable
    status, found = solutions(lib, handle, w, x, c, y)
    assert [s.solution_id for s in found] == [2, 1]
    lib.fdnn_double_set_find_record(1)
    try:
        assert [s.solution_id for s in solutions(lib, handle, w, x, c, y)[1]] == [3, 1]
    finally:
        lib.fdnn_double_set_find_record(0)
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
    # grouped and dilated: served (MIOpen's ValidateGroupCount has no dilation test)
    w_grouped = desc(lib, (4, 2, 3, 3))
    y_dilated = desc(lib, (1, 4, 4, 4))
    assert _count(lib, handle, w_grouped, nchw, conv(lib, dilation=2, groups=2), y_dilated) == SUCCESS
    # a stride of 0: "Strides must be > 0"
    assert raw_desc_status(lib, (1, 4, 6, 6), (0, 36, 6, 1)) == BAD_PARM
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


def test_bias_gradient_reads_nchw_and_writes_contiguously(lib, handle, rng):
    dy = rng.standard_normal((2, 4, 3, 5)).astype(np.float32)
    status, db = _bias_gradient(lib, handle, desc(lib, dy.shape), dy)
    assert status == SUCCESS
    # Sums of 30 float32 values in float32: the error scales with the sum of magnitudes, not
    # with a sum that may cancel to near zero (rtol alone failed on one seed in CI).
    scale = np.abs(dy).astype(np.float64).sum(axis=(0, 2, 3))
    np.testing.assert_allclose(db, dy.astype(np.float64).sum(axis=(0, 2, 3)), rtol=1e-5, atol=1e-5 * scale.max())
    # NHWC memory described as such is still read channel map by channel map: wrong sums
    nhwc = np.ascontiguousarray(dy.transpose(0, 2, 3, 1))
    status, db = _bias_gradient(lib, handle, desc(lib, dy.shape, strides=(60, 1, 20, 4)), nhwc)
    flat = nhwc.reshape(-1)
    misread = [sum(flat[n * 60 + k + i] for n in range(2) for i in range(15)) for k in range(4)]
    assert status == SUCCESS
    np.testing.assert_allclose(db, misread, rtol=1e-5, atol=1e-5 * scale.max())
    assert _bias_gradient(lib, handle, desc(lib, dy.shape), dy, alpha=2.0)[0] == UNKNOWN
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


def _op(lib, handle, op, a_desc, a, b_desc, b, c_desc, c, alpha1=1.0, alpha2=1.0, beta=0.0):
    a1, a2, be = C.c_float(alpha1), C.c_float(alpha2), C.c_float(beta)
    return lib.miopenOpTensor(
        handle, op, C.byref(a1), a_desc, ptr(a), C.byref(a2), b_desc, ptr(b), C.byref(be), c_desc, ptr(c)
    )


ADD, MAX = 0, 3
NHWC_STRIDES = (48, 1, 12, 3)  # (2, 3, 4, 4) in NHWC memory


def test_op_tensor_processes_packed_operands_flat(lib, handle, rng):
    """A packed NCHW source into a packed NHWC destination is not permuted (Op4dTensorLite)."""
    a = rng.standard_normal((2, 3, 4, 4)).astype(np.float32)
    out = np.zeros(a.size, np.float32)
    nchw, nhwc = desc(lib, a.shape), desc(lib, a.shape, strides=NHWC_STRIDES)
    assert _op(lib, handle, MAX, nchw, a, nchw, a, nhwc, out) == SUCCESS
    np.testing.assert_array_equal(out, a.reshape(-1))


def test_op_tensor_bias_is_added_as_nchw(lib, handle, rng):
    """A (1, K, 1, 1) bias on an NHWC C lands on NCHW positions (ROCm/MIOpen#2860)."""
    y = np.zeros(2 * 3 * 4 * 4, np.float32)
    bias = np.array([1.0, 2.0, 3.0], np.float32)
    nhwc = desc(lib, (2, 3, 4, 4), strides=NHWC_STRIDES)
    assert _op(lib, handle, ADD, nhwc, y, desc(lib, (1, 3, 1, 1)), bias, nhwc, y) == SUCCESS
    # index n * 48 + k * 1 + hw (hw < 16): channel k's run starts at k, overlapping the others
    assert not (y.reshape(2, 4, 4, 3) == bias).all()
    assert (y.reshape(2, 48)[:, 18:] == 0).all()  # past the runs: never written


def test_op_tensor_generic_kernels_take_the_last_stride_as_one(lib, handle, rng):
    """5-D: no stride is passed for the last dim (Op5dTensorGeneric)."""
    a = rng.standard_normal(16).astype(np.float32)
    out = np.zeros(8, np.float32)
    every_other = desc(lib, (1, 1, 1, 1, 8), strides=(16, 16, 16, 16, 2))
    packed = desc(lib, (1, 1, 1, 1, 8))
    assert _op(lib, handle, MAX, every_other, a, every_other, a, packed, out) == SUCCESS
    np.testing.assert_array_equal(out, a[:8])
    # with a unit last dim, every real stride is used
    as_h = desc(lib, (1, 1, 1, 8, 1), strides=(16, 16, 16, 2, 1))
    assert _op(lib, handle, MAX, as_h, a, as_h, a, desc(lib, (1, 1, 1, 8, 1)), out) == SUCCESS
    np.testing.assert_array_equal(out, a[::2])


def test_op_tensor_refuses_bfloat16(lib, handle):
    d = desc(lib, (1, 2, 2, 2), dtype=BFLOAT16)
    a = np.zeros(8, np.uint16)
    assert _op(lib, handle, ADD, d, a, d, a, d, a) == UNKNOWN


def test_set_and_scale_read_alpha_in_the_tensors_type(lib, handle):
    """A float 0.75 read as half is 0 (SetTensor, ScaleTensor: `*as_float(alpha)`)."""
    d = desc(lib, (1, 1, 1, 4), dtype=HALF)
    y = np.ones(4, np.float16)
    as_float, as_half = C.c_float(0.75), C.c_uint16(int(np.float16(0.75).view(np.uint16)))
    assert lib.miopenScaleTensor(handle, d, ptr(y), C.byref(as_half)) == SUCCESS
    np.testing.assert_array_equal(y, 0.75)
    assert lib.miopenScaleTensor(handle, d, ptr(y), C.byref(as_float)) == SUCCESS
    np.testing.assert_array_equal(y, 0.0)
    assert lib.miopenSetTensor(handle, d, ptr(y), C.byref(as_half)) == SUCCESS
    np.testing.assert_array_equal(y, 0.75)
    bf = desc(lib, (1, 1, 1, 4), dtype=BFLOAT16)
    assert lib.miopenScaleTensor(handle, bf, ptr(np.zeros(4, np.uint16)), C.byref(as_half)) == BAD_PARM


def _activation(lib, mode, alpha, beta, gamma):
    a = C.c_void_p()
    assert lib.miopenCreateActivationDescriptor(C.byref(a)) == SUCCESS
    status = lib.miopenSetActivationDescriptor(a, mode, C.c_double(alpha), C.c_double(beta), C.c_double(gamma))
    assert status == SUCCESS
    return a


def test_activations_power_clamp_and_bfloat16(lib, handle):
    """POWER is 0 where alpha + beta x <= EPSILON; bfloat16 is NotImplemented; alpha != 1 is
    refused."""
    power = _activation(lib, 6, 0.0, 1.0, 3.0)
    x = np.array([-2.0, -0.5, 0.5, 2.0], np.float32)
    y = np.full_like(x, np.nan)
    d = desc(lib, (1, 1, 1, 4))
    one, zero, two = C.c_float(1.0), C.c_float(0.0), C.c_float(2.0)
    assert lib.miopenActivationForward(handle, power, C.byref(one), d, ptr(x), C.byref(zero), d, ptr(y)) == SUCCESS
    np.testing.assert_allclose(y, [0.0, 0.0, 0.125, 8.0])
    assert lib.miopenActivationForward(handle, power, C.byref(two), d, ptr(x), C.byref(zero), d, ptr(y)) == UNKNOWN
    bf = desc(lib, (1, 1, 1, 4), dtype=BFLOAT16)
    b = np.zeros(4, np.uint16)
    status = lib.miopenActivationForward(handle, power, C.byref(one), bf, ptr(b), C.byref(zero), bf, ptr(b))
    assert status == NOT_IMPLEMENTED
