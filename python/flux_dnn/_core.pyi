# Type stub of flux_dnn._core, the compiled extension (csrc/core/module.cpp). Every public
# name _core binds is declared here (tests/test_core_stub.py checks it). The ABI numbers are
# generated from flux_dnn.h at build time (cmake/abi_constants.py): _core.<NAME> is the
# header's FDNN_<NAME>; their values live in the header only.

from collections.abc import Callable
from typing import Any, TypedDict

ABI_VERSION: tuple[int, int]
__version__: str  # the flux_dnn version _core was built from (ABI 2.0 builds)

# -- ABI numbers (flux_dnn.h 2.0) ------------------------------------------------------------
ERROR_INVALID_ARGUMENT: int
ERROR_UNSUPPORTED: int
ERROR_UNAVAILABLE: int
ERROR_OUT_OF_MEMORY: int
ERROR_VENDOR: int
ERROR_INTERNAL: int
DEVICE_CPU: int
DEVICE_CUDA: int
DEVICE_METAL: int
DEVICE_ROCM: int
DEVICE_ONEAPI: int
DTYPE_INT: int
DTYPE_UINT: int
DTYPE_FLOAT: int
DTYPE_BFLOAT: int
PRIORITY_PORTABLE: int
PRIORITY_VENDOR: int
CONV_FORWARD: int
CONV_BACKWARD_DATA: int
CONV_BACKWARD_WEIGHT: int
ACTIVATION_NONE: int
ACTIVATION_RELU: int
ACTIVATION_LEAKY_RELU: int
ACTIVATION_CLIP: int
ACTIVATION_SIGMOID: int
ACTIVATION_TANH: int
ACTIVATION_GELU_TANH: int
ACTIVATION_GELU_ERF: int
ACTIVATION_SILU: int
ALGO_HEURISTIC: int
ALGO_BENCHMARK: int
ALGO_GIVEN: int
CONV_DETERMINISTIC: int
CONV_ALLOW_REDUCED_PRECISION: int
SUPPORT_NONE: int
SUPPORT_NATIVE: int
SUPPORT_CONVERTED: int
FEATURE_GROUPS: int
FEATURE_DILATION: int
FEATURE_ALPHA_BETA: int
FEATURE_BIAS_GRADIENT: int
FEATURE_ASYMMETRIC_PADDING: int
FEATURE_PACK_WEIGHTS: int
FEATURE_DETERMINISTIC: int
FEATURE_BENCHMARK: int
FEATURE_REDUCED_PRECISION: int
EXTENSION_BUFFER_OFFSETS: int
EXTENSION_DEVICE_ALLOCATOR: int
ABI_MAJOR: int
ABI_MINOR: int
MAX_SPATIAL_DIMS: int
NUM_CONV_OPS: int
NUM_ACTIVATIONS: int

class StructLayout(TypedDict):
    sizeof: int
    struct_size: int | None  # <Struct>_STRUCT_SIZE, for the structs that have one
    fields: dict[str, tuple[int, int]]  # field name -> (offset, size), in declaration order

#: {"FDNN_<NAME>": value} for every constant of the header, string macros included
ABI_CONSTANTS: dict[str, int | str]
#: {"FDNN_<Struct>": layout} for every struct of the header
ABI_LAYOUT: dict[str, StructLayout]

# -- Errors ---------------------------------------------------------------------------------
class ShimLoadError(ImportError): ...
class DeviceUnavailableError(RuntimeError): ...
class UnsupportedError(NotImplementedError): ...
class VendorError(RuntimeError): ...

# -- Shims ----------------------------------------------------------------------------------
class Shim:
    """A loaded shim library (never unloaded)."""

    @property
    def name(self) -> str: ...
    @property
    def path(self) -> str: ...
    @property
    def device_type(self) -> int: ...
    def info(self) -> dict[str, Any]:
        """Shim_Info: name, vendor, vendor_version_built, vendor_version_runtime,
        shim_version, device_type, num_devices, priority, unavailable_reason (None when
        usable), and the library's path and abi (major, minor)."""
    def device_info(self, device_id: int = 0) -> dict[str, Any]:
        """Device_Describe: {"name": str, "default_flags": FDNN_CONV_* bits}."""
    def capabilities(self, op: int, dtype: str, device_id: int = 0) -> dict[str, Any]:
        """Conv_Capabilities of op (CONV_*) and dtype ("float64", "float32", "float16",
        "bfloat16") on one device: {"support": SUPPORT_*, "spatial_ranks": tuple,
        "activations": bits 1 << ACTIVATION_*, "features": FEATURE_* bits, "detail": str}."""

