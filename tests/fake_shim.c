/* A shim with no vendor behind it, in two builds.
 *
 * By default, a test double for what the core and the dispatcher do with a shim
 * (tests/test_shims.py): load checks, what it reports (info, device, capabilities), error
 * kinds, plan caching and destruction, the flags and alignment a plan is made with. It
 * checks little and computes nothing: a FORWARD float32 plan writes 42 into y's first
 * element, so a test sees which pointer it got, and it allocates nothing at execute.
 *
 * With FAKE_COMPLETE, a complete shim: it checks every rule of the header that a shim checks
 * (enums, NULL descriptors, shapes and strides, geometry, alignment, struct sizes), refuses
 * with FDNN_ERROR_UNSUPPORTED what its capabilities leave out, and computes float32
 * convolutions by direct sums, so that the ABI suite (tests/abi/) can check a shim that
 * needs no vendor library on any machine with a C compiler.
 *
 * -D options:
 *   FAKE_NAME "fake"   FAKE_PRIORITY 1   FAKE_DEVICE_TYPE FDNN_DEVICE_CPU
 *   FAKE_SHIM_VERSION "9.9.9"   (the flux_dnn version it claims to be built from)
 *   FAKE_ABI_MAJOR     the abi_major of its table (FDNN_ABI_MAJOR): a foreign table
 *   FAKE_DEFAULT_FLAGS device 0's default flags (FDNN_CONV_ALLOW_REDUCED_PRECISION)
 *   FAKE_COMPLETE      checks and computes as above
 *   FAKE_FLOAT16       also computes float16 (converted); not with FAKE_COMPLETE
 *   FAKE_UNAVAILABLE   "why": loads, but reports itself unusable (no devices; describing a
 *                      device, capabilities and plans are FDNN_ERROR_UNAVAILABLE)
 *   FAKE_NULL_CAPABILITIES / FAKE_NULL_EXECUTE   leave that function out of the table
 *   FAKE_SHORT_TABLE   a table that ends before Conv_Plan_Pack_Weights
 *   FAKE_OBJECT_DATA   with FAKE_COMPLETE: tensor data are objects, as Metal's MTLBuffers
 *                      (ABI 2.1): execute takes each `data` as is and its byte offset from
 *                      FDNN_Buffer_Offsets, and refuses a call without it. (The "objects"
 *                      are host memory here, so the sums can still be computed.)
 * Without FAKE_COMPLETE, Conv_Plan_Create fails with error code (groups - 1000) when
 * groups > 1000.
 *
 * What it computes (either build): float32 (and float16 with FAKE_FLOAT16), spatial rank 2
 * only, activations none and relu on FORWARD, groups and alpha/beta; no dilation, no bias
 * gradient, no deterministic flag, no weight packing.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "flux_dnn/flux_dnn.h"

#ifndef FAKE_NAME
#define FAKE_NAME "fake"
#endif
#ifndef FAKE_PRIORITY
#define FAKE_PRIORITY 1
#endif
#ifndef FAKE_DEVICE_TYPE
#define FAKE_DEVICE_TYPE FDNN_DEVICE_CPU
#endif
#ifndef FAKE_SHIM_VERSION
#define FAKE_SHIM_VERSION "9.9.9"
#endif
#ifndef FAKE_ABI_MAJOR
#define FAKE_ABI_MAJOR FDNN_ABI_MAJOR
#endif
#ifndef FAKE_DEFAULT_FLAGS
#define FAKE_DEFAULT_FLAGS FDNN_CONV_ALLOW_REDUCED_PRECISION
#endif
#if defined(FAKE_COMPLETE) && defined(FAKE_FLOAT16)
#error "FAKE_COMPLETE computes float32 only"
#endif

/* What tests/test_shims.py reads through ctypes; a complete shim exports fdnn_get_api only. */
#ifdef FAKE_COMPLETE
#define FAKE_COUNTER static
#else
#define FAKE_COUNTER FDNN_EXPORT
#endif
FAKE_COUNTER int fake_plans_created = 0;
FAKE_COUNTER int fake_plans_destroyed = 0;
FAKE_COUNTER int fake_executions = 0;
FAKE_COUNTER uint32_t fake_last_flags = 0;
FAKE_COUNTER uintptr_t fake_last_x_address = 0; /* data + byte_offset of x at plan time */

