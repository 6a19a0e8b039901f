/*
 * flux_dnn.h -- the one ABI between the flux_dnn core and its vendor shims.
 *
 * A shim is a plain shared library (libflux_dnn_<vendor>.so / .dylib / .dll) that wraps one
 * vendor convolution library (oneDNN, cuDNN, MIOpen, MPSGraph). It exports exactly one
 * symbol, `fdnn_get_api`, which returns a table of function pointers. Nothing else crosses
 * this boundary: no C++ types, no exceptions, no Python, no vendor types. Anything that can
 * dlopen a C library (the Python core, a C++ framework, Julia's ccall, Rust) can drive a shim.
 *
 * Conventions (after XLA's PJRT C API):
 *  - Every struct begins with `size_t struct_size`, set by the caller to FDNN_<Name>_STRUCT_SIZE.
 *    A callee accepts any struct_size >= the size it was compiled with (a newer caller) and
 *    rejects a smaller one with FDNN_ERROR_INVALID_ARGUMENT. FDNN_DLTensor is the one
 *    exception: it is DLPack's DLTensor, byte for byte, and DLPack's ABI is frozen.
 *  - Each function takes one argument struct. Fields marked `// out` are written by the
 *    callee; every other field is read only.
 *  - Every pointer field says who owns it and how long it lives.
 *  - A function returns NULL on success or an FDNN_Error* on failure. An error is owned by the
 *    caller, who frees it with Error_Destroy of the same table. No C++ exception, longjmp or
 *    abort leaves a shim; on error no `// out` field and no output tensor has been written.
 *
 * Versioning: FDNN_ABI_MAJOR / FDNN_ABI_MINOR.
 *  - MINOR grows when something is added in a compatible way: a function appended to the end
 *    of FDNN_Api, a field appended to the end of an args struct (its zero value must mean
 *    "the old behaviour"), a new enum value.
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
 *  1.1  Conv_Plan_Pack_Weights: a forward plan that owns its weights in the vendor's layout,
 *       so repeated inference skips the weight reorder.
 *  1.2  Conv_Dtype_Support: a shim says, per device and dtype, whether it computes that dtype
 *       natively, by converting inside the plan, or not at all, so callers dispatch on what
 *       the shim finds on this machine rather than on a table of their own.
 */
#ifndef FLUX_DNN_FLUX_DNN_H_
#define FLUX_DNN_FLUX_DNN_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FDNN_ABI_MAJOR 1
#define FDNN_ABI_MINOR 2

/* Size of a struct up to and including `last_field`: what a caller writes to struct_size. */
#define FDNN_STRUCT_SIZE(type, last_field) \
  (offsetof(type, last_field) + sizeof(((type*)0)->last_field))

#if defined(_WIN32)
#define FDNN_EXPORT __declspec(dllexport)
#else
#define FDNN_EXPORT __attribute__((visibility("default")))
#endif

/* Most spatial dims any convolution in this ABI has (3: D, H, W). */
#define FDNN_MAX_SPATIAL_DIMS 3

/* ---------------------------------------------------------------------------------------- */
/* Errors                                                                                   */
/* ---------------------------------------------------------------------------------------- */

/* Opaque; allocated by a shim, freed by the caller through that shim's Error_Destroy. */
typedef struct FDNN_Error FDNN_Error;

typedef enum {
  FDNN_ERROR_INVALID_ARGUMENT = 1, /* the caller broke a rule written in this header */
  FDNN_ERROR_UNSUPPORTED = 2,      /* valid, but this vendor/device cannot do it (dtype, ISA) */
  FDNN_ERROR_UNAVAILABLE = 3,      /* no driver, no device, vendor library missing */
  FDNN_ERROR_OUT_OF_MEMORY = 4,
  FDNN_ERROR_VENDOR = 5, /* the vendor library failed; message has its status text */
  FDNN_ERROR_INTERNAL = 6,
} FDNN_ErrorCode;

typedef struct {
  size_t struct_size;
  FDNN_Error* error; /* owned by the caller until this call, freed by it; NULL is a no-op */
} FDNN_Error_Destroy_Args;
#define FDNN_Error_Destroy_Args_STRUCT_SIZE FDNN_STRUCT_SIZE(FDNN_Error_Destroy_Args, error)
typedef void FDNN_Error_Destroy(FDNN_Error_Destroy_Args* args);

typedef struct {
  size_t struct_size;
  const FDNN_Error* error; /* borrowed */
  FDNN_ErrorCode code;     /* out */
  const char* message;     /* out: UTF-8, NUL-terminated, owned by `error`, lives as long */
  size_t message_size;     /* out: bytes, without the NUL */
} FDNN_Error_Describe_Args;
#define FDNN_Error_Describe_Args_STRUCT_SIZE \
  FDNN_STRUCT_SIZE(FDNN_Error_Describe_Args, message_size)
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
 * `shape` and `strides` are borrowed for the duration of the call; `strides` are in elements
 * and never NULL here (the caller fills compact strides in). */
