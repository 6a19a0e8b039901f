/*
 * flux_dnn.h -- the one ABI between the flux_dnn core and its vendor shims.
 *
 * A shim is a plain shared library (libflux_dnn_<vendor>.so / .dylib / .dll) that wraps one
 * vendor convolution library (oneDNN, a CBLAS, cuDNN, MIOpen, MPSGraph). It exports exactly
 * one symbol, `fdnn_get_api`, which returns a table of function pointers. Nothing else
 * crosses this boundary: no C++ types, no exceptions, no Python, no vendor types. Anything
 * that can dlopen a C library (the Python core, a C++ framework, Julia's ccall, Rust) can
 * drive a shim; examples/c/ shows the whole walk in C.
 *
 * Conventions (after XLA's PJRT C API):
 *  - Every struct begins with `size_t struct_size`, set by the caller to FDNN_<Name>_STRUCT_SIZE.
 *    A callee accepts any struct_size >= the size it was compiled with (a newer caller) and
 *    rejects a smaller one with FDNN_ERROR_INVALID_ARGUMENT. FDNN_DLTensor and its parts are
 *    the exception: they are DLPack's structs, byte for byte (checked below), and frozen.
 *  - Each function takes one argument struct. Fields marked `// out` are written by the
 *    callee; every other field is read only.
 *  - Every args struct has `extension_start` second: a chain of FDNN_Extension_Base-headed
 *    structs that later versions may define, so a feature can be added without a break.
 *    NULL means none. A callee skips extensions of a type it does not know.
 *  - Every field that holds an enum value is an int32_t (a C enum's size is the compiler's
 *    choice); the values are the FDNN_* constants named beside the field.
 *  - Every pointer field says who owns it and how long it lives.
 *  - A function returns NULL on success or an FDNN_Error* on failure. An error is owned by the
 *    caller, who frees it with Error_Destroy of the same table. No C++ exception, longjmp or
 *    abort leaves a shim; on error no `// out` field and no output tensor has been written.
 *  - Any argument outside the rules written here gets FDNN_ERROR_INVALID_ARGUMENT, and a valid
 *    one the shim cannot serve FDNN_ERROR_UNSUPPORTED: never a crash, a hang or a success.
 *    (What a shim cannot see is the caller's promise: that a non-NULL pointer points where and
 *    as far as it says, and that a plan is one of this shim not yet destroyed.)
 *  - Pointers that may be NULL say so beside them; every other pointer is non-NULL. An args
 *    pointer is never NULL (a function that returns an error refuses NULL with
 *    FDNN_ERROR_INVALID_ARGUMENT). extension_start and next may be NULL. Unknown bits of
 *    flags are ignored.
 *
 * Versioning: FDNN_ABI_MAJOR / FDNN_ABI_MINOR.
 *  - MINOR grows when something is added in a compatible way: a function appended to the end
 *    of FDNN_Api, a field appended to the end of an args struct (its zero value must mean
 *    "the old behaviour"), a new enum value, a new extension type.
 *  - MAJOR grows, and MINOR returns to 0, on any break: a field or function removed, reordered
 *    or retyped; a meaning changed; an enum value renumbered; a new field whose zero value does
 *    not mean the old behaviour.
 *  - A caller refuses a table whose abi_major differs from its own. A caller may use a field
 *    or function of minor M only when the table's abi_minor >= M; a table may be larger than
 *    the caller knows (check struct_size before reading an appended function pointer).
 *
 * Changelog
 *  1.0  First version: error objects; shim info and device description; two-phase
 *       convolution (plan create / execute / destroy) for forward, backward-data and
 *       backward-weight over 1 to 3 spatial dims, with groups, asymmetric padding,
 *       alpha/beta, a fused bias and activation epilogue, algorithm policy and workspace.
 *  1.1  Conv_Plan_Pack_Weights: a forward plan that owns its weights in the vendor's layout.
 *  1.2  Conv_Dtype_Support: per device and dtype, native, converted or not computed.
 *  2.0  The one break, made before shims live outside this repository:
 *       - int32_t for every field holding an enum value (op, activation, algo_policy, error
 *         code, support), and for the table's version numbers as before;
 *       - extension_start in every args struct and in the table (after the table's version
 *         numbers, which stay right after struct_size in every version);
 *       - Conv_Capabilities replaces Conv_Dtype_Support: per device, op and dtype, how it is
 *         computed and which ranks, activations and features the shim serves;
 *       - Shim_Info reports the shim's priority among shims of one device type and the
 *         flux_dnn version it was built from; Device_Describe reports the device's default
 *         flags (TF32 on NVIDIA);
 *       - tensor data must be aligned to its element size (was unsaid);
 *       - FDNN_DEFINE_STRUCT_TRAITS defines each _STRUCT_SIZE and checks it at compile time;
 *       - the table's functions are ordered by use; Conv_Plan_Pack_Weights may still be NULL.
 *  2.1  FDNN_Buffer_Offsets, the first extension type: on a device whose tensor `data` is an
 *       object, not an address (Metal's id<MTLBuffer>), Conv_Plan_Execute and
 *       Conv_Plan_Pack_Weights take each `data` as it is and its byte offset in this extension.
 *  2.2  FDNN_Device_Allocator: Conv_Plan_Create takes the memory a benchmark times on from
 *       the caller's allocator (the array library's pool) instead of allocating its own.
 */
