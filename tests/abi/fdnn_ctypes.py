"""ctypes mirror of csrc/include/flux_dnn/flux_dnn.h (ABI 2.0), for tests that drive a shim
library directly, below the core.

No ABI number is written here. `ABI` holds every FDNN_* constant as `_core` was compiled
with it (`_core.ABI_CONSTANTS`, generated from the header at build time), and
`mirror_mismatches` checks each ctypes struct below, field by field, against the layout the
compiler gave the header's struct (`_core.ABI_LAYOUT`: names in order, offsets, sizes,
sizeof, _STRUCT_SIZE). The function pointers of the table come from that layout too.

What the layout cannot say, and so is written here from the header's text: the C type of
each field (the layout has sizes only: a pointer and a size_t of one size look alike), which
table functions may be NULL (Conv_Plan_Pack_Weights, in a comment), and which functions
return an error (the typedefs' return types)."""

from __future__ import annotations

import ctypes as C

from flux_dnn import _core

LAYOUT: dict = _core.ABI_LAYOUT


class Constants:
    """FDNN_* constants of the header as attributes without the prefix: ABI.CONV_FORWARD,
    ABI.ERROR_UNSUPPORTED, ABI.FEATURE_GROUPS, ABI.ABI_MAJOR, ..."""

    def __init__(self, values: dict):
        self.values = dict(values)

    def __getattr__(self, name: str):
        try:
            return self.values["FDNN_" + name]
        except KeyError:
            raise AttributeError(f"FDNN_{name} is not a constant of flux_dnn.h (_core.ABI_CONSTANTS)") from None

    def group(self, prefix: str) -> dict:
        """{suffix: value} of the integer constants FDNN_<prefix>*, e.g. group("ACTIVATION_")."""
        start = "FDNN_" + prefix
        return {k[len(start) :]: v for k, v in self.values.items() if k.startswith(start) and isinstance(v, int)}


ABI = Constants(_core.ABI_CONSTANTS)
ERROR_NAMES = {v: k for k, v in ABI.group("ERROR_").items()}
DTYPES = {
    "float64": (ABI.DTYPE_FLOAT, 64),
    "float32": (ABI.DTYPE_FLOAT, 32),
    "float16": (ABI.DTYPE_FLOAT, 16),
    "bfloat16": (ABI.DTYPE_BFLOAT, 16),
}


def flux_dnn_version() -> str:
    """The version _core was built from: the shims of the same build report it too."""
    return _core.__version__


# ---------------------------------------------------------------------------------------------
# The structs (field names and order as in the header; mirror_mismatches checks them)


class ExtensionBase(C.Structure):
    pass


ExtensionBase._fields_ = [("struct_size", C.c_size_t), ("type", C.c_int32), ("next", C.POINTER(ExtensionBase))]
EXT = ("extension_start", C.POINTER(ExtensionBase))


class ErrorDestroyArgs(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), EXT, ("error", C.c_void_p)]


class ErrorDescribeArgs(C.Structure):
    _fields_ = [
        ("struct_size", C.c_size_t),
        EXT,
        ("error", C.c_void_p),
        ("code", C.c_int32),
        ("message", C.c_void_p),
        ("message_size", C.c_size_t),
    ]


class DLDevice(C.Structure):
    _fields_ = [("device_type", C.c_int32), ("device_id", C.c_int32)]


class DLDataType(C.Structure):
    _fields_ = [("code", C.c_uint8), ("bits", C.c_uint8), ("lanes", C.c_uint16)]


class DLTensor(C.Structure):
    _fields_ = [
        ("data", C.c_void_p),
        ("device", DLDevice),
        ("ndim", C.c_int32),
        ("dtype", DLDataType),
        ("shape", C.POINTER(C.c_int64)),
        ("strides", C.POINTER(C.c_int64)),
        ("byte_offset", C.c_uint64),
    ]


class ShimInfoArgs(C.Structure):
    _fields_ = [
        ("struct_size", C.c_size_t),
        EXT,
        ("shim_name", C.c_char_p),
        ("vendor_name", C.c_char_p),
        ("vendor_version_built", C.c_char_p),
        ("vendor_version_runtime", C.c_char_p),
        ("shim_version", C.c_char_p),
        ("device_type", C.c_int32),
        ("num_devices", C.c_int32),
        ("priority", C.c_int32),
        ("unavailable_reason", C.c_char_p),
    ]


class DeviceDescribeArgs(C.Structure):
    _fields_ = [
        ("struct_size", C.c_size_t),
        EXT,
        ("device_id", C.c_int32),
        ("default_flags", C.c_uint32),
        ("name", C.c_char_p),
    ]


