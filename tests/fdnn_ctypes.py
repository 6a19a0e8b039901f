"""ctypes mirror of csrc/include/flux_dnn/flux_dnn.h (ABI 2.0), for tests that drive a shim
library directly, below the core.

The ABI's numbers are not written here: `ABI` reads them from the header (the one place they
are written) with a small parser of its `#define`s and `enum`s, and `mirror_mismatches`
checks every ctypes struct below against the header's field names and sizes."""

from __future__ import annotations

import ast
import ctypes as C
import importlib.metadata
import importlib.util
import os
import pathlib
import re

HEADER = pathlib.Path(__file__).resolve().parent.parent / "csrc" / "include" / "flux_dnn" / "flux_dnn.h"
VERSION_FILE = HEADER.parent.parent.parent.parent / "VERSION"


# ---------------------------------------------------------------------------------------------
# The header's numbers


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def _evaluate(expr: str, known: dict) -> int:
    """An integer constant expression of the header: literals (1u), names defined earlier,
    <<, |, +, -, parentheses."""
    expr = re.sub(r"\b(\d+)[uUlL]+\b", r"\1", expr.strip())

    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            return known[node.id]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        if isinstance(node, ast.BinOp):
            ops = {ast.LShift: lambda a, b: a << b, ast.BitOr: lambda a, b: a | b,
                   ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b}
            return ops[type(node.op)](value(node.left), value(node.right))
        raise ValueError(f"not a constant expression of the header: {expr!r}")

    return value(ast.parse(expr, mode="eval").body)


class HeaderConstants:
    """FDNN_* constants of the header as attributes without the prefix: ABI.CONV_FORWARD,
    ABI.ERROR_UNSUPPORTED, ABI.FEATURE_GROUPS, ABI.ABI_MAJOR, ..."""

    def __init__(self, text: str):
        code = _strip_comments(text)
        self.values: dict[str, int] = {}
        for name, expr in re.findall(r"^\s*#define\s+(FDNN_\w+)[ \t]+([^\n]+)$", code, flags=re.M):
            try:
                self.values[name] = _evaluate(expr, self.values)
            except (ValueError, KeyError, SyntaxError):
                pass  # a macro that is not a number (FDNN_EXPORT, FDNN_GET_API_SYMBOL, ...)
        for body in re.findall(r"\benum\s*\{([^}]*)\}", code):
            for entry in body.split(","):
                if "=" in entry:
                    name, expr = entry.split("=", 1)
                    if name.strip().startswith("FDNN_") and "STRUCT_SIZE" not in name:
                        self.values[name.strip()] = _evaluate(expr, self.values)

    def __getattr__(self, name: str) -> int:
        try:
            return self.values["FDNN_" + name]
        except KeyError:
            raise AttributeError(f"FDNN_{name} is not a constant of {HEADER}") from None

    def group(self, prefix: str) -> dict[str, int]:
        """{suffix: value} of the constants FDNN_<prefix>*, e.g. group("ACTIVATION_")."""
        start = "FDNN_" + prefix
        return {k[len(start):]: v for k, v in self.values.items() if k.startswith(start)}


ABI = HeaderConstants(HEADER.read_text())
ERROR_NAMES = {v: k for k, v in ABI.group("ERROR_").items()}
DTYPES = {"float64": (ABI.DTYPE_FLOAT, 64), "float32": (ABI.DTYPE_FLOAT, 32),
          "float16": (ABI.DTYPE_FLOAT, 16), "bfloat16": (ABI.DTYPE_BFLOAT, 16)}


def flux_dnn_version() -> str:
    return VERSION_FILE.read_text().strip()


# ---------------------------------------------------------------------------------------------
# The structs (field names and order as in the header; mirror_mismatches checks them)


class ExtensionBase(C.Structure):
    pass


ExtensionBase._fields_ = [("struct_size", C.c_size_t), ("type", C.c_int32),
                          ("next", C.POINTER(ExtensionBase))]
EXT = ("extension_start", C.POINTER(ExtensionBase))


class ErrorDestroyArgs(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), EXT, ("error", C.c_void_p)]


class ErrorDescribeArgs(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), EXT, ("error", C.c_void_p), ("code", C.c_int32),
                ("message", C.c_char_p), ("message_size", C.c_size_t)]


class DLDevice(C.Structure):
    _fields_ = [("device_type", C.c_int32), ("device_id", C.c_int32)]


