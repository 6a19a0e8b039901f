"""Bad input: a clear ValueError/TypeError naming the argument, raised before any vendor call,
and never a partly written output."""

import ctypes
import re

import numpy as np
import pytest

import flux_dnn
from flux_dnn import _core


@pytest.fixture
def xw(rng):
    x = rng.standard_normal((2, 4, 8, 8), dtype=np.float32)
    w = rng.standard_normal((6, 4, 3, 3), dtype=np.float32)
    return x, w


def check_untouched(out, call, error, match):
    before = out.copy()
    with pytest.raises(error, match=match):
        call()
    np.testing.assert_array_equal(out, before)


@pytest.mark.parametrize(
    "x_shape,match",
    [
        ((4, 8, 8), r"x: a 2-D convolution expects a 4-D array"),
        ((1, 2, 4, 8, 8), r"x: a 2-D convolution expects a 4-D array"),
    ],
)
def test_wrong_rank_of_x(rng, xw, x_shape, match):
    with pytest.raises(ValueError, match=match):
        flux_dnn.conv2d(np.zeros(x_shape, np.float32), xw[1])


def test_wrong_rank_of_w(xw):
    with pytest.raises(ValueError, match=r"w: a 2-D convolution expects a 4-D array .*got shape \(6, 4, 3\)"):
        flux_dnn.conv2d(xw[0], xw[1][..., 0])


def test_channels_do_not_match(rng, xw):
    w = rng.standard_normal((6, 3, 3, 3), dtype=np.float32)
    with pytest.raises(ValueError, match=r"w: shape \(6, 3, 3, 3\) has C/groups = 3.*must be 4"):
        flux_dnn.conv2d(xw[0], w)


def test_groups_must_divide_channels(rng, xw):
    with pytest.raises(ValueError, match=r"groups: 3 does not divide the 4 channels of x"):
        flux_dnn.conv2d(xw[0], xw[1], groups=3)
    w = rng.standard_normal((5, 2, 3, 3), dtype=np.float32)
    with pytest.raises(ValueError, match=r"groups: 2 does not divide the 5 output channels"):
        flux_dnn.conv2d(xw[0], w, groups=2)


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(stride=0), r"stride: every value must be >= 1, got 0"),
        (dict(stride=(1, -2)), r"stride: every value must be >= 1"),
        (dict(dilation=0), r"dilation: every value must be >= 1"),
        (dict(padding=-1), r"padding: must be >= 0, got -1"),
        (dict(padding=((0, -1), (1, 1))), r"padding: must be >= 0"),
        (dict(padding=(1, 2, 3)), r"padding: expected an int or 2 ints"),
        (dict(padding="full"), r"padding: expected an int, a tuple, per-side pairs, 'same' or 'valid', got 'full'"),
        (dict(padding="same", stride=2), r"padding: 'same' needs stride 1"),
        (dict(groups=0), r"groups: must be >= 1, got 0"),
        (dict(stride=1.5), r"stride: expected an integer, got 1.5"),
        (dict(groups=True), r"groups: expected an integer, got True"),
    ],
)
def test_bad_parameters(xw, kw, match):
    error = TypeError if "expected an integer" in match else ValueError
    with pytest.raises(error, match=match):
        flux_dnn.conv2d(*xw, **kw)


def test_kernel_larger_than_padded_input(rng):
    x = rng.standard_normal((1, 2, 4, 4), dtype=np.float32)
    w = rng.standard_normal((3, 2, 3, 3), dtype=np.float32)
    with pytest.raises(ValueError, match=r"effective kernel size 5 .*dilation 2.*larger than the padded input size 4"):
        flux_dnn.conv2d(x, w, dilation=2)
    flux_dnn.conv2d(x, w, dilation=2, padding=1)  # 6 >= 5: fine


def test_dtypes_must_match(xw):
    x, w = xw
    with pytest.raises(TypeError, match=r"w: dtype float16 differs from x's dtype float32"):
        flux_dnn.conv2d(x, w.astype(np.float16))
    with pytest.raises(TypeError, match=r"bias: dtype float64 differs from x's dtype float32"):
        flux_dnn.conv2d(x, w, np.zeros(6))