class ConvCapabilitiesArgs(C.Structure):
    _fields_ = [
        ("struct_size", C.c_size_t),
        EXT,
        ("device_id", C.c_int32),
        ("op", C.c_int32),
        ("dtype", DLDataType),
        ("support", C.c_int32),
        ("spatial_ranks", C.c_uint32),
        ("activations", C.c_uint32),
        ("features", C.c_uint32),
        ("detail", C.c_char_p),
    ]


I64xN = C.c_int64 * ABI.MAX_SPATIAL_DIMS


class ConvPlanCreateArgs(C.Structure):
    _fields_ = [
        ("struct_size", C.c_size_t),
        EXT,
        ("op", C.c_int32),
        ("spatial_rank", C.c_int32),
        ("x", C.POINTER(DLTensor)),
        ("w", C.POINTER(DLTensor)),
        ("y", C.POINTER(DLTensor)),
        ("bias", C.POINTER(DLTensor)),
        ("stride", I64xN),
        ("dilation", I64xN),
        ("padding_lo", I64xN),
        ("padding_hi", I64xN),
        ("groups", C.c_int64),
        ("alpha", C.c_float),
        ("beta", C.c_float),
        ("activation", C.c_int32),
        ("activation_alpha", C.c_float),
        ("activation_beta", C.c_float),
        ("compute_type", DLDataType),
        ("flags", C.c_uint32),
        ("algo_policy", C.c_int32),
        ("algo_id", C.c_int64),
        ("workspace_limit", C.c_size_t),
        ("stream", C.c_void_p),
        ("plan", C.c_void_p),
        ("workspace_size", C.c_size_t),
        ("chosen_algo_id", C.c_int64),
        ("algo_name", C.c_char_p),
    ]


class ConvPlanExecuteArgs(C.Structure):
    _fields_ = [
        ("struct_size", C.c_size_t),
        EXT,
        ("plan", C.c_void_p),
        ("x", C.c_void_p),
        ("w", C.c_void_p),
        ("y", C.c_void_p),
        ("bias", C.c_void_p),
        ("workspace", C.c_void_p),
        ("workspace_size", C.c_size_t),
        ("stream", C.c_void_p),
    ]


class PlanDestroyArgs(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), EXT, ("plan", C.c_void_p)]


class ConvPlanPackWeightsArgs(C.Structure):
    _fields_ = [
        ("struct_size", C.c_size_t),
        EXT,
        ("plan", C.c_void_p),
        ("w", C.c_void_p),
        ("stream", C.c_void_p),
        ("packed_plan", C.c_void_p),
        ("workspace_size", C.c_size_t),
    ]


# ABI 2.1's extension for devices whose tensor data is an object (Metal): the byte offsets.
class BufferOffsets(C.Structure):
    _fields_ = [
        ("struct_size", C.c_size_t),
        ("type", C.c_int32),
        ("next", C.POINTER(ExtensionBase)),
        ("x_offset", C.c_uint64),
        ("w_offset", C.c_uint64),
        ("y_offset", C.c_uint64),
        ("bias_offset", C.c_uint64),
        ("workspace_offset", C.c_uint64),
    ]


# ABI 2.2's extension: the caller's device allocator, for a benchmark's buffers at plan time.
ALLOCATE = C.CFUNCTYPE(C.c_void_p, C.c_void_p, C.c_size_t, C.c_void_p)
RELEASE = C.CFUNCTYPE(None, C.c_void_p, C.c_void_p, C.c_void_p)


class DeviceAllocator(C.Structure):
    _fields_ = [
        ("struct_size", C.c_size_t),
        ("type", C.c_int32),
        ("next", C.POINTER(ExtensionBase)),
        ("context", C.c_void_p),
        ("allocate", ALLOCATE),
        ("release", RELEASE),
    ]


# The table: struct_size and the version first (as in every version), extension_start, then
# one function pointer per field of the header's FDNN_Api, in its order.
_TABLE_HEAD = [("struct_size", C.c_size_t), ("abi_major", C.c_int32), ("abi_minor", C.c_int32), EXT]
FUNCTIONS = tuple(name for name in LAYOUT["FDNN_Api"]["fields"] if name not in dict(_TABLE_HEAD))
# The header: "Every function above is non-NULL except Conv_Plan_Pack_Weights."
OPTIONAL_FUNCTIONS = ("Conv_Plan_Pack_Weights",)
REQUIRED_FUNCTIONS = tuple(name for name in FUNCTIONS if name not in OPTIONAL_FUNCTIONS)