class DLDataType(C.Structure):
    _fields_ = [("code", C.c_uint8), ("bits", C.c_uint8), ("lanes", C.c_uint16)]


class DLTensor(C.Structure):
    _fields_ = [("data", C.c_void_p), ("device", DLDevice), ("ndim", C.c_int32),
                ("dtype", DLDataType), ("shape", C.POINTER(C.c_int64)),
                ("strides", C.POINTER(C.c_int64)), ("byte_offset", C.c_uint64)]


class ShimInfoArgs(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), EXT, ("shim_name", C.c_char_p), ("vendor_name", C.c_char_p),
                ("vendor_version_built", C.c_char_p), ("vendor_version_runtime", C.c_char_p),
                ("shim_version", C.c_char_p), ("device_type", C.c_int32), ("num_devices", C.c_int32),
                ("priority", C.c_int32), ("unavailable_reason", C.c_char_p)]


class DeviceDescribeArgs(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), EXT, ("device_id", C.c_int32), ("default_flags", C.c_uint32),
                ("name", C.c_char_p)]


class ConvCapabilitiesArgs(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), EXT, ("device_id", C.c_int32), ("op", C.c_int32),
                ("dtype", DLDataType), ("support", C.c_int32), ("spatial_ranks", C.c_uint32),
                ("activations", C.c_uint32), ("features", C.c_uint32), ("detail", C.c_char_p)]


I64xN = C.c_int64 * ABI.MAX_SPATIAL_DIMS


class ConvPlanCreateArgs(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), EXT, ("op", C.c_int32), ("spatial_rank", C.c_int32),
                ("x", C.POINTER(DLTensor)), ("w", C.POINTER(DLTensor)), ("y", C.POINTER(DLTensor)),
                ("bias", C.POINTER(DLTensor)), ("stride", I64xN), ("dilation", I64xN),
                ("padding_lo", I64xN), ("padding_hi", I64xN), ("groups", C.c_int64),
                ("alpha", C.c_float), ("beta", C.c_float), ("activation", C.c_int32),
                ("activation_alpha", C.c_float), ("activation_beta", C.c_float),
                ("compute_type", DLDataType), ("flags", C.c_uint32), ("algo_policy", C.c_int32),
                ("algo_id", C.c_int64), ("workspace_limit", C.c_size_t), ("stream", C.c_void_p),
                ("plan", C.c_void_p), ("workspace_size", C.c_size_t), ("chosen_algo_id", C.c_int64),
                ("algo_name", C.c_char_p)]


class ConvPlanExecuteArgs(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), EXT, ("plan", C.c_void_p), ("x", C.c_void_p),
                ("w", C.c_void_p), ("y", C.c_void_p), ("bias", C.c_void_p), ("workspace", C.c_void_p),
                ("workspace_size", C.c_size_t), ("stream", C.c_void_p)]


class PlanDestroyArgs(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), EXT, ("plan", C.c_void_p)]


class ConvPlanPackWeightsArgs(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), EXT, ("plan", C.c_void_p), ("w", C.c_void_p),
                ("stream", C.c_void_p), ("packed_plan", C.c_void_p), ("workspace_size", C.c_size_t)]


# The table: required functions in the header's order, then those that may be NULL.
FUNCTIONS = ("Error_Destroy", "Error_Describe", "Shim_Info", "Device_Describe", "Conv_Capabilities",
             "Conv_Plan_Create", "Conv_Plan_Execute", "Plan_Destroy")
OPTIONAL_FUNCTIONS = ("Conv_Plan_Pack_Weights",)


class Api(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("abi_major", C.c_int32), ("abi_minor", C.c_int32), EXT] + [
        (name, C.c_void_p) for name in FUNCTIONS + OPTIONAL_FUNCTIONS]


# Header typedef -> mirror, and the args struct of each table function.
MIRRORS = {"FDNN_Extension_Base": ExtensionBase, "FDNN_Error_Destroy_Args": ErrorDestroyArgs,
           "FDNN_Error_Describe_Args": ErrorDescribeArgs, "FDNN_DLDevice": DLDevice,
           "FDNN_DLDataType": DLDataType, "FDNN_DLTensor": DLTensor, "FDNN_Shim_Info_Args": ShimInfoArgs,
           "FDNN_Device_Describe_Args": DeviceDescribeArgs, "FDNN_Conv_Capabilities_Args": ConvCapabilitiesArgs,
           "FDNN_Conv_Plan_Create_Args": ConvPlanCreateArgs, "FDNN_Conv_Plan_Execute_Args": ConvPlanExecuteArgs,
           "FDNN_Plan_Destroy_Args": PlanDestroyArgs,
           "FDNN_Conv_Plan_Pack_Weights_Args": ConvPlanPackWeightsArgs, "FDNN_Api": Api}
