#include "shim_common.hpp"

#if !defined(_WIN32)
#include <pthread.h>
#endif

#include <atomic>
#include <sstream>
#include <string>
#include <utility>

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

const char* op_name(int32_t op) {
  switch (op) {
    case FDNN_CONV_FORWARD: return "forward";
    case FDNN_CONV_BACKWARD_DATA: return "backward_data";
    case FDNN_CONV_BACKWARD_WEIGHT: return "backward_weight";
  }
  return "unknown";
}

const char* activation_name(int32_t act) {
  switch (act) {
    case FDNN_ACTIVATION_NONE: return "none";
    case FDNN_ACTIVATION_RELU: return "relu";
    case FDNN_ACTIVATION_LEAKY_RELU: return "leaky_relu";
    case FDNN_ACTIVATION_CLIP: return "clip";
    case FDNN_ACTIVATION_SIGMOID: return "sigmoid";
    case FDNN_ACTIVATION_TANH: return "tanh";
    case FDNN_ACTIVATION_GELU_TANH: return "gelu_tanh";
    case FDNN_ACTIVATION_GELU_ERF: return "gelu_erf";
    case FDNN_ACTIVATION_SILU: return "silu";
  }
  return "unknown";
}

const char* dtype_name(FDNN_DLDataType t) {
  if (t.lanes == 1 && t.code == FDNN_DTYPE_FLOAT && t.bits == 16) return "float16";
  if (t.lanes == 1 && t.code == FDNN_DTYPE_FLOAT && t.bits == 32) return "float32";
  if (t.lanes == 1 && t.code == FDNN_DTYPE_FLOAT && t.bits == 64) return "float64";
  if (t.lanes == 1 && t.code == FDNN_DTYPE_BFLOAT && t.bits == 16) return "bfloat16";
  return "unsupported-dtype";
}