def load_shim(path: str) -> Shim:
    """Load (once) and check the shim library at path; raises ShimLoadError."""

# -- Convolutions ---------------------------------------------------------------------------
class ConvSpec:
    """Everything about a convolution except its arrays (FDNN_CONV_* op, geometry, epilogue,
    flags, algorithm policy), fixed once per call pattern."""

    def __init__(
        self,
        op: int,
        spatial_rank: int,
        stride: list[int],
        dilation: list[int],
        padding_lo: list[int],
        padding_hi: list[int],
        groups: int,
        alpha: float = 1.0,
        beta: float = 0.0,
        activation: int = 0,
        activation_alpha: float = 0.0,
        activation_beta: float = 0.0,
        flags: int = 0,
        algo_policy: int = 0,
        algo_id: int = 0,
        workspace_limit: int | None = None,
    ) -> None: ...
    @property
    def op(self) -> int: ...
    @property
    def beta(self) -> float: ...
    @property
    def flags(self) -> int: ...

def run_conv(
    shim: Shim,
    spec: ConvSpec,
    x: Any,
    w: Any,
    y: Any,
    bias: Any | None,
    stream: int | None,
    workspace_alloc: Callable[[int], Any] | None,
) -> None:
    """Run spec on DLPack arrays (or capsules) x, w, y, bias as the ABI names them; the
    written array must exist. plan_info tells what plan it runs."""

def plan_info(
    shim: Shim, spec: ConvSpec, x: Any, w: Any, y: Any, bias: Any | None, stream: int | None = None
) -> dict[str, Any]:
    """The plan run_conv would run (made and cached, not executed): {"workspace_size",
    "algo_id", "algo_name"}."""

def remembered_forward(
    nd: int, x: Any, w: Any, bias: Any | None, stride: Any, padding: Any, dilation: Any, groups: Any
) -> Any:
    """The result of a NumPy forward call pattern the core remembers (a new array), or None
    when it does not remember it (the caller takes the Python path)."""

def remember_forward(
    nd: int,
    x: Any,
    w: Any,
    bias: Any | None,
    stride: Any,
    padding: Any,
    dilation: Any,
    groups: Any,
    shim: Shim,
    spec: ConvSpec,
    y: Any,
) -> bool:
    """Remembers the NumPy call pattern the Python path has just served into y; False when
    the core cannot hold it (another array type or dtype, a geometry other than ints and
    tuples of ints)."""

def forget_forwards() -> None:
    """Forgets every remembered forward call pattern."""

def remembered_forward_count() -> int: ...

class PlanCall:
    """Base of flux_dnn.ConvPlan: a call with one array of the bound type runs the bound
    PackedConv in C++; any other call goes to the subclass's ``_call``."""

    def __call__(self, x: Any, *, out: Any = None) -> Any: ...
    def _bind_fast(self, packed: PackedConv, bias: Any | None, array_type: type) -> None: ...

class PackedConv:
    """A forward plan fixed for one set of shapes, with its weights packed once."""

    def __init__(
        self, shim: Shim, spec: ConvSpec, x: Any, w: Any, y: Any, bias: Any | None, stream: int | None
    ) -> None: ...
    def run(
        self, x: Any, y: Any | None, bias: Any | None, stream: int | None, workspace_alloc: Callable[[int], Any] | None
    ) -> Any:
        """Runs the plan into y and returns y; y None (NumPy x only): into a new array."""
    def run_with_weights(
        self,
        x: Any,
        y: Any | None,
        bias: Any | None,
        stream: int | None,
        workspace_alloc: Callable[[int], Any] | None,
        w: Any,
    ) -> Any:
        """run, with the weights exported again: for a plan whose shim could not pack them and
        that got them as a DLPack capsule (consumed by its planning)."""
    @property
    def packed(self) -> bool: ...
    @property
    def algo_name(self) -> str: ...

def set_export_fallback(fallback: Callable[[Any, str], tuple[Any, int, int] | None]) -> None:
    """fallback(array, argname) -> None or (exportable, dtype_code, dtype_bits), called only
    when array.__dlpack__ raises BufferError."""

def describe_intake(array: Any, argname: str = "x") -> dict[str, Any]:
    """The DLPack descriptor the core takes from a CPU array (tests)."""

# -- Plan cache and autotune store ----------------------------------------------------------
def plan_cache_info() -> dict[str, int]: ...
def set_plan_cache_capacity(capacity: int) -> None: ...
def clear_plan_cache() -> None: ...
def set_autotune_path(path: str) -> None: ...
def autotune_path() -> str: ...