struct FDNN_Error {
  int32_t code;
  char message[256];
};

/* Indices into the 5-entry shapes and strides of a plan: batch/out-channel, channel, then
 * three spatial dims (a rank below 3 leaves the last ones at size 1). */
enum { DIMS = 5 };

struct FDNN_Plan {
  int32_t op;
  uint8_t bits;
  /* FAKE_COMPLETE: the problem as described at plan time, in elements. */
  int64_t groups;
  int64_t x_shape[DIMS], w_shape[DIMS], y_shape[DIMS];
  int64_t x_strides[DIMS], w_strides[DIMS], y_strides[DIMS];
  int has_bias;
  int64_t bias_stride;
  int64_t stride[3], dilation[3], padding_lo[3];
  float alpha, beta;
  int32_t activation;
};

static FDNN_Error* make_error(int32_t code, const char* what, int value) {
  FDNN_Error* e = (FDNN_Error*)malloc(sizeof *e);
  if (e == NULL) return NULL; /* the caller sees success; a test machine has memory */
  e->code = code;
  snprintf(e->message, sizeof e->message, "%s %d", what, value);
  return e;
}

static FDNN_Error* errorf(int32_t code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static FDNN_Error* errorf(int32_t code, const char* fmt, ...) {
  FDNN_Error* e = (FDNN_Error*)malloc(sizeof *e);
  if (e == NULL) return NULL;
  e->code = code;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->message, sizeof e->message, fmt, ap);
  va_end(ap);
  return e;
}