static void put_tensor(std::ostringstream& os, const char* name, const FDNN_DLTensor* t) {
  if (!has_tensor(t) || t->shape == nullptr || t->strides == nullptr) return;
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

// The enum fields: values outside the header's constants are the caller's mistake.
void check_enums(const FDNN_Conv_Plan_Create_Args& a) {
  if (a.op < 0 || a.op >= FDNN_NUM_CONV_OPS)
    fail(FDNN_ERROR_INVALID_ARGUMENT,
         "op %d is not an FDNN_CONV_* value (0 forward, 1 backward_data, 2 backward_weight)",
         static_cast<int>(a.op));
  if (a.spatial_rank < 1 || a.spatial_rank > FDNN_MAX_SPATIAL_DIMS)
    fail(FDNN_ERROR_INVALID_ARGUMENT, "spatial_rank %d is not 1, 2 or 3",
         static_cast<int>(a.spatial_rank));
  if (a.activation < 0 || a.activation >= FDNN_NUM_ACTIVATIONS)
    fail(FDNN_ERROR_INVALID_ARGUMENT,
         "activation %d is not an FDNN_ACTIVATION_* value (0 none to %d silu)",
         static_cast<int>(a.activation), FDNN_NUM_ACTIVATIONS - 1);
  if (a.algo_policy < FDNN_ALGO_HEURISTIC || a.algo_policy > FDNN_ALGO_GIVEN)
    fail(FDNN_ERROR_INVALID_ARGUMENT,
         "algo_policy %d is not an FDNN_ALGO_* value (0 heuristic, 1 benchmark, 2 given)",
         static_cast<int>(a.algo_policy));
}

// One descriptor: present, of `ndim` dims (or, with `optional`, ndim 0), shape and strides
// given, no empty dim, on the shim's device type, data aligned to its element size.
void check_tensor(const FDNN_DLTensor* t, const char* name, int ndim, int32_t device_type,
                  bool optional = false) {
  if (t == nullptr)
    fail(FDNN_ERROR_INVALID_ARGUMENT, "%s is NULL: every descriptor is required%s", name,
         optional ? " (ndim 0 describes no bias)" : "");
  if (optional && t->ndim == 0) return;
  if (t->ndim != ndim)
    fail(FDNN_ERROR_INVALID_ARGUMENT, "%s has ndim %d, not %d (spatial_rank + 2%s)", name,
         static_cast<int>(t->ndim), ndim, optional ? ", or 0 for none" : "");
  if (t->shape == nullptr || t->strides == nullptr)
    fail(FDNN_ERROR_INVALID_ARGUMENT, "%s has ndim %d and a NULL %s", name, ndim,
         t->shape == nullptr ? "shape" : "strides");
  for (int i = 0; i < ndim; ++i)
    if (t->shape[i] < 1)
      fail(FDNN_ERROR_INVALID_ARGUMENT, "%s has shape[%d] = %lld; every dim must be >= 1", name,
           i, static_cast<long long>(t->shape[i]));
  if (t->device.device_type != device_type)
    fail(FDNN_ERROR_INVALID_ARGUMENT, "%s is on DLPack device type %d; this shim serves %d",
         name, static_cast<int>(t->device.device_type), static_cast<int>(device_type));
  const uintptr_t first = reinterpret_cast<uintptr_t>(t->data) + t->byte_offset;
  if (t->data != nullptr && first % element_bytes(t->dtype) != 0)
    fail(FDNN_ERROR_INVALID_ARGUMENT,
         "%s: data + byte_offset = %#llx is not aligned to its element size (%zu bytes)", name,
         static_cast<unsigned long long>(first), element_bytes(t->dtype));
}

// Stride, dilation and padding of each spatial dim, before anything divides by a stride.
void check_spatial_params(const FDNN_Conv_Plan_Create_Args& a) {
  for (int i = 0; i < a.spatial_rank; ++i) {
    const struct {
      const char* name;
      int64_t value, least;
    } params[] = {{"stride", a.stride[i], 1},
                  {"dilation", a.dilation[i], 1},
                  {"padding_lo", a.padding_lo[i], 0},
                  {"padding_hi", a.padding_hi[i], 0}};
    for (const auto& p : params)
      if (p.value < p.least)
        fail(FDNN_ERROR_INVALID_ARGUMENT, "%s[%d] is %lld; it must be >= %lld", p.name, i,
             static_cast<long long>(p.value), static_cast<long long>(p.least));
  }
}

// Every descriptor given is on x's device and of x's dtype.
void check_same_device_and_dtype(const FDNN_Conv_Plan_Create_Args& a) {
  const std::pair<const FDNN_DLTensor*, const char*> others[] = {
      {a.w, "w"}, {a.y, "y"}, {a.bias, "bias"}};
  for (const auto& [t, name] : others) {
    if (!has_tensor(t)) continue;
    if (t->device.device_id != a.x->device.device_id)
      fail(FDNN_ERROR_INVALID_ARGUMENT, "%s is on device %d, x on device %d: one device only",
           name, static_cast<int>(t->device.device_id), static_cast<int>(a.x->device.device_id));
    if (!same_dtype(t->dtype, a.x->dtype))
      fail(FDNN_ERROR_INVALID_ARGUMENT, "%s is %s (code %u, bits %u, lanes %u), x is %s: one dtype only",
           name, dtype_name(t->dtype), t->dtype.code, t->dtype.bits, t->dtype.lanes,
           dtype_name(a.x->dtype));
  }
}

void check_geometry(const FDNN_Conv_Plan_Create_Args& a) {
  const int64_t g = a.groups;
  const int64_t N = a.x->shape[0], C = a.x->shape[1], K = a.w->shape[0];
  if (g < 1)
    fail(FDNN_ERROR_INVALID_ARGUMENT, "groups is %lld; it must be >= 1", static_cast<long long>(g));
  if (C % g != 0 || K % g != 0 || a.w->shape[1] * g != C)
    fail(FDNN_ERROR_INVALID_ARGUMENT,
         "channels do not fit groups=%lld: x has C=%lld, w has K=%lld and C/groups=%lld: %s",
         static_cast<long long>(g), static_cast<long long>(C), static_cast<long long>(K),
         static_cast<long long>(a.w->shape[1]), describe_problem(a).c_str());
  if (a.y->shape[0] != N || a.y->shape[1] != K)
    fail(FDNN_ERROR_INVALID_ARGUMENT, "y must be (N, K, ...) = (%lld, %lld, ...): %s",
         static_cast<long long>(N), static_cast<long long>(K), describe_problem(a).c_str());
  for (int i = 0; i < a.spatial_rank; ++i) {
    const int64_t extent = a.dilation[i] * (a.w->shape[2 + i] - 1) + 1;
    const int64_t padded = a.x->shape[2 + i] + a.padding_lo[i] + a.padding_hi[i];
    const int64_t out = padded >= extent ? (padded - extent) / a.stride[i] + 1 : 0;
    if (out != a.y->shape[2 + i])
      fail(FDNN_ERROR_INVALID_ARGUMENT, "spatial dim %d of y is %lld, the convolution gives %lld: %s",
           i, static_cast<long long>(a.y->shape[2 + i]), static_cast<long long>(out),
           describe_problem(a).c_str());
  }
}

void check_bias_and_activation(const FDNN_Conv_Plan_Create_Args& a) {
  const int64_t K = a.w->shape[0];
  if (has_tensor(a.bias)) {
    if (a.op == FDNN_CONV_BACKWARD_DATA)
      fail(FDNN_ERROR_INVALID_ARGUMENT, "backward_data takes no bias (give it ndim 0)");
    if (a.bias->shape[0] != K)
      fail(FDNN_ERROR_INVALID_ARGUMENT, "bias has shape (%lld,); it must be (K,) = (%lld,)",
           static_cast<long long>(a.bias->shape[0]), static_cast<long long>(K));
  }
  if (a.activation != FDNN_ACTIVATION_NONE && a.op != FDNN_CONV_FORWARD)
    fail(FDNN_ERROR_INVALID_ARGUMENT, "activation %d (%s) with op %s: an activation is fused into forward only",
         static_cast<int>(a.activation), activation_name(a.activation), op_name(a.op));
}

}  // namespace

