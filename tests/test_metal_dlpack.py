"""flux_dnn._metal_dlpack: the check that keeps torch's broken export of sliced MPS tensors
(an address inside the MTLBuffer, byte_offset 0; torch <= 2.9.1 at least) away from the MPS
shim. No Mac here: the capsule reader is checked on torch's CPU capsules (same DLTensor
layout), the decision on the numbers both kinds of torch export. That TorchAdapter refuses a
real sliced MPS tensor on an old torch is scripts/mac_check.sh's (tests/conformance/test_metal.py)."""

from __future__ import annotations

import pytest

from flux_dnn._metal_dlpack import dltensor_of, offset_refusal

torch = pytest.importorskip("torch")
to_dlpack = pytest.importorskip("torch.utils.dlpack").to_dlpack


def test_reads_the_dltensor_of_a_torch_capsule_and_leaves_it_unconsumed():
    base = torch.arange(48, dtype=torch.float32).reshape(4, 3, 4)
    t = base[1:3, :, 1:]
    capsule = to_dlpack(t)
    dl = dltensor_of(capsule)
    assert dl is not None
    assert dl.device.device_type == 1 and dl.ndim == 3
    assert (dl.dtype.code, dl.dtype.bits, dl.dtype.lanes) == (2, 32, 1)
    assert [dl.shape[i] for i in range(3)] == [2, 3, 3]
    assert [dl.strides[i] for i in range(3)] == [12, 4, 1]
    # Whichever way this torch splits it, data + byte_offset is the first element.
    assert dl.data + dl.byte_offset == t.data_ptr()
    back = torch.utils.dlpack.from_dlpack(capsule)  # still a valid, unconsumed capsule
    assert torch.equal(back, t)


def test_anything_but_a_dltensor_capsule_is_not_read():
    assert dltensor_of(object()) is None
    capsule = to_dlpack(torch.zeros(2))
    torch.utils.dlpack.from_dlpack(capsule)  # consumed: renamed "used_dltensor"
    assert dltensor_of(capsule) is None


@pytest.mark.parametrize(
    ("storage_offset", "itemsize", "byte_offset", "refused"),
    [
        (0, 4, 0, False),  # no offset: nothing to carry
        (3, 4, 12, False),  # fixed torch: the offset in bytes
        (5, 2, 10, False),
        (3, 4, 0, True),  # torch <= 2.9.1: the offset folded into data, byte_offset 0
        (3, 4, 8, True),  # anything else is not the tensor either
    ],
)
def test_a_storage_offset_must_come_as_byte_offset(storage_offset, itemsize, byte_offset, refused):
    why = offset_refusal(storage_offset, itemsize, byte_offset, "2.9.1")
    assert (why is not None) == refused
    if refused:
        assert f"storage offset {storage_offset}" in why and "torch 2.9.1" in why and "clone()" in why