typedef struct {
  void* data;
  FDNN_DLDevice device;
  int32_t ndim;
  FDNN_DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
} FDNN_DLTensor;

/* ---------------------------------------------------------------------------------------- */
/* Shim information                                                                         */
/* ---------------------------------------------------------------------------------------- */

typedef struct {
  size_t struct_size;
  const char* shim_name;              /* out: e.g. "onednn"; static storage */
  const char* vendor_name;            /* out: e.g. "oneDNN"; static storage */
  const char* vendor_version_built;   /* out: version compiled against; static storage */
  const char* vendor_version_runtime; /* out: version loaded now, "" if none; static storage */
  int32_t device_type;                /* out: the DLPack device type this shim serves */
  int32_t num_devices;                /* out: devices usable now; 0 when unavailable */
  /* out: NULL when usable; else why not, in words for a user ("no NVIDIA driver found").
   * Static storage, lives as long as the loaded shim. */
  const char* unavailable_reason;
} FDNN_Shim_Info_Args;
#define FDNN_Shim_Info_Args_STRUCT_SIZE \
  FDNN_STRUCT_SIZE(FDNN_Shim_Info_Args, unavailable_reason)
/* Safe to call first and from any thread; initialises the shim on first call. */
typedef FDNN_Error* FDNN_Shim_Info(FDNN_Shim_Info_Args* args);

typedef struct {
  size_t struct_size;
  int32_t device_id; /* 0 .. num_devices-1 */
  /* out: a stable name for the device, e.g. "NVIDIA H200 (sm_90)" or "x86-64 avx512_core_amx",
   * used to key autotune results. Static storage, lives as long as the loaded shim. */
  const char* name;
} FDNN_Device_Describe_Args;
#define FDNN_Device_Describe_Args_STRUCT_SIZE FDNN_STRUCT_SIZE(FDNN_Device_Describe_Args, name)
typedef FDNN_Error* FDNN_Device_Describe(FDNN_Device_Describe_Args* args);

/* ---------------------------------------------------------------------------------------- */
/* Convolution                                                                              */
/* ---------------------------------------------------------------------------------------- */
/*
 * Semantics are torch.nn.functional's: cross-correlation over logical N, C, *spatial for
 * activations and K, C/groups, *kernel for weights, whatever the strides (channels-last is a
 * stride pattern, not another shape). For one convolution y = conv(x, w) + bias:
 *   FORWARD          reads x, w (and bias), writes y
 *   BACKWARD_DATA    reads y (the gradient dy), w, writes x (the gradient dx)
 *   BACKWARD_WEIGHT  reads x, y (dy), writes w (dw) and, when bias is described, the
 *                    bias gradient db = sum of dy over N and spatial dims.
 * The written tensor gets  out = alpha * result + beta * out  (beta = 0: out is not read).
 * The activation is applied after bias and alpha, before beta accumulation, FORWARD only:
 *   y = act(alpha * (conv(x, w) + bias)) + beta * y.
 */

typedef struct FDNN_Plan FDNN_Plan; /* opaque; owned by the caller, freed by Plan_Destroy */

typedef enum {
  FDNN_CONV_FORWARD = 0,
  FDNN_CONV_BACKWARD_DATA = 1,
  FDNN_CONV_BACKWARD_WEIGHT = 2,
} FDNN_ConvOp;

typedef enum {
  FDNN_ACTIVATION_NONE = 0,
  FDNN_ACTIVATION_RELU = 1,       /* max(v, 0) */
  FDNN_ACTIVATION_LEAKY_RELU = 2, /* v >= 0 ? v : activation_alpha * v */
  FDNN_ACTIVATION_CLIP = 3,       /* min(max(v, activation_alpha), activation_beta) */
  FDNN_ACTIVATION_SIGMOID = 4,
  FDNN_ACTIVATION_TANH = 5,
  FDNN_ACTIVATION_GELU_TANH = 6, /* tanh approximation */
  FDNN_ACTIVATION_GELU_ERF = 7,
  FDNN_ACTIVATION_SILU = 8, /* v * sigmoid(v) */
} FDNN_Activation;

typedef enum {
  FDNN_ALGO_HEURISTIC = 0, /* the vendor's first choice */
  FDNN_ALGO_BENCHMARK = 1, /* time candidates on the device, keep the fastest */
  FDNN_ALGO_GIVEN = 2,     /* use algo_id as returned earlier by this shim for this problem */
} FDNN_AlgoPolicy;