/* NULL args or a struct_size below this header's: the caller's mistake. */
#define CHECK_ARGS(args, type, function)                                                        \
  do {                                                                                          \
    if ((args) == NULL) return errorf(FDNN_ERROR_INVALID_ARGUMENT, function ": args is NULL");  \
    if ((args)->struct_size < type##_STRUCT_SIZE)                                               \
      return errorf(FDNN_ERROR_INVALID_ARGUMENT, function ": struct_size %zu is smaller than %zu", \
                    (args)->struct_size, (size_t)type##_STRUCT_SIZE);                           \
  } while (0)

#ifdef FAKE_UNAVAILABLE
#define CHECK_AVAILABLE(function) \
  return errorf(FDNN_ERROR_UNAVAILABLE, function ": " FAKE_NAME " is unavailable: %s", FAKE_UNAVAILABLE)
#else
#define CHECK_AVAILABLE(function) (void)0
#endif

static void Error_Destroy(FDNN_Error_Destroy_Args* args) { free(args->error); }

static void Error_Describe(FDNN_Error_Describe_Args* args) {
  size_t n = 0;
  while (args->error->message[n] != '\0') ++n;
  args->code = args->error->code;
  args->message = args->error->message;
  args->message_size = n;
}

static FDNN_Error* Shim_Info(FDNN_Shim_Info_Args* args) {
  CHECK_ARGS(args, FDNN_Shim_Info_Args, "Shim_Info");
  args->shim_name = FAKE_NAME;
  args->vendor_name = "FakeVendor";
  args->vendor_version_built = "1.0";
  args->vendor_version_runtime = "1.0";
  args->shim_version = FAKE_SHIM_VERSION;
  args->device_type = FAKE_DEVICE_TYPE;
  args->priority = FAKE_PRIORITY;
#ifdef FAKE_UNAVAILABLE
  args->num_devices = 0;
  args->unavailable_reason = FAKE_UNAVAILABLE;
#else
  args->num_devices = 1;
  args->unavailable_reason = NULL;
#endif
  return NULL;
}

static FDNN_Error* Device_Describe(FDNN_Device_Describe_Args* args) {
  CHECK_ARGS(args, FDNN_Device_Describe_Args, "Device_Describe");
  CHECK_AVAILABLE("Device_Describe");
  if (args->device_id != 0)
    return make_error(FDNN_ERROR_INVALID_ARGUMENT, "no such device", args->device_id);
  args->default_flags = FAKE_DEFAULT_FLAGS;
  args->name = "fake device 0";
  return NULL;
}

static const uint32_t kFeatures = FDNN_FEATURE_GROUPS | FDNN_FEATURE_ALPHA_BETA;
static const uint32_t kForwardActivations = (1u << FDNN_ACTIVATION_NONE) | (1u << FDNN_ACTIVATION_RELU);

static int is_float(FDNN_DLDataType t, int bits) {
  return t.code == FDNN_DTYPE_FLOAT && t.bits == bits && t.lanes == 1;
}

static FDNN_Error* Conv_Capabilities(FDNN_Conv_Capabilities_Args* args) {
  CHECK_ARGS(args, FDNN_Conv_Capabilities_Args, "Conv_Capabilities");
  if (args->op < FDNN_CONV_FORWARD || args->op > FDNN_CONV_BACKWARD_WEIGHT)
    return make_error(FDNN_ERROR_INVALID_ARGUMENT, "no such op", args->op);
  CHECK_AVAILABLE("Conv_Capabilities");
  if (args->device_id != 0)
    return make_error(FDNN_ERROR_INVALID_ARGUMENT, "no such device", args->device_id);
  const int is_float32 = is_float(args->dtype, 32);
  int is_float16 = 0;
#ifdef FAKE_FLOAT16
  is_float16 = is_float(args->dtype, 16);
#endif
  args->support = is_float32 ? FDNN_SUPPORT_NATIVE : is_float16 ? FDNN_SUPPORT_CONVERTED : FDNN_SUPPORT_NONE;
  if (args->support == FDNN_SUPPORT_NONE) {
    args->spatial_ranks = args->activations = args->features = 0;
    args->detail = "fake computes float32 only";
    return NULL;
  }
  args->spatial_ranks = 1u << 2;
  args->activations = args->op == FDNN_CONV_FORWARD ? kForwardActivations : 1u << FDNN_ACTIVATION_NONE;
  args->features = kFeatures;
  args->detail = is_float32 ? "fake float32 kernels" : "fake: computed in float32";
  return NULL;
}

#ifdef FAKE_COMPLETE
/* ------------------------------------------------------------------------------------------
 * The header's rules for Conv_Plan_Create, each refused naming the field and its value. */

static FDNN_Error* check_enums(const FDNN_Conv_Plan_Create_Args* a) {
  if (a->op < 0 || a->op >= FDNN_NUM_CONV_OPS)
    return errorf(FDNN_ERROR_INVALID_ARGUMENT, "op %d is not an FDNN_CONV_* value", (int)a->op);
  if (a->spatial_rank < 1 || a->spatial_rank > FDNN_MAX_SPATIAL_DIMS)
    return errorf(FDNN_ERROR_INVALID_ARGUMENT, "spatial_rank %d is not 1, 2 or 3", (int)a->spatial_rank);
  if (a->activation < 0 || a->activation >= FDNN_NUM_ACTIVATIONS)
    return errorf(FDNN_ERROR_INVALID_ARGUMENT, "activation %d is not an FDNN_ACTIVATION_* value",
                  (int)a->activation);
  if (a->algo_policy < FDNN_ALGO_HEURISTIC || a->algo_policy > FDNN_ALGO_GIVEN)
    return errorf(FDNN_ERROR_INVALID_ARGUMENT, "algo_policy %d is not an FDNN_ALGO_* value",
                  (int)a->algo_policy);
  return NULL;
}

/* A descriptor: present, of ndim dims (bias: 1, or 0 for none), shape and strides given,
 * no empty dim, on this shim's device type, x's dtype and device, data aligned. */
static FDNN_Error* check_tensor(const FDNN_DLTensor* t, const char* name, int ndim, const FDNN_DLTensor* x) {
  if (t == NULL) return errorf(FDNN_ERROR_INVALID_ARGUMENT, "%s is NULL: every descriptor is required", name);
  if (t->ndim == 0 && ndim == 1) return NULL; /* no bias */
  if (t->ndim != ndim) return errorf(FDNN_ERROR_INVALID_ARGUMENT, "%s has ndim %d, not %d", name, (int)t->ndim, ndim);
  if (t->shape == NULL || t->strides == NULL)
    return errorf(FDNN_ERROR_INVALID_ARGUMENT, "%s has a NULL %s", name, t->shape == NULL ? "shape" : "strides");
  for (int i = 0; i < ndim; ++i)
    if (t->shape[i] < 1)
      return errorf(FDNN_ERROR_INVALID_ARGUMENT, "%s has shape[%d] = %lld; every dim must be >= 1", name, i,
                    (long long)t->shape[i]);
  if (t->device.device_type != FAKE_DEVICE_TYPE || t->device.device_id != 0)
    return errorf(FDNN_ERROR_INVALID_ARGUMENT, "%s is on device (%d, %d); this shim serves (%d, 0)", name,
                  (int)t->device.device_type, (int)t->device.device_id, FAKE_DEVICE_TYPE);
  if (t != x && (t->dtype.code != x->dtype.code || t->dtype.bits != x->dtype.bits || t->dtype.lanes != x->dtype.lanes))
    return errorf(FDNN_ERROR_INVALID_ARGUMENT, "%s has another dtype than x", name);
  const size_t element = t->dtype.bits >= 8 ? t->dtype.bits / 8u : 1u;
  if (t->data != NULL && ((uintptr_t)t->data + t->byte_offset) % element != 0)
    return errorf(FDNN_ERROR_INVALID_ARGUMENT, "%s: data + byte_offset is not aligned to its element size (%zu bytes)",
                  name, element);
  return NULL;
}

static FDNN_Error* check_geometry(const FDNN_Conv_Plan_Create_Args* a) {
  for (int i = 0; i < a->spatial_rank; ++i) {
    const struct { const char* name; int64_t value, least; } params[] = {
        {"stride", a->stride[i], 1}, {"dilation", a->dilation[i], 1},
        {"padding_lo", a->padding_lo[i], 0}, {"padding_hi", a->padding_hi[i], 0}};
    for (int p = 0; p < 4; ++p)
      if (params[p].value < params[p].least)
        return errorf(FDNN_ERROR_INVALID_ARGUMENT, "%s[%d] is %lld; it must be >= %lld", params[p].name, i,
                      (long long)params[p].value, (long long)params[p].least);
  }
  const int64_t g = a->groups, C = a->x->shape[1], K = a->w->shape[0];
  if (g < 1) return errorf(FDNN_ERROR_INVALID_ARGUMENT, "groups is %lld; it must be >= 1", (long long)g);
  if (C % g != 0 || K % g != 0 || a->w->shape[1] * g != C)
    return errorf(FDNN_ERROR_INVALID_ARGUMENT, "channels do not fit groups=%lld: C=%lld, K=%lld, w C/groups=%lld",
                  (long long)g, (long long)C, (long long)K, (long long)a->w->shape[1]);
  if (a->y->shape[0] != a->x->shape[0] || a->y->shape[1] != K)
    return errorf(FDNN_ERROR_INVALID_ARGUMENT, "y must be (N, K, ...) = (%lld, %lld, ...)",
                  (long long)a->x->shape[0], (long long)K);
  for (int i = 0; i < a->spatial_rank; ++i) {
    const int64_t extent = a->dilation[i] * (a->w->shape[2 + i] - 1) + 1;
    const int64_t padded = a->x->shape[2 + i] + a->padding_lo[i] + a->padding_hi[i];
    const int64_t out = padded >= extent ? (padded - extent) / a->stride[i] + 1 : 0;
    if (out != a->y->shape[2 + i])
      return errorf(FDNN_ERROR_INVALID_ARGUMENT, "spatial dim %d of y is %lld, the convolution gives %lld", i,
                    (long long)a->y->shape[2 + i], (long long)out);
  }
  if (a->bias->ndim == 1) {
    if (a->op == FDNN_CONV_BACKWARD_DATA)
      return errorf(FDNN_ERROR_INVALID_ARGUMENT, "backward_data takes no bias (give it ndim 0)");
    if (a->bias->shape[0] != K)
      return errorf(FDNN_ERROR_INVALID_ARGUMENT, "bias has shape (%lld,); it must be (K,) = (%lld,)",
                    (long long)a->bias->shape[0], (long long)K);
  }
  if (a->activation != FDNN_ACTIVATION_NONE && a->op != FDNN_CONV_FORWARD)
    return errorf(FDNN_ERROR_INVALID_ARGUMENT, "activation %d with op %d: an activation is fused into forward only",
                  (int)a->activation, (int)a->op);
  return NULL;
}

static FDNN_Error* check_problem(const FDNN_Conv_Plan_Create_Args* a) {
  FDNN_Error* e = check_enums(a);
  const int ndim = a->spatial_rank + 2;
  if (e == NULL) e = check_tensor(a->x, "x", ndim, a->x);
  if (e == NULL) e = check_tensor(a->w, "w", ndim, a->x);
  if (e == NULL) e = check_tensor(a->y, "y", ndim, a->x);
  if (e == NULL) e = check_tensor(a->bias, "bias", 1, a->x);
  if (e == NULL) e = check_geometry(a);
  return e;
}

/* What the capabilities leave out: FDNN_ERROR_UNSUPPORTED before any work. */
static FDNN_Error* check_covered(const FDNN_Conv_Plan_Create_Args* a) {
  if (!is_float(a->x->dtype, 32))
    return errorf(FDNN_ERROR_UNSUPPORTED, FAKE_NAME " computes float32 only");
  if (a->spatial_rank != 2)
    return errorf(FDNN_ERROR_UNSUPPORTED, FAKE_NAME " serves spatial rank 2, not %d", (int)a->spatial_rank);
  const uint32_t activations = a->op == FDNN_CONV_FORWARD ? kForwardActivations : 1u << FDNN_ACTIVATION_NONE;
  if (!(activations & (1u << a->activation)))
    return errorf(FDNN_ERROR_UNSUPPORTED, FAKE_NAME " does not fuse activation %d", (int)a->activation);
  for (int i = 0; i < a->spatial_rank; ++i)
    if (a->dilation[i] != 1) return errorf(FDNN_ERROR_UNSUPPORTED, FAKE_NAME " does not serve dilation > 1");
  if (a->op == FDNN_CONV_BACKWARD_WEIGHT && a->bias->ndim == 1)
    return errorf(FDNN_ERROR_UNSUPPORTED, FAKE_NAME " does not serve a bias gradient");
  if (a->flags & FDNN_CONV_DETERMINISTIC)
    return errorf(FDNN_ERROR_UNSUPPORTED, FAKE_NAME " does not serve FDNN_CONV_DETERMINISTIC");
  return NULL;
}

/* Shape and strides of t into 5 entries: spatial dims beyond the rank have size 1. */
static void copy_dims(const FDNN_DLTensor* t, int64_t shape[DIMS], int64_t strides[DIMS]) {
  for (int i = 0; i < DIMS; ++i) {
    shape[i] = i < t->ndim ? t->shape[i] : 1;
    strides[i] = i < t->ndim ? t->strides[i] : 0;
  }
}

static void describe_plan(const FDNN_Conv_Plan_Create_Args* a, FDNN_Plan* p) {
  copy_dims(a->x, p->x_shape, p->x_strides);
  copy_dims(a->w, p->w_shape, p->w_strides);
  copy_dims(a->y, p->y_shape, p->y_strides);
  p->groups = a->groups;
  p->has_bias = a->bias->ndim == 1;
  p->bias_stride = p->has_bias ? a->bias->strides[0] : 0;
  for (int i = 0; i < 3; ++i) {
    p->stride[i] = i < a->spatial_rank ? a->stride[i] : 1;
    p->dilation[i] = i < a->spatial_rank ? a->dilation[i] : 1;
    p->padding_lo[i] = i < a->spatial_rank ? a->padding_lo[i] : 0;
  }
  p->alpha = a->alpha;
  p->beta = a->beta;
  p->activation = a->activation;
}
#endif /* FAKE_COMPLETE */

static FDNN_Error* Conv_Plan_Create(FDNN_Conv_Plan_Create_Args* args) {
  CHECK_ARGS(args, FDNN_Conv_Plan_Create_Args, "Conv_Plan_Create");
  CHECK_AVAILABLE("Conv_Plan_Create");
#ifdef FAKE_COMPLETE
  FDNN_Error* refused = check_problem(args);
  if (refused == NULL) refused = check_covered(args);
  if (refused != NULL) return refused;
#else
  if (args->groups > 1000)
    return make_error((int32_t)(args->groups - 1000), "fake failure code", (int)(args->groups - 1000));
#endif
  FDNN_Plan* plan = (FDNN_Plan*)calloc(1, sizeof *plan);
  if (plan == NULL) return make_error(FDNN_ERROR_OUT_OF_MEMORY, "plan", 0);
  plan->op = args->op;
  plan->bits = args->x->dtype.bits;
#ifdef FAKE_COMPLETE
  describe_plan(args, plan);
#endif
  fake_last_flags = args->flags;
  fake_last_x_address = (uintptr_t)args->x->data + (uintptr_t)args->x->byte_offset;
  ++fake_plans_created;
  args->plan = plan;
  args->workspace_size = 0;
  args->chosen_algo_id = 7;
  args->algo_name = "fake algorithm";
  return NULL;
}

#ifdef FAKE_COMPLETE
/* ------------------------------------------------------------------------------------------
 * Direct sums in double: every (n, k, c, output position, kernel position) term once. */

static int64_t offset(const int64_t strides[DIMS], int64_t a, int64_t b, const int64_t s[3]) {
  return a * strides[0] + b * strides[1] + s[0] * strides[2] + s[1] * strides[3] + s[2] * strides[4];
}

/* Row-major index into the dense accumulator of a tensor of `shape`. */
static size_t dense(const int64_t shape[DIMS], int64_t a, int64_t b, const int64_t s[3]) {
  return (size_t)((((a * shape[1] + b) * shape[2] + s[0]) * shape[3] + s[1]) * shape[4] + s[2]);
}

static void accumulate(const FDNN_Plan* p, const float* x, const float* w, const float* y, double* acc) {
  const int64_t Cg = p->w_shape[1], Kg = p->w_shape[0] / p->groups;
  for (int64_t n = 0; n < p->x_shape[0]; ++n)
    for (int64_t k = 0; k < p->w_shape[0]; ++k)
      for (int64_t c = 0; c < Cg; ++c) {
        const int64_t ci = (k / Kg) * Cg + c; /* x's channel in k's group */
        int64_t o[3], q[3], i[3];
        for (o[0] = 0; o[0] < p->y_shape[2]; ++o[0])
          for (o[1] = 0; o[1] < p->y_shape[3]; ++o[1])
            for (o[2] = 0; o[2] < p->y_shape[4]; ++o[2])
              for (q[0] = 0; q[0] < p->w_shape[2]; ++q[0])
                for (q[1] = 0; q[1] < p->w_shape[3]; ++q[1])
                  for (q[2] = 0; q[2] < p->w_shape[4]; ++q[2]) {
                    int inside = 1;
                    for (int d = 0; d < 3; ++d) {
                      i[d] = o[d] * p->stride[d] - p->padding_lo[d] + q[d] * p->dilation[d];
                      inside = inside && i[d] >= 0 && i[d] < p->x_shape[2 + d];
                    }
                    if (!inside) continue;
                    const double wv = p->op == FDNN_CONV_BACKWARD_WEIGHT ? 0 : w[offset(p->w_strides, k, c, q)];
                    const double xv = p->op == FDNN_CONV_BACKWARD_DATA ? 0 : x[offset(p->x_strides, n, ci, i)];
                    const double yv = p->op == FDNN_CONV_FORWARD ? 0 : y[offset(p->y_strides, n, k, o)];
                    if (p->op == FDNN_CONV_FORWARD) acc[dense(p->y_shape, n, k, o)] += xv * wv;
                    if (p->op == FDNN_CONV_BACKWARD_DATA) acc[dense(p->x_shape, n, ci, i)] += yv * wv;
                    if (p->op == FDNN_CONV_BACKWARD_WEIGHT) acc[dense(p->w_shape, k, c, q)] += xv * yv;
                  }
      }
}

/* out = alpha * act(acc + bias) + beta * out, over the written tensor. */
static void write_out(const FDNN_Plan* p, const double* acc, const float* bias, float* out) {
  const int64_t* shape = p->op == FDNN_CONV_FORWARD ? p->y_shape : p->op == FDNN_CONV_BACKWARD_DATA ? p->x_shape : p->w_shape;
  const int64_t* strides = p->op == FDNN_CONV_FORWARD ? p->y_strides
                           : p->op == FDNN_CONV_BACKWARD_DATA ? p->x_strides : p->w_strides;
  int64_t s[3];
  for (int64_t a = 0; a < shape[0]; ++a)
    for (int64_t b = 0; b < shape[1]; ++b)
      for (s[0] = 0; s[0] < shape[2]; ++s[0])
        for (s[1] = 0; s[1] < shape[3]; ++s[1])
          for (s[2] = 0; s[2] < shape[4]; ++s[2]) {
            double v = acc[dense(shape, a, b, s)];
            if (p->op == FDNN_CONV_FORWARD && p->has_bias) v += bias[b * p->bias_stride];
            if (p->activation == FDNN_ACTIVATION_RELU && v < 0) v = 0;
            v *= p->alpha;
            float* at = out + offset(strides, a, b, s);
            *at = (float)(p->beta != 0.f ? v + (double)p->beta * *at : v);
          }
}

static FDNN_Error* compute(const FDNN_Plan* p, const FDNN_Conv_Plan_Execute_Args* a) {
  const struct { const void* pointer; const char* name; int needed; } operands[] = {
      {a->x, "x", 1}, {a->w, "w", 1}, {a->y, "y", 1}, {a->bias, "bias", p->op == FDNN_CONV_FORWARD && p->has_bias}};
  for (int i = 0; i < 4; ++i) {
    if (operands[i].pointer == NULL && operands[i].needed)
      return errorf(FDNN_ERROR_INVALID_ARGUMENT, "Conv_Plan_Execute: %s is NULL", operands[i].name);
    if ((uintptr_t)operands[i].pointer % sizeof(float) != 0)
      return errorf(FDNN_ERROR_INVALID_ARGUMENT, "Conv_Plan_Execute: %s at %p is not aligned to its element size",
                    operands[i].name, operands[i].pointer);
  }
  const int64_t* shape = p->op == FDNN_CONV_FORWARD ? p->y_shape : p->op == FDNN_CONV_BACKWARD_DATA ? p->x_shape : p->w_shape;
  double* acc = (double*)calloc((size_t)(shape[0] * shape[1] * shape[2] * shape[3] * shape[4]), sizeof *acc);
  if (acc == NULL) return errorf(FDNN_ERROR_OUT_OF_MEMORY, "Conv_Plan_Execute: no memory for the sums");
  accumulate(p, (const float*)a->x, (const float*)a->w, (const float*)a->y, acc);
  float* out = (float*)(p->op == FDNN_CONV_FORWARD ? a->y : p->op == FDNN_CONV_BACKWARD_DATA ? a->x : a->w);
  write_out(p, acc, (const float*)a->bias, out);
  free(acc);
  return NULL;
}
#endif /* FAKE_COMPLETE */

#if defined(FAKE_COMPLETE) && defined(FAKE_OBJECT_DATA)
/* The execute args with data + the byte offsets of FDNN_Buffer_Offsets; NULL without them. */
static int shift_by_offsets(const FDNN_Conv_Plan_Execute_Args* a, FDNN_Conv_Plan_Execute_Args* shifted) {
  const FDNN_Extension_Base* e = a->extension_start;
  while (e != NULL && e->type != FDNN_EXTENSION_BUFFER_OFFSETS) e = e->next;
  if (e == NULL || e->struct_size < FDNN_Buffer_Offsets_STRUCT_SIZE) return 0;
  const FDNN_Buffer_Offsets* o = (const FDNN_Buffer_Offsets*)e;
  *shifted = *a;
  shifted->x = a->x ? (char*)a->x + o->x_offset : NULL;
  shifted->w = a->w ? (char*)a->w + o->w_offset : NULL;
  shifted->y = a->y ? (char*)a->y + o->y_offset : NULL;
  shifted->bias = a->bias ? (char*)a->bias + o->bias_offset : NULL;
  return 1;
}
#endif

static FDNN_Error* Conv_Plan_Execute(FDNN_Conv_Plan_Execute_Args* args) {
  CHECK_ARGS(args, FDNN_Conv_Plan_Execute_Args, "Conv_Plan_Execute");
  if (args->plan == NULL) return errorf(FDNN_ERROR_INVALID_ARGUMENT, "Conv_Plan_Execute: plan is NULL");
  __atomic_add_fetch(&fake_executions, 1, __ATOMIC_RELAXED); /* executions may run at once */
#if defined(FAKE_COMPLETE) && defined(FAKE_OBJECT_DATA)
  FDNN_Conv_Plan_Execute_Args shifted;
  if (!shift_by_offsets(args, &shifted))
    return errorf(FDNN_ERROR_INVALID_ARGUMENT,
                  "Conv_Plan_Execute: tensor data are objects here: their byte offsets must come in FDNN_Buffer_Offsets");
  return compute(args->plan, &shifted);
#elif defined(FAKE_COMPLETE)
  return compute(args->plan, args);
#else
  if (args->plan->op == FDNN_CONV_FORWARD && args->plan->bits == 32) *(float*)args->y = 42.0f;
  return NULL;
#endif
}

static void Plan_Destroy(FDNN_Plan_Destroy_Args* args) {
  if (args->plan == NULL) return;
  ++fake_plans_destroyed;
  free(args->plan);
}

static FDNN_Api api;

FDNN_EXPORT const FDNN_Api* fdnn_get_api(void) {
  api.struct_size = FDNN_Api_STRUCT_SIZE;
#ifdef FAKE_SHORT_TABLE
  api.struct_size = FDNN_STRUCT_SIZE(FDNN_Api, Plan_Destroy);
#endif
  api.abi_major = FAKE_ABI_MAJOR;
  api.abi_minor = FDNN_ABI_MINOR;
  api.Error_Destroy = Error_Destroy;
  api.Error_Describe = Error_Describe;
  api.Shim_Info = Shim_Info;
  api.Device_Describe = Device_Describe;
  api.Conv_Capabilities = Conv_Capabilities;
  api.Conv_Plan_Create = Conv_Plan_Create;
  api.Conv_Plan_Execute = Conv_Plan_Execute;
  api.Plan_Destroy = Plan_Destroy;
#ifdef FAKE_NULL_CAPABILITIES
  api.Conv_Capabilities = NULL;
#endif
#ifdef FAKE_NULL_EXECUTE
  api.Conv_Plan_Execute = NULL;
#endif
  api.Conv_Plan_Pack_Weights = NULL;
  return &api;
}
