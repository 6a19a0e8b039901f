"""The core on a device whose DLPack `data` is an object, not an address (Metal: an
id<MTLBuffer>, byte_offset an offset into it), checked without a Mac.

The shim is tests/fake_shim.c built complete for device type 8 (kDLMetal) with
FAKE_OBJECT_DATA: it takes each tensor's `data` as it is and its byte offset from ABI 2.1's
FDNN_Buffer_Offsets, and refuses an execute without them. Its "objects" are host memory, so
its float32 sums can be compared with the float64 reference: a core that passed
data + byte_offset (pointer arithmetic on the object), or lost an offset, gives wrong numbers
or an error. Arrays reach the core as DLPack capsules made here with device (8, 0)."""

from __future__ import annotations

import ctypes as C

import numpy as np
import pytest

import reference as ref
from abi import fdnn_ctypes as F
from abi.shims import compile_fake
from flux_dnn import _core

METAL = _core.DEVICE_METAL


class ManagedTensor(C.Structure):  # DLPack's DLManagedTensor (legacy, capsule "dltensor")
    _fields_ = [("dl_tensor", F.DLTensor), ("manager_ctx", C.c_void_p), ("deleter", C.c_void_p)]


# A prototype of our own: ctypes.pythonapi.PyCapsule_New's argtypes are shared by the whole
# process, and another module's (set after this one was collected) refused our None deleter.
_capsule_new = C.PYFUNCTYPE(C.py_object, C.c_void_p, C.c_char_p, C.c_void_p)(("PyCapsule_New", C.pythonapi))
_NAME = b"dltensor"


class MetalLike:
    """A float32 tensor inside a host 'buffer' (its object), at a byte offset, with strides."""

    def __init__(self, buffer: np.ndarray, offset_elements: int, shape, strides=None):
        self.buffer, self.offset = buffer, offset_elements
        self.shape = tuple(shape)
        if strides is None:
            strides = np.cumprod((1, *self.shape[:0:-1]))[::-1].tolist()
        self.strides = tuple(int(s) for s in strides)
        self._keep = []

    def view(self) -> np.ndarray:
        """The elements, as NumPy sees them (a view into the buffer, which must hold them all:
        the fake shim, like a GPU kernel, trusts the extent)."""
        span = 1 + sum((n - 1) * s for n, s in zip(self.shape, self.strides))
        assert self.offset + span <= self.buffer.size, "the tensor does not fit its buffer"
        return np.lib.stride_tricks.as_strided(
            self.buffer[self.offset :], self.shape, tuple(s * 4 for s in self.strides), writeable=True
        )

    def capsule(self):
        self.view()  # (checks the extent)
        shape = (C.c_int64 * len(self.shape))(*self.shape)
        strides = (C.c_int64 * len(self.strides))(*self.strides)
        m = ManagedTensor()
        t = m.dl_tensor
        t.data = self.buffer.ctypes.data  # the object: never advanced by the offset
        t.device = F.DLDevice(METAL, 0)
        t.ndim = len(self.shape)
        t.dtype = F.DLDataType(2, 32, 1)
        t.shape, t.strides = shape, strides
        t.byte_offset = self.offset * 4
        self._keep += [shape, strides, m]  # alive while the core holds the capsule
        return _capsule_new(C.addressof(m), _NAME, None)


@pytest.fixture(scope="module")
def metal_fake(tmp_path_factory):
    library = compile_fake(
        tmp_path_factory.mktemp("fake_metal"),
        "fake_metal",
        "FAKE_COMPLETE",
        "FAKE_OBJECT_DATA",
        f"FAKE_DEVICE_TYPE={METAL}",
        'FAKE_NAME="fake_metal"',
        f'FAKE_SHIM_VERSION="{_core.__version__}"',
        "FAKE_DEFAULT_FLAGS=0",
    )
    return _core.load_shim(library)


def forward_spec():
    return _core.ConvSpec(_core.CONV_FORWARD, 2, [1, 1], [1, 1], [1, 0], [0, 1], 1)