# The args struct of each table function that returns an error.
ARGS_OF = {"Shim_Info": ShimInfoArgs, "Device_Describe": DeviceDescribeArgs,
           "Conv_Capabilities": ConvCapabilitiesArgs, "Conv_Plan_Create": ConvPlanCreateArgs,
           "Conv_Plan_Execute": ConvPlanExecuteArgs, "Conv_Plan_Pack_Weights": ConvPlanPackWeightsArgs}


def struct_size(cls) -> int:
    """FDNN_STRUCT_SIZE of a mirror: up to and including its last field (what a caller of the
    header writes to struct_size)."""
    name = cls._fields_[-1][0]
    return getattr(cls, name).offset + getattr(cls, name).size


def new(cls, **fields):
    """A struct with struct_size set as the header's caller sets it."""
    return cls(struct_size=struct_size(cls), **fields)


_C_SIZES = {"size_t": C.sizeof(C.c_size_t), "int32_t": 4, "uint32_t": 4, "int64_t": 8, "uint64_t": 8,
            "uint8_t": 1, "uint16_t": 2, "float": 4, "FDNN_DLDevice": 8, "FDNN_DLDataType": 4}


def _header_structs(text: str) -> dict[str, list[tuple[str, str, str]]]:
    """{typedef name: [(type, field name, array length or '')]} of the header's structs."""
    structs = {}
    for body, name in re.findall(r"typedef\s+struct\s*\w*\s*\{([^}]*)\}\s*(\w+)\s*;", _strip_comments(text)):
        fields = []
        for statement in body.split(";"):
            m = re.match(r"\s*(.*?)\b(\w+)\s*(?:\[(\w+)\])?\s*$", statement, flags=re.S)
            if m and statement.strip():
                fields.append((" ".join(m.group(1).split()), m.group(2), m.group(3) or ""))
        structs[name] = fields
    return structs


def mirror_mismatches() -> list[str]:
    """Where a ctypes struct here differs from the header: names, order, sizes; [] if none."""
    problems = []
    header = _header_structs(HEADER.read_text())
    for typedef, cls in MIRRORS.items():
        fields = header.get(typedef)
        if fields is None:
            problems.append(f"{typedef} is not a struct of the header")
            continue
        names = [f[1] for f in fields]
        mine = [f[0] for f in cls._fields_]
        if names != mine:
            problems.append(f"{cls.__name__}: fields {mine}, header {typedef}: {names}")
            continue
        for ctype, name, length in fields:
            size = C.sizeof(C.c_void_p) if "*" in ctype else _C_SIZES.get(ctype.replace("const ", ""))
            if size is None:
                problems.append(f"{typedef}.{name}: type {ctype!r} unknown to the mirror check")
                continue
            count = 1 if not length else int(length) if length.isdigit() else ABI.values[length]
            if getattr(cls, name).size != size * count:
                problems.append(f"{cls.__name__}.{name}: {getattr(cls, name).size} bytes, header {ctype} "
                                f"x{count}")
    return problems


# ---------------------------------------------------------------------------------------------
# A shim library


def preload_vendor_libraries() -> None:
    """What the Python package and the plug-in wheels do before loading a shim: load the
    vendor libraries from their wheels by path (oneDNN, OpenBLAS, cuDNN), where installed."""
    for dist, name in (("onednn-cpu-gomp", "libdnnl.so.3"), ("scipy-openblas32", "libscipy_openblas.so"),
                       ("nvidia-cudnn-cu13", "libcudnn.so.9"), ("nvidia-cudnn-cu12", "libcudnn.so.9")):
        try:
            files = importlib.metadata.distribution(dist).files or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for f in files:
            path = pathlib.Path(f.locate()).resolve()
            if f.name == name and path.exists():
                C.CDLL(str(path), mode=C.RTLD_GLOBAL)
                break


def _installed_shims() -> dict[str, str]:
    """{name: path} of the shims the installed packages register (entry points of group
    flux_dnn.shims): libflux_dnn_<name>.so in the package of each entry point's module."""
    found = {}
    for ep in importlib.metadata.entry_points(group="flux_dnn.shims"):
        try:
            spec = importlib.util.find_spec(ep.module.split(".")[0])
        except (ImportError, ValueError):
            continue
        if spec is None or not spec.submodule_search_locations:
            continue
        path = pathlib.Path(list(spec.submodule_search_locations)[0]) / f"libflux_dnn_{ep.name}.so"
        if path.exists():
            found[ep.name] = str(path)
    return found