class Api(C.Structure):
    _fields_ = _TABLE_HEAD + [(name, C.c_void_p) for name in FUNCTIONS]


# Header typedef -> mirror.
MIRRORS = {
    "FDNN_Extension_Base": ExtensionBase,
    "FDNN_Error_Destroy_Args": ErrorDestroyArgs,
    "FDNN_Error_Describe_Args": ErrorDescribeArgs,
    "FDNN_DLDevice": DLDevice,
    "FDNN_DLDataType": DLDataType,
    "FDNN_DLTensor": DLTensor,
    "FDNN_Shim_Info_Args": ShimInfoArgs,
    "FDNN_Device_Describe_Args": DeviceDescribeArgs,
    "FDNN_Conv_Capabilities_Args": ConvCapabilitiesArgs,
    "FDNN_Conv_Plan_Create_Args": ConvPlanCreateArgs,
    "FDNN_Conv_Plan_Execute_Args": ConvPlanExecuteArgs,
    "FDNN_Plan_Destroy_Args": PlanDestroyArgs,
    "FDNN_Conv_Plan_Pack_Weights_Args": ConvPlanPackWeightsArgs,
    "FDNN_Api": Api,
    "FDNN_Buffer_Offsets": BufferOffsets,
    "FDNN_Device_Allocator": DeviceAllocator,
}
# The args struct of each table function: those that return an FDNN_Error*, and the void ones.
ARGS_OF = {
    "Shim_Info": ShimInfoArgs,
    "Device_Describe": DeviceDescribeArgs,
    "Conv_Capabilities": ConvCapabilitiesArgs,
    "Conv_Plan_Create": ConvPlanCreateArgs,
    "Conv_Plan_Execute": ConvPlanExecuteArgs,
    "Conv_Plan_Pack_Weights": ConvPlanPackWeightsArgs,
}
VOID_ARGS_OF = {"Error_Destroy": ErrorDestroyArgs, "Error_Describe": ErrorDescribeArgs, "Plan_Destroy": PlanDestroyArgs}


def struct_size(cls) -> int:
    """FDNN_STRUCT_SIZE of a mirror: up to and including its last field (what a caller of the
    header writes to struct_size)."""
    name = cls._fields_[-1][0]
    return getattr(cls, name).offset + getattr(cls, name).size


def new(cls, **fields):
    """A struct with struct_size set as the header's caller sets it."""
    return cls(struct_size=struct_size(cls), **fields)


def mirror_mismatches(typedef: str) -> list:
    """Where the mirror of a header struct differs from the compiler's layout of it (field
    names and order, offsets, sizes, sizeof, _STRUCT_SIZE); [] if nowhere."""
    layout, cls = LAYOUT.get(typedef), MIRRORS.get(typedef)
    if layout is None:
        return [f"{typedef} is mirrored here but is no struct of flux_dnn.h"]
    if cls is None:
        return [f"{typedef} is a struct of flux_dnn.h without a ctypes mirror in {__name__}"]
    fields = list(layout["fields"].items())
    mine = [name for name, *_ in cls._fields_]
    if mine != [name for name, _ in fields]:
        return [f"{cls.__name__}: fields {mine}, header {typedef}: {[name for name, _ in fields]}"]
    problems = []
    for name, (offset, size) in fields:
        got = (getattr(cls, name).offset, getattr(cls, name).size)
        if got != (offset, size):
            problems.append(f"{cls.__name__}.{name}: offset, size {got}; header {(offset, size)}")
    if C.sizeof(cls) != layout["sizeof"]:
        problems.append(f"sizeof({cls.__name__}) {C.sizeof(cls)}; header {layout['sizeof']}")
    if layout["struct_size"] is not None and struct_size(cls) != layout["struct_size"]:
        problems.append(f"{cls.__name__} ends at {struct_size(cls)}; {typedef}_STRUCT_SIZE {layout['struct_size']}")
    return problems


# ---------------------------------------------------------------------------------------------
# A shim library


