"""Metal tensors through DLPack: torch releases up to at least 2.9.1 export an MPS tensor with
a storage offset as ``data = data_ptr()`` (the MTLBuffer's address plus the offset, which is
no object) and ``byte_offset = 0``; the MPS shim would hand that address to ARC as an
``id<MTLBuffer>`` and crash. Fixed torch exports the buffer and ``byte_offset = storage_offset
* itemsize`` (pytorch PR #169272). Rather than guess the first fixed release, the adapter reads
the capsule it is about to pass and refuses a broken one (review row 1, issue 27)."""

from __future__ import annotations

import ctypes


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    """dlpack.h's DLTensor: the first member of a "dltensor" capsule's DLManagedTensor."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_is_valid.restype = ctypes.c_int
_is_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]


def dltensor_of(capsule) -> DLTensor | None:
    """The DLTensor inside an unconsumed "dltensor" capsule (torch's to_dlpack), or None for
    any other object; read only, the capsule stays unconsumed."""
    if not _is_valid(capsule, b"dltensor"):
        return None
    return DLTensor.from_address(_get_pointer(capsule, b"dltensor"))


def offset_refusal(storage_offset: int, itemsize: int, byte_offset: int, torch_version: str) -> str | None:
    """Why an exported Metal tensor cannot be used, or None: a storage offset must come as
    byte_offset, since Metal's `data` is an object, not an address."""
    if storage_offset == 0 or byte_offset == storage_offset * itemsize:
        return None
    return (
        f"torch {torch_version} exports an MPS tensor with storage offset {storage_offset} as an "
        f"address inside its MTLBuffer with byte_offset {byte_offset} (pytorch PR #169272 fixed "
        "this): pass a copy (tensor.clone()) or use a torch with the fix"
    )


def check_torch_export(tensor, capsule) -> None:
    """Raises ValueError for a torch MPS capsule that carries its offset the broken way."""
    dl = dltensor_of(capsule)
    if dl is None:
        return
    import torch

    why = offset_refusal(tensor.storage_offset(), tensor.element_size(), dl.byte_offset, torch.__version__)
    if why is not None:
        raise ValueError(why)
