#include "shim_common.hpp"

#if !defined(_WIN32)
#include <pthread.h>
#endif

#include <atomic>
#include <sstream>

namespace fdnn_shim {

namespace {
std::atomic<bool> forked_child{false};
[[maybe_unused]] void mark_forked_child() { forked_child.store(true, std::memory_order_relaxed); }
// Registered when the shim is loaded (a static initialiser of this translation unit, which
// every shim links through in_forked_child).
#if defined(_WIN32)
const int fork_handler_registered = 0;  // no fork() on Windows
#else
const int fork_handler_registered = pthread_atfork(nullptr, nullptr, mark_forked_child);
#endif
}  // namespace

bool in_forked_child() {
  (void)fork_handler_registered;
  return forked_child.load(std::memory_order_relaxed);
}

const char* op_name(FDNN_ConvOp op) {
  switch (op) {
    case FDNN_CONV_FORWARD: return "forward";
    case FDNN_CONV_BACKWARD_DATA: return "backward_data";
    case FDNN_CONV_BACKWARD_WEIGHT: return "backward_weight";
  }
  return "unknown";
}

const char* dtype_name(FDNN_DLDataType t) {
  if (t.code == FDNN_DTYPE_FLOAT && t.bits == 16) return "float16";
  if (t.code == FDNN_DTYPE_FLOAT && t.bits == 32) return "float32";
  if (t.code == FDNN_DTYPE_FLOAT && t.bits == 64) return "float64";
  if (t.code == FDNN_DTYPE_BFLOAT && t.bits == 16) return "bfloat16";
  return "unsupported-dtype";
}

static void put_tensor(std::ostringstream& os, const char* name, const FDNN_DLTensor* t) {
  if (!has_tensor(t)) return;
  os << ' ' << name << "=[";
  for (int i = 0; i < t->ndim; ++i) os << (i ? "," : "") << t->shape[i];
  os << "]/strides[";
  for (int i = 0; i < t->ndim; ++i) os << (i ? "," : "") << t->strides[i];
  os << "]/" << dtype_name(t->dtype);
}

static void put_dims(std::ostringstream& os, const char* name, const int64_t* v, int n) {
  os << ' ' << name << "=(";
  for (int i = 0; i < n; ++i) os << (i ? "," : "") << v[i];
  os << ')';
}

namespace {

bool same_dtype(FDNN_DLDataType a, FDNN_DLDataType b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

void check_tensor(const FDNN_DLTensor* t, const char* name, int ndim, int32_t device_type) {
  if (!has_tensor(t) || t->ndim != ndim)
    fail(FDNN_ERROR_INVALID_ARGUMENT, "%s must have %d dimensions", name, ndim);
  if (t->device.device_type != device_type)
    fail(FDNN_ERROR_INVALID_ARGUMENT, "%s is on DLPack device type %d, not %d", name,
         static_cast<int>(t->device.device_type), static_cast<int>(device_type));
  if (t->shape == nullptr || t->strides == nullptr)
    fail(FDNN_ERROR_INVALID_ARGUMENT, "%s has NULL shape or strides", name);
  for (int i = 0; i < ndim; ++i)
    if (t->shape[i] < 1) fail(FDNN_ERROR_INVALID_ARGUMENT, "%s has an empty dimension", name);
}

}  // namespace

void check_conv_problem(const FDNN_Conv_Plan_Create_Args& a, int32_t device_type) {
  const int n = a.spatial_rank;
  if (a.op != FDNN_CONV_FORWARD && a.op != FDNN_CONV_BACKWARD_DATA &&
      a.op != FDNN_CONV_BACKWARD_WEIGHT)
    fail(FDNN_ERROR_INVALID_ARGUMENT, "unknown op %d", static_cast<int>(a.op));
  if (n < 1 || n > FDNN_MAX_SPATIAL_DIMS)
    fail(FDNN_ERROR_INVALID_ARGUMENT, "spatial_rank %d is not 1, 2 or 3", n);
  check_tensor(a.x, "x", n + 2, device_type);
  check_tensor(a.w, "w", n + 2, device_type);
  check_tensor(a.y, "y", n + 2, device_type);
  for (const FDNN_DLTensor* t : {a.w, a.y})
    if (!same_dtype(t->dtype, a.x->dtype))
      fail(FDNN_ERROR_INVALID_ARGUMENT, "x, w and y dtypes differ");
  const int64_t g = a.groups;
  const int64_t N = a.x->shape[0], C = a.x->shape[1], K = a.w->shape[0];
  if (g < 1 || C % g != 0 || K % g != 0 || a.w->shape[1] * g != C)
    fail(FDNN_ERROR_INVALID_ARGUMENT, "channels do not fit groups: %s",
         describe_problem(a).c_str());
  if (a.y->shape[0] != N || a.y->shape[1] != K)
    fail(FDNN_ERROR_INVALID_ARGUMENT, "y must be (N, K, ...): %s", describe_problem(a).c_str());
  for (int i = 0; i < n; ++i) {
    const int64_t k = a.w->shape[2 + i], extent = a.dilation[i] * (k - 1) + 1;
    const int64_t padded = a.x->shape[2 + i] + a.padding_lo[i] + a.padding_hi[i];
    if (a.stride[i] < 1 || a.dilation[i] < 1 || a.padding_lo[i] < 0 || a.padding_hi[i] < 0 ||
        padded < extent || (padded - extent) / a.stride[i] + 1 != a.y->shape[2 + i])
      fail(FDNN_ERROR_INVALID_ARGUMENT, "inconsistent spatial dim %d: %s", i,
           describe_problem(a).c_str());
  }
  if (has_tensor(a.bias)) {
    if (a.op == FDNN_CONV_BACKWARD_DATA)
      fail(FDNN_ERROR_INVALID_ARGUMENT, "backward_data takes no bias");
    if (a.bias->ndim != 1 || a.bias->shape == nullptr || a.bias->strides == nullptr ||
        a.bias->shape[0] != K || !same_dtype(a.bias->dtype, a.x->dtype) ||
        a.bias->device.device_type != device_type)
      fail(FDNN_ERROR_INVALID_ARGUMENT, "bias must be (K,) = (%lld,) of the input dtype",
           static_cast<long long>(K));
  }
  if (a.activation < FDNN_ACTIVATION_NONE || a.activation > FDNN_ACTIVATION_SILU)
    fail(FDNN_ERROR_INVALID_ARGUMENT, "unknown activation %d", static_cast<int>(a.activation));
  if (a.activation != FDNN_ACTIVATION_NONE && a.op != FDNN_CONV_FORWARD)
    fail(FDNN_ERROR_INVALID_ARGUMENT, "an activation is fused into forward only");
  if (a.algo_policy < FDNN_ALGO_HEURISTIC || a.algo_policy > FDNN_ALGO_GIVEN)
    fail(FDNN_ERROR_INVALID_ARGUMENT, "unknown algo_policy %d", static_cast<int>(a.algo_policy));
}

std::string describe_problem(const FDNN_Conv_Plan_Create_Args& a) {
  std::ostringstream os;
  os << "conv" << a.spatial_rank << "d " << op_name(a.op);
  put_tensor(os, "x", a.x);
  put_tensor(os, "w", a.w);
  put_tensor(os, "y", a.y);
  put_tensor(os, "bias", a.bias);
  int n = a.spatial_rank;
  put_dims(os, "stride", a.stride, n);
  put_dims(os, "dilation", a.dilation, n);
  put_dims(os, "padding_lo", a.padding_lo, n);
  put_dims(os, "padding_hi", a.padding_hi, n);
  os << " groups=" << a.groups;
  return os.str();
}

}  // namespace fdnn_shim