def test_unsupported_dtype_names_what_each_shim_computes(xw):
    torch = pytest.importorskip("torch")
    x, w = (torch.from_numpy(a) for a in xw)
    with pytest.raises(
        TypeError,
        match=r"x: dtype int32 is not supported by any shim for CPU arrays here:\n"
        r"  shim '(onednn|blas)' computes float(.|\n)*"
        r"accepted dtypes: float64, float32, float16, bfloat16",
    ):
        flux_dnn.conv2d(x.to(torch.int32), w.to(torch.int32))


def test_bias_shape(xw):
    with pytest.raises(ValueError, match=r"bias: expected shape \(6,\) \(one value per output channel\), got \(4,\)"):
        flux_dnn.conv2d(*xw, np.zeros(4, np.float32))


def test_out_checks_leave_out_untouched(xw):
    x, w = xw
    good = np.full((2, 6, 6, 6), 7.0, np.float32)
    wrong_shape = np.full((2, 6, 6, 5), 7.0, np.float32)
    check_untouched(
        wrong_shape,
        lambda: flux_dnn.conv2d(x, w, out=wrong_shape),
        ValueError,
        r"out: shape \(2, 6, 6, 5\) does not match the result's shape \(2, 6, 6, 6\)",
    )
    wrong_dtype = np.full((2, 6, 6, 6), 7.0, np.float16)
    check_untouched(
        wrong_dtype,
        lambda: flux_dnn.conv2d(x, w, out=wrong_dtype),
        TypeError,
        r"out: dtype float16 differs from x's dtype float32",
    )
    read_only = good.copy()
    read_only.flags.writeable = False
    check_untouched(read_only, lambda: flux_dnn.conv2d(x, w, out=read_only), ValueError, r"out: the array is read-only")
    check_untouched(good, lambda: flux_dnn.conv2d(x, w, out=good, stride=0), ValueError, r"stride")


def test_beta_needs_out(xw):
    with pytest.raises(ValueError, match=r"beta: beta=1.0 accumulates into an existing output, so it needs out="):
        flux_dnn.conv2d(*xw, beta=1.0)


def test_unknown_activation(xw):
    with pytest.raises(ValueError, match=r"activation: unknown activation 'swish'; known: relu, leaky_relu"):
        flux_dnn.conv2d(*xw, activation="swish")


def test_object_without_dlpack(xw):
    with pytest.raises(TypeError, match=r"x: expected an array that supports DLPack .*got builtins.list"):
        flux_dnn.conv2d([[1.0]], xw[1])
    with pytest.raises(TypeError, match=r"w: expected an array that supports DLPack"):
        flux_dnn.conv2d(xw[0], "weights")


class OtherDevice:
    """A NumPy array that reports another device through DLPack: dispatch sees what a CUDA or
    ROCm array would show, without pretending any computation happens there."""

    def __init__(self, array, device):
        self._array, self._device = array, device
        self.shape, self.dtype = array.shape, array.dtype

    def __dlpack_device__(self):
        return self._device

    def __dlpack__(self, **kwargs):
        raise AssertionError("a vendor call was attempted for an array on a device without a shim")


def test_arrays_on_different_devices(xw):
    x, w = xw
    with pytest.raises(ValueError, match=r"w is on CUDA:0 but x is on CPU:0"):
        flux_dnn.conv2d(x, OtherDevice(w, (2, 0)))


def test_device_without_shim_names_device_and_fix(xw):
    """A ROCm array with no usable ROCm shim: the error names the device and the fix (the
    package to install or, with flux-dnn-rocm installed but unusable here, the shim's reason)."""
    x, w = xw
    rocm_shims = [s for s in flux_dnn.shims() if s.device_type == 10]
    if any(s.usable for s in rocm_shims):
        pytest.skip("a usable ROCm shim is installed: ROCm arrays have a shim here")
    fix = re.escape(rocm_shims[0].reason) if rocm_shims else r"pip install flux-dnn-rocm"
    with pytest.raises(flux_dnn.DeviceUnavailableError, match=rf"(?s)ROCm arrays.*{fix}"):
        flux_dnn.conv2d(OtherDevice(x, (10, 0)), OtherDevice(w, (10, 0)))