void check_conv_problem(const FDNN_Conv_Plan_Create_Args& a, int32_t device_type) {
  check_enums(a);
  const int ndim = a.spatial_rank + 2;
  check_tensor(a.x, "x", ndim, device_type);
  check_tensor(a.w, "w", ndim, device_type);
  check_tensor(a.y, "y", ndim, device_type);
  check_tensor(a.bias, "bias", 1, device_type, /*optional=*/true);
  check_same_device_and_dtype(a);
  check_spatial_params(a);
  check_geometry(a);
  check_bias_and_activation(a);
}

namespace {

std::string ranks_text(uint32_t ranks) {
  std::string text;
  for (int r = 1; r <= FDNN_MAX_SPATIAL_DIMS; ++r)
    if (ranks & (1u << r)) text += (text.empty() ? "" : ", ") + std::to_string(r);
  return text.empty() ? "none" : text;
}

bool any_dim(const FDNN_Conv_Plan_Create_Args& a, const int64_t* v, int64_t plain) {
  for (int i = 0; i < a.spatial_rank; ++i)
    if (v[i] != plain) return true;
  return false;
}

}  // namespace

void check_covered(const FDNN_Conv_Plan_Create_Args& a, const Capabilities& caps,
                   const char* shim) {
  const char* dtype = dtype_name(a.x->dtype);
  const char* op = op_name(a.op);
  if (caps.support == FDNN_SUPPORT_NONE)
    fail(FDNN_ERROR_UNSUPPORTED, "%s does not compute %s %s convolutions here: %s", shim, dtype,
         op, caps.detail);
  if (!(caps.spatial_ranks & (1u << a.spatial_rank)))
    fail(FDNN_ERROR_UNSUPPORTED, "%s serves spatial ranks %s for %s %s, not %d", shim,
         ranks_text(caps.spatial_ranks).c_str(), dtype, op, static_cast<int>(a.spatial_rank));
  if (!(caps.activations & (1u << a.activation)))
    fail(FDNN_ERROR_UNSUPPORTED, "%s does not fuse activation %d (%s) into %s %s", shim,
         static_cast<int>(a.activation), activation_name(a.activation), dtype, op);
  struct Need {
    bool asked;
    uint32_t feature;
    const char* what;
  };
  const Need needs[] = {
      {a.groups > 1, FDNN_FEATURE_GROUPS, "groups > 1"},
      {any_dim(a, a.dilation, 1), FDNN_FEATURE_DILATION, "dilation > 1"},
      {a.alpha != 1.f || a.beta != 0.f, FDNN_FEATURE_ALPHA_BETA, "alpha != 1 or beta != 0"},
      {a.op == FDNN_CONV_BACKWARD_WEIGHT && has_tensor(a.bias), FDNN_FEATURE_BIAS_GRADIENT,
       "a bias gradient"},
      {(a.flags & FDNN_CONV_DETERMINISTIC) != 0, FDNN_FEATURE_DETERMINISTIC,
       "deterministic results (FDNN_CONV_DETERMINISTIC)"},
  };
  for (const Need& n : needs)
    if (n.asked && !(caps.features & n.feature))
      fail(FDNN_ERROR_UNSUPPORTED, "%s does not serve %s for %s %s", shim, n.what, dtype, op);
}