/* Bit flags for FDNN_Conv_Plan_Create_Args.flags. */
enum {
  /* Bitwise reproducible results: exclude algorithms that use atomics or split reductions. */
  FDNN_CONV_DETERMINISTIC = 1u << 0,
  /* Allow math below the input precision (TF32 for fp32 on NVIDIA, bf16 for fp32 on CPUs). */
  FDNN_CONV_ALLOW_REDUCED_PRECISION = 1u << 1,
};

typedef struct {
  size_t struct_size;
  FDNN_ConvOp op;
  int32_t spatial_rank; /* 1, 2 or 3 */
  /* Descriptors (data ignored). x: N, C, *spatial. w: K, C/groups, *kernel.
   * y: N, K, *out_spatial. bias: (K,), or ndim 0 for none. All borrowed for this call. */
  const FDNN_DLTensor* x;
  const FDNN_DLTensor* w;
  const FDNN_DLTensor* y;
  const FDNN_DLTensor* bias;
  /* Per spatial dim, first spatial_rank entries used. dilation 1 = dense. Padding is added
   * before (lo) and after (hi) each spatial dim and may differ per side. */
  int64_t stride[FDNN_MAX_SPATIAL_DIMS];
  int64_t dilation[FDNN_MAX_SPATIAL_DIMS];
  int64_t padding_lo[FDNN_MAX_SPATIAL_DIMS];
  int64_t padding_hi[FDNN_MAX_SPATIAL_DIMS];
  int64_t groups;
  /* Fixed at plan time: vendors bake them into the primitive (oneDNN post-ops, cuDNN
   * graphs). */
  float alpha;
  float beta;
  FDNN_Activation activation;
  float activation_alpha;
  float activation_beta;
  /* Accumulation type; code 0 and bits 0 mean the vendor default (fp32 for 16-bit floats,
   * the input type otherwise). */
  FDNN_DLDataType compute_type;
  uint32_t flags; /* FDNN_CONV_* bits */
  FDNN_AlgoPolicy algo_policy;
  int64_t algo_id;        /* for FDNN_ALGO_GIVEN */
  size_t workspace_limit; /* bytes; SIZE_MAX for no limit */
  /* For FDNN_ALGO_BENCHMARK on a GPU: the stream to time on (cudaStream_t, hipStream_t);
   * borrowed; NULL = the default stream. Ignored by CPU shims. */
  void* stream;

  FDNN_Plan* plan;        /* out: owned by the caller, freed with Plan_Destroy */
  size_t workspace_size;  /* out: bytes Conv_Plan_Execute needs in `workspace` */
  int64_t chosen_algo_id; /* out: pass back with FDNN_ALGO_GIVEN to get the same algorithm */
  const char* algo_name;  /* out: readable, owned by the plan, lives as long as it */
} FDNN_Conv_Plan_Create_Args;
#define FDNN_Conv_Plan_Create_Args_STRUCT_SIZE \
  FDNN_STRUCT_SIZE(FDNN_Conv_Plan_Create_Args, algo_name)
typedef FDNN_Error* FDNN_Conv_Plan_Create(FDNN_Conv_Plan_Create_Args* args);

typedef struct {
  size_t struct_size;
  const FDNN_Plan* plan; /* borrowed; a plan may execute on several threads at once */
  /* Device pointers to the first element (DLTensor data + byte_offset), laid out exactly as
   * described at plan time. All borrowed for the call. Unused ones (by op) may be NULL. */
  void* x;
  void* w;
  void* y;
  void* bias;
  /* Scratch of at least workspace_size bytes, 64-byte aligned, not shared with another
   * call in flight; borrowed; NULL when workspace_size is 0. */
  void* workspace;
  size_t workspace_size;
  void* stream; /* cudaStream_t / hipStream_t / MTLCommandQueue; borrowed; NULL on CPU */
} FDNN_Conv_Plan_Execute_Args;
#define FDNN_Conv_Plan_Execute_Args_STRUCT_SIZE \
  FDNN_STRUCT_SIZE(FDNN_Conv_Plan_Execute_Args, stream)
/* On a CPU shim the call returns when the output is written; on a GPU shim when the work is
 * enqueued on `stream`. */
typedef FDNN_Error* FDNN_Conv_Plan_Execute(FDNN_Conv_Plan_Execute_Args* args);

typedef struct {
  size_t struct_size;
  FDNN_Plan* plan; /* owned by the caller until this call; NULL is a no-op */
} FDNN_Plan_Destroy_Args;
#define FDNN_Plan_Destroy_Args_STRUCT_SIZE FDNN_STRUCT_SIZE(FDNN_Plan_Destroy_Args, plan)
typedef void FDNN_Plan_Destroy(FDNN_Plan_Destroy_Args* args);