def test_backward_errors(rng):
    x = rng.standard_normal((2, 4, 8, 8), dtype=np.float32)
    w = rng.standard_normal((6, 4, 3, 3), dtype=np.float32)
    dy = rng.standard_normal((2, 6, 6, 6), dtype=np.float32)
    with pytest.raises(ValueError, match=r"input_shape: expected 4 ints"):
        flux_dnn.conv_backward_data(dy, w, (2, 4, 8))
    with pytest.raises(ValueError, match=r"dy: shape \(2, 6, 6, 6\) is not the output shape \(2, 6, 7, 7\)"):
        flux_dnn.conv_backward_data(dy, w, (2, 4, 9, 9))
    with pytest.raises(ValueError, match=r"weight_shape: expected 4 ints"):
        flux_dnn.conv_backward_weight(x, dy, (6, 4, 3))
    with pytest.raises(ValueError, match=r"dy: shape .* is not the output shape \(2, 6, 4, 4\)"):
        flux_dnn.conv_backward_weight(x, dy, (6, 4, 5, 5))
    with pytest.raises(ValueError, match=r"out: with bias_grad=True, out must be a \(dw, db\) pair"):
        flux_dnn.conv_backward_weight(x, dy, w.shape, bias_grad=True, out=np.zeros_like(w))


def test_transpose_errors(rng):
    x = rng.standard_normal((2, 4, 5, 5), dtype=np.float32)
    w = rng.standard_normal((4, 3, 3, 3), dtype=np.float32)
    with pytest.raises(ValueError, match=r"output_padding: \(2, 2\) must be smaller than stride \(2, 2\) or dilation"):
        flux_dnn.conv_transpose2d(x, w, stride=2, output_padding=2)
    with pytest.raises(ValueError, match=r"w: a transposed convolution's w is \(C_in, C_out/groups, ...\)"):
        flux_dnn.conv_transpose2d(x, w[:3])
    with pytest.raises(ValueError, match=r"padding: a transposed convolution takes ints"):
        flux_dnn.conv_transpose2d(x, w, padding="same")


def test_strided_views_work_or_raise(rng):
    """Views with steps, channel slices, transposes and broadcast inputs compute correctly;
    negative strides, overlapping outputs and outputs aliasing an input raise ValueError."""
    import reference as ref

    x = rng.standard_normal((2, 4, 12, 12)).astype(np.float32)
    w = rng.standard_normal((3, 4, 3, 3)).astype(np.float32)
    views = [
        (x[:, :, ::2, ::3], w),
        (x[:, 1:3], w[:, 1:3]),
        (x.transpose(0, 1, 3, 2), w),
        (np.broadcast_to(x[:1], x.shape), w),
        (x, w.transpose(0, 1, 3, 2)),
    ]
    for xv, wv in views:
        expected = ref.conv_forward(xv, wv)
        np.testing.assert_allclose(flux_dnn.conv2d(xv, wv), expected, rtol=2e-4, atol=2e-4 * np.abs(expected).max())
    out = np.full((2, 3, 20, 10), np.nan, np.float32)[:, :, ::2]
    flux_dnn.conv2d(x, w, out=out)
    np.testing.assert_allclose(out, ref.conv_forward(x, w), rtol=2e-4, atol=1e-3)
    with pytest.raises(ValueError, match=r"x: negative strides are not supported"):
        flux_dnn.conv2d(x[:, :, ::-1], w)
    square = rng.standard_normal((1, 3, 6, 6)).astype(np.float32)
    kernel = rng.standard_normal((3, 3, 3, 3)).astype(np.float32)
    before = square.copy()
    with pytest.raises(ValueError, match=r"out shares memory with x"):
        flux_dnn.conv2d(square, kernel, padding=1, out=square)
    np.testing.assert_array_equal(square, before)
    plan = flux_dnn.conv_plan(square, kernel, padding=1)
    with pytest.raises(ValueError, match=r"out shares memory with x"):
        plan(square, out=square)


def test_overlapping_output_is_refused(rng):
    torch = pytest.importorskip("torch", reason="a writable zero-stride view needs torch.expand")
    x = torch.randn(2, 3, 6, 6)
    w = torch.randn(4, 3, 3, 3)
    out = torch.zeros(1, 4, 4, 4).expand(2, 4, 4, 4)
    with pytest.raises(ValueError, match=r"out: the output has overlapping elements"):
        flux_dnn.conv2d(x, w, out=out)


# -- the shim's error codes, as the core raises them -------------------------------------------