def test_forward_on_buffers_at_offsets(metal_fake):
    rng = np.random.default_rng()
    xb = rng.standard_normal(200).astype(np.float32)
    wb = rng.standard_normal(100).astype(np.float32)
    yb = np.full(180, np.nan, np.float32)  # poisoned: unwritten elements show
    x = MetalLike(xb, 7, (2, 3, 4, 5))
    w = MetalLike(wb, 13, (4, 3, 2, 2))
    y = MetalLike(yb, 5, (2, 4, 4, 5))  # (4 + 1 - 2) + 1, (5 + 1 - 2) + 1
    before = yb.copy()
    _core.run_conv(metal_fake, forward_spec(), x.capsule(), w.capsule(), y.capsule(), None, None, None)
    want = ref.conv_forward(x.view().astype(np.float64), w.view().astype(np.float64), lo=[1, 0], hi=[0, 1])
    np.testing.assert_allclose(y.view(), want, rtol=1e-5, atol=1e-5)
    outside = np.ones(yb.size, bool)
    outside[5 : 5 + y.view().size] = False
    assert np.isnan(yb[outside]).all() and np.isnan(before[outside]).all()  # nothing written outside y


def test_strided_output_in_the_inputs_buffer(metal_fake):
    """y with gaps (channels-last with padding) in the same buffer as x, past x's bytes: the
    overlap check compares byte ranges inside one buffer, and the result lands there."""
    rng = np.random.default_rng()
    buf = np.full(400, np.nan, np.float32)
    buf[:120] = rng.standard_normal(120)
    x = MetalLike(buf, 0, (2, 3, 4, 5))
    wb = rng.standard_normal(60).astype(np.float32)
    w = MetalLike(wb, 1, (4, 3, 2, 2))
    # y (2, 4, 4, 5) channels-last with one spare element per pixel: strides (100, 1, 25, 5)
    y = MetalLike(buf, 160, (2, 4, 4, 5), strides=(100, 1, 25, 5))
    _core.run_conv(metal_fake, forward_spec(), x.capsule(), w.capsule(), y.capsule(), None, None, None)
    want = ref.conv_forward(x.view().astype(np.float64), w.view().astype(np.float64), lo=[1, 0], hi=[0, 1])
    np.testing.assert_allclose(y.view(), want, rtol=1e-5, atol=1e-5)


def test_output_overlapping_an_input_in_one_buffer_is_refused(metal_fake):
    buf = np.zeros(400, np.float32)
    x = MetalLike(buf, 0, (2, 3, 4, 5))
    w = MetalLike(np.zeros(60, np.float32), 0, (4, 3, 2, 2))
    y = MetalLike(buf, 100, (2, 4, 4, 5))  # x ends at element 120
    with pytest.raises(ValueError, match="shares memory with x"):
        _core.run_conv(metal_fake, forward_spec(), x.capsule(), w.capsule(), y.capsule(), None, None, None)


def test_outputs_in_other_buffers_never_overlap(metal_fake):
    """Two buffers are two objects: no overlap, whatever their addresses. Here y's object
    starts inside the address range x's strides span (in the gap between x's two images), so
    address arithmetic on the objects would have refused the call; elements never meet."""
    rng = np.random.default_rng()
    memory = rng.standard_normal(700).astype(np.float32)
    x = MetalLike(memory, 0, (2, 3, 4, 5), strides=(600, 20, 5, 1))  # elements 0..64, 600..664
    memory[100:260] = np.nan  # y's elements: in x's gap, poisoned
    y = MetalLike(memory[100:], 0, (2, 4, 4, 5))  # another object (address), offset 0
    w = MetalLike(rng.standard_normal(48).astype(np.float32), 0, (4, 3, 2, 2))
    _core.run_conv(metal_fake, forward_spec(), x.capsule(), w.capsule(), y.capsule(), None, None, None)
    want = ref.conv_forward(x.view().astype(np.float64), w.view().astype(np.float64), lo=[1, 0], hi=[0, 1])
    np.testing.assert_allclose(y.view(), want, rtol=1e-5, atol=1e-5)


def test_offsets_are_not_added_twice(metal_fake):
    """The same x at byte offset 0 and at a byte offset of one image give the two images'
    results: the shim found the offset in FDNN_Buffer_Offsets, and only there."""
    rng = np.random.default_rng()
    memory = rng.standard_normal(240).astype(np.float32)
    w = MetalLike(rng.standard_normal(48).astype(np.float32), 0, (4, 3, 2, 2))
    results = []
    for image in (0, 1):
        x = MetalLike(memory, 60 * image, (1, 3, 4, 5))
        y = MetalLike(np.full(80, np.nan, np.float32), 0, (1, 4, 4, 5))
        _core.run_conv(metal_fake, forward_spec(), x.capsule(), w.capsule(), y.capsule(), None, None, None)
        want = ref.conv_forward(x.view().astype(np.float64), w.view().astype(np.float64), lo=[1, 0], hi=[0, 1])
        np.testing.assert_allclose(y.view(), want, rtol=1e-5, atol=1e-5)
        results.append(y.view().copy())
    assert not np.allclose(results[0], results[1])