void check_aligned(const void* p, size_t element_size, const char* function, const char* name) {
  if (reinterpret_cast<uintptr_t>(p) % element_size != 0)
    fail(FDNN_ERROR_INVALID_ARGUMENT, "%s: %s at %p is not aligned to its element size (%zu bytes)",
         function, name, p, element_size);
}

void check_execute_alignment(const FDNN_Conv_Plan_Execute_Args& a, size_t element_size) {
  const std::pair<const void*, const char*> pointers[] = {
      {a.x, "x"}, {a.w, "w"}, {a.y, "y"}, {a.bias, "bias"}};
  for (const auto& [p, name] : pointers) check_aligned(p, element_size, "Conv_Plan_Execute", name);
}

std::string describe_problem(const FDNN_Conv_Plan_Create_Args& a) {
  std::ostringstream os;
  os << "conv" << a.spatial_rank << "d " << op_name(a.op);
  put_tensor(os, "x", a.x);
  put_tensor(os, "w", a.w);
  put_tensor(os, "y", a.y);
  put_tensor(os, "bias", a.bias);
  const int n = a.spatial_rank >= 1 && a.spatial_rank <= FDNN_MAX_SPATIAL_DIMS ? a.spatial_rank : 0;
  put_dims(os, "stride", a.stride, n);
  put_dims(os, "dilation", a.dilation, n);
  put_dims(os, "padding_lo", a.padding_lo, n);
  put_dims(os, "padding_hi", a.padding_hi, n);
  os << " groups=" << a.groups;
  return os.str();
}

const FDNN_Extension_Base* find_extension(const FDNN_Extension_Base* chain, int32_t type,
                                          size_t known_size, const char* function) {
  constexpr int kMaxLinks = 64;
  int links = 0;
  for (const FDNN_Extension_Base* e = chain; e != nullptr; e = e->next) {
    if (++links > kMaxLinks)
      fail(FDNN_ERROR_INVALID_ARGUMENT, "%s: extension chain longer than %d links (a loop?)",
           function, kMaxLinks);
    if (e->type != type) continue;
    if (e->struct_size < known_size)
      fail(FDNN_ERROR_INVALID_ARGUMENT,
           "%s: extension type %d has struct_size %zu, smaller than the %zu this shim knows",
           function, static_cast<int>(type), e->struct_size, known_size);
    return e;
  }
  return nullptr;
}

}  // namespace fdnn_shim