@pytest.mark.parametrize(
    "code,error",
    [
        (_core.ERROR_INVALID_ARGUMENT, ValueError),
        (_core.ERROR_UNSUPPORTED, flux_dnn.UnsupportedError),
        (_core.ERROR_UNAVAILABLE, flux_dnn.DeviceUnavailableError),
        (_core.ERROR_OUT_OF_MEMORY, MemoryError),
        (_core.ERROR_VENDOR, flux_dnn.VendorError),
        (_core.ERROR_INTERNAL, RuntimeError),
        (77, RuntimeError),  # a code this core does not know (a newer shim's)
    ],
)
def test_shim_error_codes_become_exceptions(tmp_path, code, error):
    from test_shims import fake_shim

    shim = _core.load_shim(str(fake_shim(tmp_path, "failing")))
    x, w = np.zeros((1, 2, 4, 4), np.float32), np.ones((2, 2, 1, 1), np.float32)
    y = np.full((1, 2, 4, 4), 3.0, np.float32)
    spec = _core.ConvSpec(_core.CONV_FORWARD, 2, [1, 1], [1, 1], [0, 0], [0, 0], 1000 + code)
    with pytest.raises(error, match=rf"^\[failing\] creating a plan: fake failure code {code}$") as info:
        _core.run_conv(shim, spec, x, w, y, None, None, None)
    assert type(info.value) is error
    assert (y == 3.0).all()


# -- DLPack intake: a versioned capsule of an unknown major version ----------------------------


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device_type", ctypes.c_int32),
        ("device_id", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("code", ctypes.c_uint8),
        ("bits", ctypes.c_uint8),
        ("lanes", ctypes.c_uint16),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensorVersioned(ctypes.Structure):  # DLPack 1.x's layout
    _fields_ = [
        ("major", ctypes.c_uint32),
        ("minor", ctypes.c_uint32),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", DELETER),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", DLTensor),
    ]


def versioned_capsule(major, array, deleted):
    """A "dltensor_versioned" capsule of DLPack version (major, 1) describing `array`; its
    deleter appends the managed tensor's address to `deleted`. Returns (capsule, keep-alive)."""
    shape = (ctypes.c_int64 * array.ndim)(*array.shape)
    deleter = DELETER(deleted.append)
    managed = DLManagedTensorVersioned(
        major,
        1,
        None,
        deleter,
        0,
        DLTensor(array.ctypes.data, 1, 0, array.ndim, 2, array.itemsize * 8, 1, shape, None, 0),
    )
    new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
        ("PyCapsule_New", ctypes.pythonapi)
    )  # our own prototype: pythonapi's argtypes are shared by the whole process
    return new(ctypes.addressof(managed), b"dltensor_versioned", None), (shape, deleter, managed, array)


def capsule_name(capsule):
    get = ctypes.pythonapi.PyCapsule_GetName
    get.restype, get.argtypes = ctypes.c_char_p, [ctypes.py_object]
    return get(capsule)


def test_dlpack_struct_mirror_matches_the_abi():
    layout = _core.ABI_LAYOUT["FDNN_DLTensor"]
    assert ctypes.sizeof(DLTensor) == layout["sizeof"]
    assert DLTensor.byte_offset.offset == layout["fields"]["byte_offset"][0]


def test_versioned_capsule_of_a_known_major_is_read():
    array = np.zeros((2, 3), np.float32)
    deleted = []
    capsule, keep = versioned_capsule(1, array, deleted)
    described = _core.describe_intake(capsule, "x")
    assert described["shape"] == (2, 3) and described["strides"] == (3, 1) and described["data"] == array.ctypes.data
    assert deleted == [ctypes.addressof(keep[2])] and capsule_name(capsule) == b"used_dltensor_versioned"


def test_versioned_capsule_of_an_unknown_major_is_refused_and_released():
    array = np.zeros((2, 3), np.float32)
    deleted = []
    capsule, keep = versioned_capsule(2, array, deleted)
    managed = keep[2]
    managed.dl_tensor.ndim = -5  # a field a reader of the unknown major must not look at
    with pytest.raises(
        BufferError,
        match=r"^w: the array was exported as DLPack 2\.1, a major version flux_dnn "
        r"cannot read \(it reads DLPack 1\.x\); the tensor was released unread$",
    ):
        _core.describe_intake(capsule, "w")
    assert deleted == [ctypes.addressof(managed)]  # its deleter, once
    assert capsule_name(capsule) == b"used_dltensor_versioned"  # consumed: the capsule will not free it again
