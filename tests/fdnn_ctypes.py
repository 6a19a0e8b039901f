"""ctypes mirror of csrc/include/flux_dnn/flux_dnn.h, for tests that drive a shim library
directly (below the core), e.g. the cuDNN shim's table and its no-GPU behaviour."""

from __future__ import annotations

import ctypes as C

ERROR_NAMES = {1: "INVALID_ARGUMENT", 2: "UNSUPPORTED", 3: "UNAVAILABLE", 4: "OUT_OF_MEMORY",
               5: "VENDOR", 6: "INTERNAL"}
FUNCTIONS = ("Error_Destroy", "Error_Describe", "Shim_Info", "Device_Describe",
             "Conv_Plan_Create", "Conv_Plan_Execute", "Plan_Destroy")
OPTIONAL_FUNCTIONS = ("Conv_Plan_Pack_Weights",  # 1.1; NULL when the shim cannot
                      "Conv_Dtype_Support")  # 1.2


class Api(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("abi_major", C.c_int32), ("abi_minor", C.c_int32)] + [
        (name, C.c_void_p) for name in FUNCTIONS + OPTIONAL_FUNCTIONS]


class ErrorDestroyArgs(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("error", C.c_void_p)]


class ErrorDescribeArgs(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("error", C.c_void_p), ("code", C.c_int),
                ("message", C.c_char_p), ("message_size", C.c_size_t)]


class ShimInfoArgs(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("shim_name", C.c_char_p), ("vendor_name", C.c_char_p),
                ("vendor_version_built", C.c_char_p), ("vendor_version_runtime", C.c_char_p),
                ("device_type", C.c_int32), ("num_devices", C.c_int32),
                ("unavailable_reason", C.c_char_p)]


class DeviceDescribeArgs(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("device_id", C.c_int32), ("name", C.c_char_p)]


class DLDevice(C.Structure):
    _fields_ = [("device_type", C.c_int32), ("device_id", C.c_int32)]


class DLDataType(C.Structure):
    _fields_ = [("code", C.c_uint8), ("bits", C.c_uint8), ("lanes", C.c_uint16)]


class DLTensor(C.Structure):
    _fields_ = [("data", C.c_void_p), ("device", DLDevice), ("ndim", C.c_int32),
                ("dtype", DLDataType), ("shape", C.POINTER(C.c_int64)),
                ("strides", C.POINTER(C.c_int64)), ("byte_offset", C.c_uint64)]


I64x3 = C.c_int64 * 3


class ConvPlanCreateArgs(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("op", C.c_int), ("spatial_rank", C.c_int32),
                ("x", C.POINTER(DLTensor)), ("w", C.POINTER(DLTensor)), ("y", C.POINTER(DLTensor)),
                ("bias", C.POINTER(DLTensor)), ("stride", I64x3), ("dilation", I64x3),
                ("padding_lo", I64x3), ("padding_hi", I64x3), ("groups", C.c_int64),
                ("alpha", C.c_float), ("beta", C.c_float), ("activation", C.c_int),
                ("activation_alpha", C.c_float), ("activation_beta", C.c_float),
                ("compute_type", DLDataType), ("flags", C.c_uint32), ("algo_policy", C.c_int),
                ("algo_id", C.c_int64), ("workspace_limit", C.c_size_t), ("stream", C.c_void_p),
                ("plan", C.c_void_p), ("workspace_size", C.c_size_t), ("chosen_algo_id", C.c_int64),
                ("algo_name", C.c_char_p)]


class ConvDtypeSupportArgs(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("device_id", C.c_int32), ("dtype", DLDataType),
                ("support", C.c_int32), ("detail", C.c_char_p)]


class PlanDestroyArgs(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("plan", C.c_void_p)]


def _fn(pointer, args_type, returns_error=True):
    proto = C.CFUNCTYPE(C.c_void_p if returns_error else None, C.POINTER(args_type))
    return proto(pointer)


class Shim:
    """A shim library opened with ctypes, its table, and typed calls."""

    def __init__(self, path: str):
        self.lib = C.CDLL(path)
        self.lib.fdnn_get_api.restype = C.POINTER(Api)
        self.api = self.lib.fdnn_get_api().contents

    def describe_error(self, error) -> tuple:
        d = ErrorDescribeArgs(struct_size=C.sizeof(ErrorDescribeArgs), error=error)
        _fn(self.api.Error_Describe, ErrorDescribeArgs, False)(C.byref(d))
        result = (ERROR_NAMES.get(d.code, d.code), C.string_at(d.message, d.message_size).decode())
        _fn(self.api.Error_Destroy, ErrorDestroyArgs, False)(
            C.byref(ErrorDestroyArgs(struct_size=C.sizeof(ErrorDestroyArgs), error=error)))
        return result

    def call(self, name: str, args):
        """Calls a table function; returns None or (error code name, message)."""
        error = _fn(getattr(self.api, name), type(args))(C.byref(args))
        return None if error is None else self.describe_error(error)

    def info(self) -> ShimInfoArgs:
        args = ShimInfoArgs(struct_size=C.sizeof(ShimInfoArgs))
        error = self.call("Shim_Info", args)
        assert error is None, error
        return args


def tensor(shape, dtype=(2, 32), device=(2, 0), strides=None):
    """A DLTensor descriptor (data NULL) with compact strides unless given; keeps its arrays
    alive on the returned object."""
    n = len(shape)
    if strides is None:
        strides, acc = [0] * n, 1
        for i in reversed(range(n)):
            strides[i], acc = acc, acc * shape[i]
    t = DLTensor(data=None, device=DLDevice(*device), ndim=n, dtype=DLDataType(dtype[0], dtype[1], 1),
                 shape=(C.c_int64 * n)(*shape), strides=(C.c_int64 * n)(*strides), byte_offset=0)
    return t


def conv_args(x, w, y, *, op=0, rank=2, stride=1, padding=0, groups=1):
    args = ConvPlanCreateArgs(struct_size=C.sizeof(ConvPlanCreateArgs), op=op, spatial_rank=rank,
                              x=C.pointer(x), w=C.pointer(w), y=C.pointer(y),
                              bias=C.pointer(DLTensor(ndim=0)), groups=groups, alpha=1.0, beta=0.0,
                              workspace_limit=C.c_size_t(-1).value)
    for i in range(rank):
        args.stride[i], args.dilation[i] = stride, 1
        args.padding_lo[i] = args.padding_hi[i] = padding
    return args