/* Since ABI 1.1. Makes a FORWARD plan that owns a copy of the weights, converted once into
 * the layout the vendor computes in. The packed plan executes like `plan` but reads its own
 * weights and ignores Conv_Plan_Execute's `w`; later changes to the caller's w are not seen.
 * It needs the workspace size reported here, which may differ from the source plan's. */
typedef struct {
  size_t struct_size;
  const FDNN_Plan* plan; /* borrowed: a FORWARD plan of this shim */
  const void* w;         /* borrowed for this call: the weights, as described at plan time */
  void* stream;          /* GPU stream the copy is ordered on; borrowed; NULL on CPU */
  FDNN_Plan* packed_plan; /* out: owned by the caller, freed with Plan_Destroy */
  size_t workspace_size;  /* out */
} FDNN_Conv_Plan_Pack_Weights_Args;
#define FDNN_Conv_Plan_Pack_Weights_Args_STRUCT_SIZE \
  FDNN_STRUCT_SIZE(FDNN_Conv_Plan_Pack_Weights_Args, workspace_size)
typedef FDNN_Error* FDNN_Conv_Plan_Pack_Weights(FDNN_Conv_Plan_Pack_Weights_Args* args);

/* Since ABI 1.2. Whether and how a shim computes convolutions of one dtype on one device, as
 * it finds this machine (its instruction set, its vendor library, its GPU). A caller with
 * several shims for a device type sends each problem to the first shim that supports its
 * dtype. Everything reported here as supported is served by Conv_Plan_Create for every op,
 * rank, layout and epilogue of this header that the shim otherwise supports; a dtype
 * reported as FDNN_DTYPE_SUPPORT_NONE fails there with FDNN_ERROR_UNSUPPORTED. */
enum {
  FDNN_DTYPE_SUPPORT_NONE = 0,      /* not computed */
  FDNN_DTYPE_SUPPORT_NATIVE = 1,    /* computed by the vendor's kernels of that dtype */
  FDNN_DTYPE_SUPPORT_CONVERTED = 2, /* converted inside the plan to a wider dtype (float32),
                                       computed there, rounded once into the output */
};

typedef struct {
  size_t struct_size;
  int32_t device_id;     /* 0 .. num_devices-1 */
  FDNN_DLDataType dtype; /* the dtype of x, w, y and bias */
  int32_t support;       /* out: FDNN_DTYPE_SUPPORT_* */
  /* out: how, or why not, in words for a user ("float32 kernels with one rounding: this CPU
   * has no avx512_core_fp16"); "" when there is nothing to add. Static storage, lives as
   * long as the loaded shim. */
  const char* detail;
} FDNN_Conv_Dtype_Support_Args;
#define FDNN_Conv_Dtype_Support_Args_STRUCT_SIZE \
  FDNN_STRUCT_SIZE(FDNN_Conv_Dtype_Support_Args, detail)
/* Safe from any thread; may load the vendor library (as Shim_Info does). */
typedef FDNN_Error* FDNN_Conv_Dtype_Support(FDNN_Conv_Dtype_Support_Args* args);

/* ---------------------------------------------------------------------------------------- */
/* The table                                                                                */
/* ---------------------------------------------------------------------------------------- */

typedef struct {
  size_t struct_size; /* FDNN_Api_STRUCT_SIZE of the shim's own header */
  int32_t abi_major;
  int32_t abi_minor;
  FDNN_Error_Destroy* Error_Destroy;
  FDNN_Error_Describe* Error_Describe;
  FDNN_Shim_Info* Shim_Info;
  FDNN_Device_Describe* Device_Describe;
  FDNN_Conv_Plan_Create* Conv_Plan_Create;
  FDNN_Conv_Plan_Execute* Conv_Plan_Execute;
  FDNN_Plan_Destroy* Plan_Destroy;
  /* 1.1 */
  FDNN_Conv_Plan_Pack_Weights* Conv_Plan_Pack_Weights; /* may be NULL: the shim cannot pack */
  /* 1.2 */
  FDNN_Conv_Dtype_Support* Conv_Dtype_Support; /* not NULL in a 1.2 table */
  /* Append new functions here; never reorder. */
} FDNN_Api;
#define FDNN_Api_STRUCT_SIZE FDNN_STRUCT_SIZE(FDNN_Api, Conv_Dtype_Support)
/* The size of a 1.0 table, which callers accept: it lacks the 1.1 functions. */
#define FDNN_Api_STRUCT_SIZE_1_0 FDNN_STRUCT_SIZE(FDNN_Api, Plan_Destroy)

/* The one exported symbol. Returns a pointer to static storage; never NULL; cheap: does not
 * load the vendor library (Shim_Info does). */
typedef const FDNN_Api* FDNN_GetApiFn(void);
#define FDNN_GET_API_SYMBOL "fdnn_get_api"
FDNN_EXPORT const FDNN_Api* fdnn_get_api(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FLUX_DNN_FLUX_DNN_H_ */