#ifndef FLUX_DNN_FLUX_DNN_H_
#define FLUX_DNN_FLUX_DNN_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FDNN_ABI_MAJOR 2
#define FDNN_ABI_MINOR 2

/* Size of a struct up to and including `last_field`: what a caller writes to struct_size. */
#define FDNN_STRUCT_SIZE(type, last_field) \
  (offsetof(type, last_field) + sizeof(((type*)0)->last_field))

#if defined(__cplusplus)
#define FDNN_STATIC_ASSERT(cond, message) static_assert(cond, message)
#define FDNN_ALIGNOF(type) alignof(type)
#elif defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
#define FDNN_STATIC_ASSERT(cond, message) _Static_assert(cond, message)
#define FDNN_ALIGNOF(type) _Alignof(type)
#else /* C99: an array of negative size fails; every struct here is at most 8-aligned */
#define FDNN_STATIC_ASSERT(cond, message) extern char fdnn_static_assert_[(cond) ? 1 : -1]
#define FDNN_ALIGNOF(type) 8
#endif

/* Defines type_STRUCT_SIZE, the struct_size a caller of this header writes, and checks at
 * compile time that `last_field` ends the struct: nothing but tail padding may follow it. A
 * field appended later must be named here, or the build of this header fails. (A field
 * small enough to hide in the tail padding would not be caught; every field appended so far
 * is pointer-sized or a group that is not.) */