class Shim:
    """A shim library opened with ctypes, its table, and typed calls. Every error a call
    returns is checked as the header describes error objects (error_problems), then
    destroyed."""

    def __init__(self, path: str):
        self.path = path
        self.lib = C.CDLL(path)
        self.lib.fdnn_get_api.restype = C.POINTER(Api)
        self.api = self.lib.fdnn_get_api().contents
        # As a caller must: the version first (at the same place in every version), and no
        # call into a table of another major, whose structs differ.
        if self.api.abi_major != ABI.ABI_MAJOR:
            raise OSError(
                f"{path} has ABI {self.api.abi_major}.{self.api.abi_minor}; this mirror is of "
                f"ABI {ABI.ABI_MAJOR}.{ABI.ABI_MINOR}"
            )

    def function(self, name: str, returns_error: bool = True):
        return C.CFUNCTYPE(C.c_void_p if returns_error else None, C.c_void_p)(getattr(self.api, name))

    def describe_error(self, error: int) -> tuple:
        """(code name, message) of an error, which it then destroys; asserts that the error
        object is as the header says."""
        try:
            d = new(ErrorDescribeArgs, error=error)
            self.call_void("Error_Describe", d)
            problems = error_problems(d)
            assert not problems, problems
            message = C.string_at(d.message, d.message_size).decode()
            return ERROR_NAMES[d.code], message
        finally:
            self.call_void("Error_Destroy", new(ErrorDestroyArgs, error=error))

    def call(self, name: str, args):
        """Calls a table function with an args struct (any ctypes struct: tests pass larger
        or smaller ones too; None passes NULL); returns None or (error code name, message)."""
        error = self.function(name)(None if args is None else C.addressof(args))
        return None if error is None else self.describe_error(error)

    def call_void(self, name: str, args) -> None:
        self.function(name, returns_error=False)(None if args is None else C.addressof(args))

    def info(self) -> ShimInfoArgs:
        args = new(ShimInfoArgs)
        error = self.call("Shim_Info", args)
        assert error is None, error
        return args

    def reason(self) -> str | None:
        """Why this shim cannot run here, or None when it can."""
        why = self.info().unavailable_reason
        return None if why is None else why.decode()

    def capabilities(self, op: int, dtype, device_id: int = 0):
        """The Conv_Capabilities answer (args struct), or the error."""
        args = new(ConvCapabilitiesArgs, device_id=device_id, op=op, dtype=DLDataType(dtype[0], dtype[1], 1))
        error = self.call("Conv_Capabilities", args)
        return error if error is not None else args

    def destroy(self, plan) -> None:
        self.call_void("Plan_Destroy", new(PlanDestroyArgs, plan=plan))


def error_problems(described: ErrorDescribeArgs) -> list:
    """What is wrong with an error object as Error_Describe gave it: a code outside
    FDNN_ERROR_*, no message, a message_size that is not its length, no NUL after it, not
    UTF-8; [] if nothing."""
    problems = []
    if described.code not in ERROR_NAMES:
        problems.append(f"code {described.code} is not an FDNN_ERROR_* value")
    if not described.message:
        return problems + ["message is NULL"]
    raw = C.string_at(described.message, described.message_size + 1)
    if raw[-1:] != b"\0":
        problems.append(f"no NUL at message[message_size = {described.message_size}]")
    if b"\0" in raw[:-1]:
        problems.append(f"message_size {described.message_size} is past the message's NUL ({raw[:-1]!r})")
    try:
        if not raw[:-1].decode().strip():
            problems.append("the message is empty")
    except UnicodeDecodeError as exc:
        problems.append(f"the message is not UTF-8: {exc}")
    return problems


def tensor(shape, dtype=DTYPES["float32"], device=(ABI.DEVICE_CUDA, 0), strides=None, data=None) -> DLTensor:
    """A DLTensor descriptor (data NULL unless given) with compact strides unless given; keeps
    its arrays alive on the returned object."""
    n = len(shape)
    if strides is None:
        strides, acc = [0] * n, 1
        for i in reversed(range(n)):
            strides[i], acc = acc, acc * shape[i]
    t = DLTensor(
        data=data,
        device=DLDevice(*device),
        ndim=n,
        dtype=DLDataType(dtype[0], dtype[1], 1),
        shape=(C.c_int64 * n)(*shape),
        strides=(C.c_int64 * n)(*strides),
        byte_offset=0,
    )
    return t


def conv_args(x, w, y, *, op=0, rank=2, stride=1, padding=0, groups=1, bias=None) -> ConvPlanCreateArgs:
    args = new(
        ConvPlanCreateArgs,
        op=op,
        spatial_rank=rank,
        x=C.pointer(x),
        w=C.pointer(w),
        y=C.pointer(y),
        bias=C.pointer(bias if bias is not None else DLTensor(ndim=0)),
        groups=groups,
        alpha=1.0,
        beta=0.0,
        workspace_limit=C.c_size_t(-1).value,
    )
    for i in range(rank):
        args.stride[i], args.dilation[i] = stride, 1
        args.padding_lo[i] = args.padding_hi[i] = padding
    args._keep = (x, w, y, bias)
    return args