def shim_libraries() -> dict[str, str]:
    """{name: library path} of the shims to test: FLUX_DNN_<NAME>_SHIM for each name when
    set (onednn, blas, cudnn, or any other), else the libraries installed in flux_dnn and its
    plug-in packages."""
    found = _installed_shims()
    for key, value in os.environ.items():
        m = re.fullmatch(r"FLUX_DNN_(\w+)_SHIM", key)
        if m and value:
            found[m.group(1).lower()] = value
    return found


class Shim:
    """A shim library opened with ctypes, its table, and typed calls."""

    def __init__(self, path: str):
        self.path = path
        self.lib = C.CDLL(path)
        self.lib.fdnn_get_api.restype = C.POINTER(Api)
        self.api = self.lib.fdnn_get_api().contents
        # As a caller must: the version first (at the same place in every version), and no
        # call into a table of another major, whose structs differ.
        if self.api.abi_major != ABI.ABI_MAJOR:
            raise OSError(f"{path} has ABI {self.api.abi_major}.{self.api.abi_minor}; this mirror is of "
                          f"ABI {ABI.ABI_MAJOR}.{ABI.ABI_MINOR} (a stale build?)")

    def describe_error(self, error) -> tuple:
        """(code name, message) of an error, which it then destroys."""
        d = new(ErrorDescribeArgs, error=error)
        self.call_void("Error_Describe", d)
        result = (ERROR_NAMES.get(d.code, d.code), C.string_at(d.message, d.message_size).decode())
        self.call_void("Error_Destroy", new(ErrorDestroyArgs, error=error))
        return result

    def call(self, name: str, args):
        """Calls a table function with an args struct (any ctypes struct: tests pass larger
        or smaller ones too); returns None or (error code name, message)."""
        error = C.CFUNCTYPE(C.c_void_p, C.c_void_p)(getattr(self.api, name))(C.addressof(args))
        return None if error is None else self.describe_error(error)

    def call_void(self, name: str, args) -> None:
        C.CFUNCTYPE(None, C.c_void_p)(getattr(self.api, name))(None if args is None else C.addressof(args))

    def info(self) -> ShimInfoArgs:
        args = new(ShimInfoArgs)
        error = self.call("Shim_Info", args)
        assert error is None, error
        return args

    def capabilities(self, op: int, dtype, device_id: int = 0):
        """The Conv_Capabilities answer (args struct), or the error."""
        args = new(ConvCapabilitiesArgs, device_id=device_id, op=op, dtype=DLDataType(dtype[0], dtype[1], 1))
        error = self.call("Conv_Capabilities", args)
        return error if error is not None else args

    def destroy(self, plan) -> None:
        self.call_void("Plan_Destroy", new(PlanDestroyArgs, plan=plan))


def tensor(shape, dtype=DTYPES["float32"], device=(ABI.DEVICE_CUDA, 0), strides=None, data=None):
    """A DLTensor descriptor (data NULL unless given) with compact strides unless given; keeps
    its arrays alive on the returned object."""
    n = len(shape)
    if strides is None:
        strides, acc = [0] * n, 1
        for i in reversed(range(n)):
            strides[i], acc = acc, acc * shape[i]
    t = DLTensor(data=data, device=DLDevice(*device), ndim=n, dtype=DLDataType(dtype[0], dtype[1], 1),
                 shape=(C.c_int64 * n)(*shape), strides=(C.c_int64 * n)(*strides), byte_offset=0)
    return t


def conv_args(x, w, y, *, op=0, rank=2, stride=1, padding=0, groups=1, bias=None):
    args = new(ConvPlanCreateArgs, op=op, spatial_rank=rank, x=C.pointer(x), w=C.pointer(w), y=C.pointer(y),
               bias=C.pointer(bias if bias is not None else DLTensor(ndim=0)), groups=groups, alpha=1.0,
               beta=0.0, workspace_limit=C.c_size_t(-1).value)
    for i in range(rank):
        args.stride[i], args.dilation[i] = stride, 1
        args.padding_lo[i] = args.padding_hi[i] = padding
    args._keep = (x, w, y, bias)
    return args