#define FDNN_DEFINE_STRUCT_TRAITS(type, last_field)                                        \
  enum { type##_STRUCT_SIZE = FDNN_STRUCT_SIZE(type, last_field) };                       \
  FDNN_STATIC_ASSERT(sizeof(type) - FDNN_STRUCT_SIZE(type, last_field) < FDNN_ALIGNOF(type), \
                     #type ": " #last_field " is not its last field")

#if defined(_WIN32)
#define FDNN_EXPORT __declspec(dllexport)
#else
#define FDNN_EXPORT __attribute__((visibility("default")))
#endif

/* Most spatial dims any convolution in this ABI has (3: D, H, W). */
#define FDNN_MAX_SPATIAL_DIMS 3

/* ---------------------------------------------------------------------------------------- */
/* Extensions                                                                               */
/* ---------------------------------------------------------------------------------------- */

/* The head of every extension struct. Types are numbered from 1 up, each with its struct and
 * the functions it applies to, by the minor version that adds it (FDNN_EXTENSION_*). */
typedef struct FDNN_Extension_Base {
  size_t struct_size;
  int32_t type;                     /* FDNN_EXTENSION_* of a later minor version */
  struct FDNN_Extension_Base* next; /* borrowed for the call; NULL ends the chain */
} FDNN_Extension_Base;
FDNN_DEFINE_STRUCT_TRAITS(FDNN_Extension_Base, next);

/* ---------------------------------------------------------------------------------------- */
/* Errors                                                                                   */
/* ---------------------------------------------------------------------------------------- */

/* Opaque; allocated by a shim, freed by the caller through that shim's Error_Destroy. */
typedef struct FDNN_Error FDNN_Error;

/* Error codes (FDNN_Error_Describe_Args.code). */
enum {
  FDNN_ERROR_INVALID_ARGUMENT = 1, /* the caller broke a rule written in this header */
  FDNN_ERROR_UNSUPPORTED = 2,      /* valid, but this vendor/device cannot do it (dtype, ISA,
                                      a size beyond the vendor's range): a caller with another
                                      shim for the device may pass the problem on to it */
  FDNN_ERROR_UNAVAILABLE = 3,      /* no driver, no device, vendor library missing */
  FDNN_ERROR_OUT_OF_MEMORY = 4,
  FDNN_ERROR_VENDOR = 5, /* the vendor library failed; message has its status text */
  FDNN_ERROR_INTERNAL = 6,
};

typedef struct {
  size_t struct_size;
  FDNN_Extension_Base* extension_start;
  FDNN_Error* error; /* owned by the caller until this call, freed by it; NULL is a no-op */
} FDNN_Error_Destroy_Args;
FDNN_DEFINE_STRUCT_TRAITS(FDNN_Error_Destroy_Args, error);
typedef void FDNN_Error_Destroy(FDNN_Error_Destroy_Args* args);

typedef struct {
  size_t struct_size;
  FDNN_Extension_Base* extension_start;
  const FDNN_Error* error; /* borrowed */
  int32_t code;            /* out: FDNN_ERROR_* */
  const char* message;     /* out: UTF-8, NUL-terminated, owned by `error`, lives as long */
  size_t message_size;     /* out: bytes, without the NUL */
} FDNN_Error_Describe_Args;
FDNN_DEFINE_STRUCT_TRAITS(FDNN_Error_Describe_Args, message_size);
typedef void FDNN_Error_Describe(FDNN_Error_Describe_Args* args);

/* ---------------------------------------------------------------------------------------- */
/* Tensors: DLPack's terms, DLPack's layout                                                 */
/* ---------------------------------------------------------------------------------------- */

/* DLPack device type codes (DLDeviceType) that shims serve. */
enum {
  FDNN_DEVICE_CPU = 1,
  FDNN_DEVICE_CUDA = 2,
  FDNN_DEVICE_METAL = 8,
  FDNN_DEVICE_ROCM = 10,
  FDNN_DEVICE_ONEAPI = 14,
};

/* DLPack dtype codes (DLDataTypeCode). */
enum {
  FDNN_DTYPE_INT = 0,
  FDNN_DTYPE_UINT = 1,
  FDNN_DTYPE_FLOAT = 2,
  FDNN_DTYPE_BFLOAT = 4,
};

typedef struct { /* = DLDevice */
  int32_t device_type;
  int32_t device_id;
} FDNN_DLDevice;

typedef struct { /* = DLDataType */
  uint8_t code;
  uint8_t bits;
  uint16_t lanes; /* always 1 here */
} FDNN_DLDataType;

/* = DLTensor. In descriptors passed to Conv_Plan_Create, `data` may be NULL: a plan depends
 * on shapes, strides, dtypes and device, and, when `data` is given, on the alignment of
 * data + byte_offset (up to 16 bytes), which a shim may assume at execute (vectorised GPU
 * loads) and must check there; callers that cache plans key them by that alignment too.
 * data + byte_offset is always aligned to the element size (bits / 8), at plan time and at
 * execute, with `data` NULL too (then byte_offset itself must be: a descriptor cannot promise
 * an alignment no call can have); a shim refuses anything else with
 * FDNN_ERROR_INVALID_ARGUMENT. `shape` and
 * `strides` are borrowed for the duration of the call, never NULL when ndim > 0; `strides` are
 * in elements (the caller fills compact strides in).
 * The rules a shim checks, in every shim alike, before any vendor call:
 *  - every dim >= 1; every stride >= 0 (0 repeats an element: allowed on tensors the op reads
 *    only; a tensor the op writes must not overlap itself, so its dims of size > 1, ordered by
 *    stride, each step past all elements of the dims inside them). A read tensor whose
 *    elements overlap (a broadcast, a sliding window) is valid and served by every shim and
 *    algorithm: a shim whose vendor takes no such strides stages a compact copy of it;
 *  - dtype.lanes is 1 and dtype.bits a positive multiple of 8; device_id in 0..num_devices-1;
 *  - x, w, y and bias share one dtype (no conversion is implied) and one device (type and
 *    id): any other is FDNN_ERROR_INVALID_ARGUMENT;
 *  - the largest size: a tensor's element count, its span (1 + sum of (shape[i]-1)*strides[i])
 *    and both times the element size are at most INT64_MAX, as are x + padding_lo +
 *    padding_hi and dilation * (kernel - 1) + 1 of each spatial dim; a shim computes them with
 *    overflow-checked arithmetic. A valid size beyond what the vendor indexes (e.g. more
 *    than INT32_MAX elements in a tensor for a vendor that indexes in int) is
 *    FDNN_ERROR_UNSUPPORTED. Sizes here are also a conv's stride, dilation, padding (and
 *    what they add up to) and groups: a valid one beyond INT32_MAX may be UNSUPPORTED. */
typedef struct {
  void* data;
  FDNN_DLDevice device;
  int32_t ndim;
  FDNN_DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
} FDNN_DLTensor;

/* DLPack's published layout (dlpack.h, v0.8 to v1.x), checked where a compiler can. */
FDNN_STATIC_ASSERT(sizeof(FDNN_DLDevice) == 8 && offsetof(FDNN_DLDevice, device_id) == 4,
                   "FDNN_DLDevice must be DLDevice");
FDNN_STATIC_ASSERT(sizeof(FDNN_DLDataType) == 4 && offsetof(FDNN_DLDataType, bits) == 1 &&
                       offsetof(FDNN_DLDataType, lanes) == 2,
                   "FDNN_DLDataType must be DLDataType");
FDNN_STATIC_ASSERT(offsetof(FDNN_DLTensor, data) == 0 &&
                       offsetof(FDNN_DLTensor, device) == sizeof(void*) &&
                       offsetof(FDNN_DLTensor, ndim) == sizeof(void*) + 8 &&
                       offsetof(FDNN_DLTensor, dtype) == sizeof(void*) + 12,
                   "FDNN_DLTensor must be DLTensor");
#if UINTPTR_MAX == UINT64_MAX
FDNN_STATIC_ASSERT(offsetof(FDNN_DLTensor, shape) == 24 && offsetof(FDNN_DLTensor, strides) == 32 &&
                       offsetof(FDNN_DLTensor, byte_offset) == 40 && sizeof(FDNN_DLTensor) == 48,
                   "FDNN_DLTensor must be DLTensor (64-bit layout)");
#endif

/* ---------------------------------------------------------------------------------------- */
/* Shim information                                                                         */
/* ---------------------------------------------------------------------------------------- */

/* Priorities (FDNN_Shim_Info_Args.priority): among the shims for one device type a caller
 * asks the highest first. A vendor's own tuned library is FDNN_PRIORITY_VENDOR; a portable
 * fallback (the CBLAS shim) is FDNN_PRIORITY_PORTABLE. */
enum {
  FDNN_PRIORITY_PORTABLE = 10,
  FDNN_PRIORITY_VENDOR = 100,
};

typedef struct {
  size_t struct_size;
  FDNN_Extension_Base* extension_start;
  const char* shim_name;              /* out: e.g. "onednn"; static storage */
  const char* vendor_name;            /* out: e.g. "oneDNN"; static storage */
  const char* vendor_version_built;   /* out: version compiled against; static storage */
  const char* vendor_version_runtime; /* out: version loaded now, "" if none; static storage */
  const char* shim_version;           /* out: flux_dnn version it was built from; static */
  int32_t device_type;                /* out: the DLPack device type this shim serves */
  int32_t num_devices;                /* out: devices usable now; 0 when unavailable */
  int32_t priority;                   /* out: FDNN_PRIORITY_* or between; higher asked first */
  /* out: NULL when usable; else why not, in words for a user ("no NVIDIA driver found").
   * Static storage, lives as long as the loaded shim. */
  const char* unavailable_reason;
} FDNN_Shim_Info_Args;
FDNN_DEFINE_STRUCT_TRAITS(FDNN_Shim_Info_Args, unavailable_reason);
/* Safe to call first and from any thread; initialises the shim on first call. */
typedef FDNN_Error* FDNN_Shim_Info(FDNN_Shim_Info_Args* args);

typedef struct {
  size_t struct_size;
  FDNN_Extension_Base* extension_start;
  int32_t device_id; /* 0 .. num_devices-1 */
  /* out: FDNN_CONV_* flags a caller without a preference of its own passes on this device:
   * FDNN_CONV_ALLOW_REDUCED_PRECISION on NVIDIA (TF32 for float32 and reduced-precision
   * reduction for float16/bfloat16, what PyTorch's cuDNN convolutions allow by default), 0 on
   * CPUs. */
  uint32_t default_flags;
  /* out: a stable name for the device, e.g. "NVIDIA H200 (sm_90)" or "x86-64 avx512_core_amx",
   * used to key autotune results. Static storage, lives as long as the loaded shim. */
  const char* name;
} FDNN_Device_Describe_Args;
FDNN_DEFINE_STRUCT_TRAITS(FDNN_Device_Describe_Args, name);
typedef FDNN_Error* FDNN_Device_Describe(FDNN_Device_Describe_Args* args);

/* ---------------------------------------------------------------------------------------- */
/* Convolution                                                                              */
/* ---------------------------------------------------------------------------------------- */
/*
 * Semantics are torch.nn.functional's: cross-correlation over logical N, C, *spatial for
 * activations and K, C/groups, *kernel for weights, whatever the strides (channels-last is a
 * stride pattern, not another shape). For one convolution y = conv(x, w) + bias:
 *   FORWARD          reads x, w (and bias), writes y
 *   BACKWARD_DATA    reads y (the gradient dy), w, writes x (the gradient dx); this is also
 *                    the transposed convolution of x := dy
 *   BACKWARD_WEIGHT  reads x, y (dy), writes w (dw) and, when bias is described, the
 *                    bias gradient db = sum of dy over N and spatial dims.
 * The written tensor gets  out = alpha * result + beta * out  (beta = 0: out is not read),
 * as a BLAS gemm's alpha and beta. beta is compared as a number: -0.0 is 0, so out is not
 * read then either (NaN in it does not leak). The bias gradient of BACKWARD_WEIGHT is a
 * written tensor like dw: db = alpha * sum(dy) + beta * db, with the same alpha and beta. On FORWARD the result is the activated sum, so the
 * activation comes after bias and before alpha:
 *   y = alpha * act(conv(x, w) + bias) + beta * y
 * (activation = sigmoid, alpha = 0.5: 0.5 * sigmoid(v), never sigmoid(0.5 * v); with NONE,
 * alpha * (conv + bias)). Every shim computes this one meaning, whatever its vendor fuses
 * (cuDNN's fused operation is act(alpha1 * conv + bias): a shim uses it only where the two
 * agree, alpha 1 and beta 0).
 */

typedef struct FDNN_Plan FDNN_Plan; /* opaque; owned by the caller, freed by Plan_Destroy */

/* Convolution ops (op fields). */
enum {
  FDNN_CONV_FORWARD = 0,
  FDNN_CONV_BACKWARD_DATA = 1,
  FDNN_CONV_BACKWARD_WEIGHT = 2,
};
#define FDNN_NUM_CONV_OPS 3

/* Fused activations (activation fields), FORWARD only: one on another op, like a bias on
 * BACKWARD_DATA, is FDNN_ERROR_INVALID_ARGUMENT (no shim may fuse it there). */
enum {
  FDNN_ACTIVATION_NONE = 0,
  FDNN_ACTIVATION_RELU = 1,       /* max(v, 0) */
  FDNN_ACTIVATION_LEAKY_RELU = 2, /* v >= 0 ? v : activation_alpha * v */
  FDNN_ACTIVATION_CLIP = 3,       /* min(max(v, activation_alpha), activation_beta) */
  FDNN_ACTIVATION_SIGMOID = 4,
  FDNN_ACTIVATION_TANH = 5,
  FDNN_ACTIVATION_GELU_TANH = 6, /* tanh approximation */
  FDNN_ACTIVATION_GELU_ERF = 7,
  FDNN_ACTIVATION_SILU = 8, /* v * sigmoid(v) */
};
#define FDNN_NUM_ACTIVATIONS 9

/* Algorithm policies (algo_policy fields). */
enum {
  FDNN_ALGO_HEURISTIC = 0, /* the vendor's first choice */
  FDNN_ALGO_BENCHMARK = 1, /* time candidates on the device, keep the fastest */
  FDNN_ALGO_GIVEN = 2,     /* use algo_id as returned earlier by this shim for this problem */
};
/* FDNN_ALGO_GIVEN with an algo_id that names none of the shim's algorithms (outside its ids;
 * for ids a vendor enumerates, one naming no engine or solution it offers for the problem: a
 * stale or foreign id) breaks the rule above: FDNN_ERROR_INVALID_ARGUMENT. One naming an
 * algorithm of the shim that cannot compute this problem here (or not within
 * workspace_limit) is FDNN_ERROR_UNSUPPORTED, as any valid problem the shim cannot serve, so
 * that a caller with several shims for the device passes the problem on. */

/* Bit flags for FDNN_Conv_Plan_Create_Args.flags. */
enum {
  /* Bitwise reproducible results: exclude algorithms that use atomics or split reductions. */
  FDNN_CONV_DETERMINISTIC = 1u << 0,
  /* Allow math below the input precision: on CPUs bf16 for fp32; on NVIDIA (cuDNN) TF32 for
   * fp32, and for fp16/bf16 engines whose reduction keeps partial sums in the 16-bit type
   * (cuDNN's REDUCED_PRECISION_REDUCTION note), as PyTorch admits both by default
   * (torch.backends.cudnn.allow_tf32; its engine filter keeps such 16-bit engines). Without
   * the flag, the cuDNN shim excludes both. */
  FDNN_CONV_ALLOW_REDUCED_PRECISION = 1u << 1,
};

/* How a dtype is computed (FDNN_Conv_Capabilities_Args.support). */
enum {
  FDNN_SUPPORT_NONE = 0,      /* not computed: Conv_Plan_Create fails with UNSUPPORTED */
  FDNN_SUPPORT_NATIVE = 1,    /* by the vendor's kernels of that dtype */
  FDNN_SUPPORT_CONVERTED = 2, /* converted inside the plan to a wider dtype (float32),
                                 computed there, rounded once into the output */
};

/* What a shim does for one device, op and dtype beyond the basics every shim serves (dense
 * and strided NCHW/channels-last tensors, stride, padding of any form, bias on FORWARD).
 * Bits of FDNN_Conv_Capabilities_Args.features. */
enum {
  FDNN_FEATURE_GROUPS = 1u << 0,             /* groups > 1, depthwise included */
  FDNN_FEATURE_DILATION = 1u << 1,           /* dilation > 1 */
  FDNN_FEATURE_ALPHA_BETA = 1u << 2,         /* alpha != 1 or beta != 0 */
  FDNN_FEATURE_BIAS_GRADIENT = 1u << 3,      /* BACKWARD_WEIGHT with a bias described */
  FDNN_FEATURE_ASYMMETRIC_PADDING = 1u << 4, /* by the vendor itself, not a padded copy */
  FDNN_FEATURE_PACK_WEIGHTS = 1u << 5,       /* Conv_Plan_Pack_Weights serves FORWARD plans */
  FDNN_FEATURE_DETERMINISTIC = 1u << 6,      /* FDNN_CONV_DETERMINISTIC honoured (CPU shims
                                                are deterministic whatever the flag); without
                                                it the flag is not covered: UNSUPPORTED */
  FDNN_FEATURE_BENCHMARK = 1u << 7,          /* FDNN_ALGO_BENCHMARK times several candidates;
                                                without it the policy is still covered, served
                                                by the heuristic's choice (one candidate) */
  FDNN_FEATURE_REDUCED_PRECISION = 1u << 8,  /* FDNN_CONV_ALLOW_REDUCED_PRECISION changes the
                                                math (TF32, bf16) */
};

/* What one shim computes for one device, op and dtype, as it finds this machine now (its
 * instruction set, its vendor library, its GPU). A caller with several shims for a device
 * type sends a problem to the first shim, by priority, whose capabilities cover it. A problem
 * covered here is served by Conv_Plan_Create, or refused there with FDNN_ERROR_UNSUPPORTED
 * only for a reason of its sizes (a dimension, stride, dilation, padding or groups beyond the
 * vendor's integer range, a workspace beyond workspace_limit) or a compute_type it does not
 * accumulate in; a problem not covered is refused with FDNN_ERROR_UNSUPPORTED before any
 * vendor call. */
typedef struct {
  size_t struct_size;
  FDNN_Extension_Base* extension_start;
  int32_t device_id;     /* 0 .. num_devices-1 */
  int32_t op;            /* FDNN_CONV_* */
  FDNN_DLDataType dtype; /* the dtype of x, w, y and bias */
  int32_t support; /* out: FDNN_SUPPORT_*; when NONE, spatial_ranks, activations and features
                     are 0 and detail says why not */
  uint32_t spatial_ranks; /* out: bit (1 << r) for each spatial rank r (1, 2, 3) served */
  /* out: bit (1 << a) for each FDNN_ACTIVATION_* value a fused on FORWARD; (1 << NONE) for
   * the other ops */
  uint32_t activations;
  uint32_t features; /* out: FDNN_FEATURE_* bits */
  /* out: how, or why not, in words for a user ("float32 kernels with one rounding: this CPU
   * has no avx512_core_fp16"); "" when there is nothing to add. Static storage, lives as
   * long as the loaded shim. */
  const char* detail;
} FDNN_Conv_Capabilities_Args;
FDNN_DEFINE_STRUCT_TRAITS(FDNN_Conv_Capabilities_Args, detail);
/* Safe from any thread; may load the vendor library (as Shim_Info does). An op outside
 * FDNN_CONV_* or a device_id out of range is FDNN_ERROR_INVALID_ARGUMENT. */
typedef FDNN_Error* FDNN_Conv_Capabilities(FDNN_Conv_Capabilities_Args* args);

typedef struct {
  size_t struct_size;
  FDNN_Extension_Base* extension_start;
  int32_t op;           /* FDNN_CONV_* */
  int32_t spatial_rank; /* 1, 2 or 3 */
  /* Descriptors (data may be NULL, see FDNN_DLTensor). x: N, C, *spatial.
   * w: K, C/groups, *kernel. y: N, K, *out_spatial. bias: (K,), or ndim 0 for none.
   * None of the four is NULL. All borrowed for this call. */
  const FDNN_DLTensor* x;
  const FDNN_DLTensor* w;
  const FDNN_DLTensor* y;
  const FDNN_DLTensor* bias;
  /* Per spatial dim, first spatial_rank entries used. stride >= 1, dilation >= 1 (1 =
   * dense). Padding >= 0 is added before (lo) and after (hi) each spatial dim and may differ
   * per side. */
  int64_t stride[FDNN_MAX_SPATIAL_DIMS];
  int64_t dilation[FDNN_MAX_SPATIAL_DIMS];
  int64_t padding_lo[FDNN_MAX_SPATIAL_DIMS];
  int64_t padding_hi[FDNN_MAX_SPATIAL_DIMS];
  int64_t groups;
  /* Fixed at plan time: vendors bake them into the primitive (oneDNN post-ops, cuDNN
   * graphs). */
  float alpha;
  float beta;
  int32_t activation; /* FDNN_ACTIVATION_* */
  float activation_alpha;
  float activation_beta;
  /* Accumulation type; code 0 and bits 0 (lanes 0 or 1) mean the vendor default (fp32 for
   * 16-bit floats, the input type otherwise; with FDNN_CONV_ALLOW_REDUCED_PRECISION a GPU
   * vendor may still reduce 16-bit inputs partly in 16 bits: see that flag). Any other follows
   * the dtype rules (lanes 1, bits a positive multiple of 8: else INVALID_ARGUMENT); a
   * well-formed type the shim does not accumulate in is FDNN_ERROR_UNSUPPORTED. */
  FDNN_DLDataType compute_type;
  uint32_t flags;      /* FDNN_CONV_* bits */
  int32_t algo_policy; /* FDNN_ALGO_* */
  int64_t algo_id;     /* for FDNN_ALGO_GIVEN */
  size_t workspace_limit; /* bytes; SIZE_MAX for no limit */
  /* For FDNN_ALGO_BENCHMARK on a GPU: the stream to time on (cudaStream_t, hipStream_t);
   * borrowed; NULL = the default stream. Ignored by CPU shims. */
  void* stream;

  FDNN_Plan* plan;        /* out: owned by the caller, freed with Plan_Destroy */
  size_t workspace_size;  /* out: bytes Conv_Plan_Execute needs, <= workspace_limit (a shim
                             that cannot stay within it fails with FDNN_ERROR_UNSUPPORTED) */
  int64_t chosen_algo_id; /* out: pass back with FDNN_ALGO_GIVEN to get the same algorithm */
  const char* algo_name;  /* out: readable, owned by the plan, lives as long as it */
} FDNN_Conv_Plan_Create_Args;
FDNN_DEFINE_STRUCT_TRAITS(FDNN_Conv_Plan_Create_Args, algo_name);
typedef FDNN_Error* FDNN_Conv_Plan_Create(FDNN_Conv_Plan_Create_Args* args);

typedef struct {
  size_t struct_size;
  FDNN_Extension_Base* extension_start;
  const FDNN_Plan* plan; /* borrowed; a plan may execute on several threads at once; NULL is
                            FDNN_ERROR_INVALID_ARGUMENT */
  /* Device pointers to the first element (DLTensor data + byte_offset), laid out exactly as
   * described at plan time, each aligned to the element size (else INVALID_ARGUMENT). All
   * borrowed for the call. Unused ones (by op) may be NULL; a NULL one the op reads or writes
   * is FDNN_ERROR_INVALID_ARGUMENT. (Metal: `data` itself, the offsets in FDNN_Buffer_Offsets,
   * since 2.1.) */
  void* x;
  void* w;
  void* y;
  void* bias;
  /* Scratch of at least the plan's workspace_size bytes, 64-byte aligned, not shared with
   * another call in flight; borrowed. When the plan needs some, fewer bytes, NULL or another
   * alignment is FDNN_ERROR_INVALID_ARGUMENT (staging buffers and vendor scratchpads take
   * aligned vector accesses there); when its workspace_size is 0 the pointer is not read
   * (NULL or anything). On Metal the alignment is the offset's (FDNN_Buffer_Offsets). */
  void* workspace;
  size_t workspace_size;
  void* stream; /* cudaStream_t / hipStream_t / MTLCommandQueue; borrowed; NULL on CPU */
} FDNN_Conv_Plan_Execute_Args;
FDNN_DEFINE_STRUCT_TRAITS(FDNN_Conv_Plan_Execute_Args, stream);
/* On a CPU shim the call returns when the output is written; on a GPU shim when the work is
 * enqueued on `stream`. */
typedef FDNN_Error* FDNN_Conv_Plan_Execute(FDNN_Conv_Plan_Execute_Args* args);

typedef struct {
  size_t struct_size;
  FDNN_Extension_Base* extension_start;
  FDNN_Plan* plan; /* owned by the caller until this call; NULL is a no-op */
} FDNN_Plan_Destroy_Args;
FDNN_DEFINE_STRUCT_TRAITS(FDNN_Plan_Destroy_Args, plan);
typedef void FDNN_Plan_Destroy(FDNN_Plan_Destroy_Args* args);

/* Makes a FORWARD plan that owns a copy of the weights, converted once into the layout the
 * vendor computes in, so repeated inference skips the weight reorder. The packed plan
 * executes like `plan` but reads its own weights and ignores Conv_Plan_Execute's `w`; later
 * changes to the caller's w are not seen. It needs the workspace size reported here, which
 * may differ from the source plan's. */
typedef struct {
  size_t struct_size;
  FDNN_Extension_Base* extension_start;
  const FDNN_Plan* plan; /* borrowed: a FORWARD plan of this shim (another op's is
                            FDNN_ERROR_INVALID_ARGUMENT) */
  const void* w;         /* borrowed for this call: the weights, as described at plan time */
  void* stream;          /* GPU stream the copy is ordered on; borrowed; NULL on CPU */
  FDNN_Plan* packed_plan; /* out: owned by the caller, freed with Plan_Destroy */
  size_t workspace_size;  /* out */
} FDNN_Conv_Plan_Pack_Weights_Args;
FDNN_DEFINE_STRUCT_TRAITS(FDNN_Conv_Plan_Pack_Weights_Args, workspace_size);
typedef FDNN_Error* FDNN_Conv_Plan_Pack_Weights(FDNN_Conv_Plan_Pack_Weights_Args* args);

/* ---------------------------------------------------------------------------------------- */
/* Extension types                                                                          */
/* ---------------------------------------------------------------------------------------- */

/* FDNN_Extension_Base.type values. */
enum {
  FDNN_EXTENSION_BUFFER_OFFSETS = 1, /* 2.1: FDNN_Buffer_Offsets */
  FDNN_EXTENSION_DEVICE_ALLOCATOR = 2, /* 2.2: FDNN_Device_Allocator */
};

/* 2.1. Where a DLPack `data` is an object, not an address, data + byte_offset means nothing:
 * on Metal (FDNN_DEVICE_METAL) `data` is an id<MTLBuffer> and byte_offset an offset into it.
 * On such a device the caller passes Conv_Plan_Execute each tensor's `data` itself in x, w,
 * y, bias and workspace (and Conv_Plan_Pack_Weights its w), and their byte offsets here,
 * chained on the args' extension_start. A shim of such a device refuses a call without it
 * (FDNN_ERROR_INVALID_ARGUMENT); every other shim skips it, as it skips any extension. The
 * offsets keep the element-alignment rule of FDNN_DLTensor; an unused tensor's offset is 0. */
typedef struct {
  size_t struct_size;             /* FDNN_Buffer_Offsets_STRUCT_SIZE */
  int32_t type;                   /* FDNN_EXTENSION_BUFFER_OFFSETS */
  FDNN_Extension_Base* next;      /* as in FDNN_Extension_Base: the rest of the chain */
  uint64_t x_offset;              /* bytes into x's buffer */
  uint64_t w_offset;              /* bytes into w's buffer */
  uint64_t y_offset;              /* bytes into y's buffer */
  uint64_t bias_offset;           /* bytes into bias's buffer */
  uint64_t workspace_offset;      /* bytes into the workspace's buffer */
} FDNN_Buffer_Offsets;
FDNN_DEFINE_STRUCT_TRAITS(FDNN_Buffer_Offsets, workspace_offset);

/* 2.2. The caller's device allocator, chained on Conv_Plan_Create's args: with
 * FDNN_ALGO_BENCHMARK on a GPU, the shim takes the buffers it times candidates on (stand-ins
 * for x, w, y, bias and the largest candidate's workspace) from here, so they come from the
 * array library's pool (ordered on the args' stream, no device-wide synchronisation) rather
 * than from the shim's own allocations. A shim that needs no device memory at plan time
 * skips it, as it skips any extension; without it a shim allocates for itself.
 * Ownership: the shim releases everything it allocated before Conv_Plan_Create returns. */
/* Device memory of at least `bytes` bytes on the plan's device, aligned to 256 bytes, usable
 * by work ordered on `stream` (the args' stream); NULL when the allocator refuses (out of
 * memory, over its cap): the shim then times fewer candidates or keeps its heuristic's
 * choice, and still succeeds. Called on the thread of Conv_Plan_Create. */
typedef void* FDNN_Device_Allocate(void* context, size_t bytes, void* stream);
/* Gives back memory from allocate, possibly while work the shim ordered on `stream` still
 * uses it (stream-ordered reuse, as the array libraries' pools do). */
typedef void FDNN_Device_Release(void* context, void* pointer, void* stream);
typedef struct {
  size_t struct_size;        /* FDNN_Device_Allocator_STRUCT_SIZE */
  int32_t type;              /* FDNN_EXTENSION_DEVICE_ALLOCATOR */
  FDNN_Extension_Base* next; /* as in FDNN_Extension_Base: the rest of the chain */
  void* context;             /* borrowed; passed back to allocate and release */
  FDNN_Device_Allocate* allocate;
  FDNN_Device_Release* release;
} FDNN_Device_Allocator;
FDNN_DEFINE_STRUCT_TRAITS(FDNN_Device_Allocator, release);

/* ---------------------------------------------------------------------------------------- */
/* The table                                                                                */
/* ---------------------------------------------------------------------------------------- */

typedef struct {
  size_t struct_size; /* FDNN_Api_STRUCT_SIZE of the shim's own header */
  /* Right after struct_size in every version (as in 1.x), so that a caller can read the
   * version of any table, of any major, before it reads anything else. */
  int32_t abi_major;
  int32_t abi_minor;
  FDNN_Extension_Base* extension_start; /* static storage; NULL in 2.0 */
  FDNN_Error_Destroy* Error_Destroy;
  FDNN_Error_Describe* Error_Describe;
  FDNN_Shim_Info* Shim_Info;
  FDNN_Device_Describe* Device_Describe;
  FDNN_Conv_Capabilities* Conv_Capabilities;
  FDNN_Conv_Plan_Create* Conv_Plan_Create;
  FDNN_Conv_Plan_Execute* Conv_Plan_Execute;
  FDNN_Plan_Destroy* Plan_Destroy;
  /* NULL when the shim cannot pack (then no capability has FDNN_FEATURE_PACK_WEIGHTS). */
  FDNN_Conv_Plan_Pack_Weights* Conv_Plan_Pack_Weights;
  /* Append new functions here (a minor version); never reorder. Every function above is
   * non-NULL except Conv_Plan_Pack_Weights. */
} FDNN_Api;
FDNN_DEFINE_STRUCT_TRAITS(FDNN_Api, Conv_Plan_Pack_Weights);
/* Where every version of this ABI, 1.0 on, keeps the version of its table. */
FDNN_STATIC_ASSERT(offsetof(FDNN_Api, abi_major) == sizeof(size_t) &&
                       offsetof(FDNN_Api, abi_minor) == sizeof(size_t) + 4,
                   "FDNN_Api: abi_major/abi_minor must follow struct_size, as in every version");

/* The one exported symbol. Returns a pointer to static storage; never NULL; cheap: does not
 * load the vendor library (Shim_Info does). */
typedef const FDNN_Api* FDNN_GetApiFn(void);
#define FDNN_GET_API_SYMBOL "fdnn_get_api"
FDNN_EXPORT const FDNN_Api* fdnn_get_api(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FLUX_DNN_FLUX_DNN_H_ */
