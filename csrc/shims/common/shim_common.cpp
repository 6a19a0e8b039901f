#include "shim_common.hpp"

#if !defined(_WIN32)
#include <pthread.h>
#endif

#include <algorithm>
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

int overlapping_dim(const FDNN_DLTensor& t) {
  int order[FDNN_MAX_SPATIAL_DIMS + 2];
  int n = 0;
  for (int i = 0; i < t.ndim && i < FDNN_MAX_SPATIAL_DIMS + 2; ++i) {  // insertion by stride
    if (t.shape[i] == 1) continue;
    int k = n++;
    for (; k > 0 && t.strides[order[k - 1]] > t.strides[i]; --k) order[k] = order[k - 1];
    order[k] = i;
  }
  int64_t reach = 1;  // elements spanned by the dims sorted so far (fits: tensor_extent)
  for (int k = 0; k < n; ++k) {
    const int i = order[k];
    if (t.strides[i] < reach) return i;
    reach = t.strides[i] * (t.shape[i] - 1) + reach;
  }
  return -1;
}

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

// A dtype as the header allows it: lanes 1, bits whole bytes (what an element size needs).
void check_dtype_form(FDNN_DLDataType t, const char* name) {
  if (t.lanes != 1)
    fail(FDNN_ERROR_INVALID_ARGUMENT, "%s has lanes %u; the header allows lanes 1 only", name,
         static_cast<unsigned>(t.lanes));
  if (t.bits == 0 || t.bits % 8 != 0)
    fail(FDNN_ERROR_INVALID_ARGUMENT, "%s has bits %u; it must be a positive multiple of 8", name,
         static_cast<unsigned>(t.bits));
}

// One descriptor: present, of `ndim` dims (or, with `optional`, ndim 0), shape and strides
// given, no empty dim, strides >= 0, on the shim's device type and a device id in range, of
// a dtype of the header's form, data aligned to its element size, and an extent that fits
// int64 (and, from its data pointer, the address space).
void check_tensor(const FDNN_DLTensor* t, const char* name, int ndim, int32_t device_type,
                  int32_t num_devices, bool optional = false) {
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
  for (int i = 0; i < ndim; ++i) {
    if (t->shape[i] < 1)
      fail(FDNN_ERROR_INVALID_ARGUMENT, "%s has shape[%d] = %lld; every dim must be >= 1", name,
           i, static_cast<long long>(t->shape[i]));
    if (t->strides[i] < 0)
      fail(FDNN_ERROR_INVALID_ARGUMENT, "%s has strides[%d] = %lld; strides must be >= 0", name,
           i, static_cast<long long>(t->strides[i]));
  }
  if (t->device.device_type != device_type)
    fail(FDNN_ERROR_INVALID_ARGUMENT, "%s is on DLPack device type %d; this shim serves %d",
         name, static_cast<int>(t->device.device_type), static_cast<int>(device_type));
  if (t->device.device_id < 0 || (num_devices >= 0 && t->device.device_id >= num_devices))
    fail(FDNN_ERROR_INVALID_ARGUMENT, "%s is on device_id %d; this shim has devices 0 to %d",
         name, static_cast<int>(t->device.device_id), static_cast<int>(num_devices - 1));
  check_dtype_form(t->dtype, name);
  // With data NULL (a descriptor at plan time), data + byte_offset is byte_offset itself: the
  // rule holds for it alike, or the plan would be keyed by an alignment no call can have.
  const uint64_t bytes = element_bytes(t->dtype);
  const uintptr_t first = reinterpret_cast<uintptr_t>(t->data) + t->byte_offset;
  if (first % bytes != 0)
    fail(FDNN_ERROR_INVALID_ARGUMENT,
         "%s: data + byte_offset = %#llx (data %s) is not aligned to its element size (%llu "
         "bytes)",
         name, static_cast<unsigned long long>(first), t->data == nullptr ? "NULL" : "given",
         static_cast<unsigned long long>(bytes));
  const Extent e = tensor_extent(*t, name);
  uint64_t end = 0;
  if (t->data != nullptr &&
      (checked_add(reinterpret_cast<uintptr_t>(t->data), t->byte_offset, &end) ||
       checked_add(end, static_cast<uint64_t>(e.span_bytes), &end)))
    fail(FDNN_ERROR_INVALID_ARGUMENT,
         "%s: data + byte_offset + its extent (%lld bytes) passes the end of the address space",
         name, static_cast<long long>(e.span_bytes));
}

// A written tensor writes no element twice (see overlapping_dim).
void check_no_self_overlap(const FDNN_DLTensor* t, const char* name) {
  const int i = overlapping_dim(*t);
  if (i >= 0)
    fail(FDNN_ERROR_INVALID_ARGUMENT,
         "%s is written and strides[%d] = %lld makes its elements overlap (a written tensor "
         "needs strides that step past the dims inside them; zero only on dims of size 1)",
         name, i, static_cast<long long>(t->strides[i]));
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
  if (C % g != 0 || K % g != 0 || C / g != a.w->shape[1])
    fail(FDNN_ERROR_INVALID_ARGUMENT,
         "channels do not fit groups=%lld: x has C=%lld, w has K=%lld and C/groups=%lld: %s",
         static_cast<long long>(g), static_cast<long long>(C), static_cast<long long>(K),
         static_cast<long long>(a.w->shape[1]), describe_problem(a).c_str());
  if (a.y->shape[0] != N || a.y->shape[1] != K)
    fail(FDNN_ERROR_INVALID_ARGUMENT, "y must be (N, K, ...) = (%lld, %lld, ...): %s",
         static_cast<long long>(N), static_cast<long long>(K), describe_problem(a).c_str());
  for (int i = 0; i < a.spatial_rank; ++i) {
    const SpatialDim d = spatial_dim(a, i);
    if (d.output != a.y->shape[2 + i])
      fail(FDNN_ERROR_INVALID_ARGUMENT, "spatial dim %d of y is %lld, the convolution gives %lld: %s",
           i, static_cast<long long>(a.y->shape[2 + i]), static_cast<long long>(d.output),
           describe_problem(a).c_str());
  }
}

// The tensors the op writes: y (forward), x (backward_data), w and the bias gradient
// (backward_weight).
void check_written_tensors(const FDNN_Conv_Plan_Create_Args& a) {
  if (a.op == FDNN_CONV_FORWARD) check_no_self_overlap(a.y, "y");
  if (a.op == FDNN_CONV_BACKWARD_DATA) check_no_self_overlap(a.x, "x");
  if (a.op == FDNN_CONV_BACKWARD_WEIGHT) {
    check_no_self_overlap(a.w, "w");
    if (has_tensor(a.bias)) check_no_self_overlap(a.bias, "bias");
  }
}

void check_compute_type(FDNN_DLDataType t) {
  if (t.code == 0 && t.bits == 0 && t.lanes <= 1) return;  // the vendor default
  check_dtype_form(t, "compute_type");
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
  check_conv_problem(a, device_type, -1);
}

void check_conv_problem(const FDNN_Conv_Plan_Create_Args& a, int32_t device_type,
                        int32_t num_devices) {
  check_enums(a);
  const int ndim = a.spatial_rank + 2;
  check_tensor(a.x, "x", ndim, device_type, num_devices);
  check_tensor(a.w, "w", ndim, device_type, num_devices);
  check_tensor(a.y, "y", ndim, device_type, num_devices);
  check_tensor(a.bias, "bias", 1, device_type, num_devices, /*optional=*/true);
  check_same_device_and_dtype(a);
  check_compute_type(a.compute_type);
  check_spatial_params(a);
  check_geometry(a);
  check_bias_and_activation(a);
  check_written_tensors(a);
}

// Overflow-checked int64 arithmetic: true when the exact result does not fit.
bool checked_mul(int64_t a, int64_t b, int64_t* out) { return __builtin_mul_overflow(a, b, out); }
bool checked_add(int64_t a, int64_t b, int64_t* out) { return __builtin_add_overflow(a, b, out); }
bool checked_add(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_add_overflow(a, b, out); }

Extent tensor_extent(const FDNN_DLTensor& t, const char* name) {
  const int64_t bytes = static_cast<int64_t>(element_bytes(t.dtype));
  Extent e;
  int64_t span = 1;
  bool over = false;
  for (int i = 0; i < t.ndim; ++i) {
    int64_t step = 0;
    over = over || checked_mul(e.elements, t.shape[i], &e.elements) ||
           checked_mul(t.shape[i] - 1, t.strides[i], &step) || checked_add(span, step, &span);
  }
  over = over || checked_mul(span, bytes, &e.span_bytes) ||
         checked_mul(e.elements, bytes, &e.bytes);
  if (over)
    fail(FDNN_ERROR_INVALID_ARGUMENT,
         "%s: its size or extent in bytes (by shape, strides and dtype) exceeds INT64_MAX, the "
         "largest the header allows",
         name);
  e.span = span;
  return e;
}

SpatialDim spatial_dim(const FDNN_Conv_Plan_Create_Args& a, int i) {
  SpatialDim d;
  const int64_t x = a.x->shape[2 + i], k = a.w->shape[2 + i];
  if (checked_mul(a.dilation[i], k - 1, &d.kernel_extent) ||
      checked_add(d.kernel_extent, int64_t{1}, &d.kernel_extent) ||
      checked_add(x, a.padding_lo[i], &d.padded) || checked_add(d.padded, a.padding_hi[i], &d.padded))
    fail(FDNN_ERROR_INVALID_ARGUMENT,
         "spatial dim %d: x + padding_lo + padding_hi (%lld + %lld + %lld) or dilation * (kernel - "
         "1) + 1 (%lld, %lld) exceeds INT64_MAX, the largest the header allows",
         i, static_cast<long long>(x), static_cast<long long>(a.padding_lo[i]),
         static_cast<long long>(a.padding_hi[i]), static_cast<long long>(a.dilation[i]),
         static_cast<long long>(k));
  d.output = d.padded >= d.kernel_extent ? (d.padded - d.kernel_extent) / a.stride[i] + 1 : 0;
  return d;
}

void check_vendor_int_range(const FDNN_Conv_Plan_Create_Args& a, int64_t most,
                            const char* shim) {
  const std::pair<const FDNN_DLTensor*, const char*> tensors[] = {
      {a.x, "x"}, {a.w, "w"}, {a.y, "y"}, {a.bias, "bias"}};
  for (const auto& [t, name] : tensors) {
    if (!has_tensor(t)) continue;
    const Extent e = tensor_extent(*t, name);
    if (e.elements > most || e.span > most)
      fail(FDNN_ERROR_UNSUPPORTED,
           "%s: %s has %lld elements over a span of %lld; %s indexes at most %lld: %s", shim,
           name, static_cast<long long>(e.elements), static_cast<long long>(e.span), shim,
           static_cast<long long>(most), describe_problem(a).c_str());
  }
  for (int i = 0; i < a.spatial_rank; ++i) {
    const SpatialDim d = spatial_dim(a, i);
    const int64_t values[] = {a.stride[i], a.dilation[i], a.padding_lo[i], a.padding_hi[i],
                              d.padded, d.kernel_extent};
    for (int64_t v : values)
      if (v > most)
        fail(FDNN_ERROR_UNSUPPORTED,
             "%s: spatial dim %d has a stride, dilation, padding or padded size of %lld; %s "
             "indexes at most %lld: %s",
             shim, i, static_cast<long long>(v), shim, static_cast<long long>(most),
             describe_problem(a).c_str());
  }
  if (a.groups > most)
    fail(FDNN_ERROR_UNSUPPORTED, "%s: groups %lld; %s indexes at most %lld", shim,
         static_cast<long long>(a.groups), shim, static_cast<long long>(most));
}

size_t span_bytes(const FDNN_DLTensor* t) {
  return has_tensor(t) ? static_cast<size_t>(tensor_extent(*t, "tensor").span_bytes) : 0;
}

bool benchmark_fits(const FDNN_Conv_Plan_Create_Args& a, size_t workspace) {
  uint64_t total = workspace;
  for (const FDNN_DLTensor* t : {a.x, a.w, a.y, a.bias})
    if (checked_add(total, static_cast<uint64_t>(span_bytes(t)), &total)) return false;
  return total <= static_cast<uint64_t>(kMostBenchmarkBytes);
}

void check_workspace_within_limit(size_t workspace_size, const FDNN_Conv_Plan_Create_Args& a,
                                  const char* shim) {
  if (workspace_size > a.workspace_limit)
    fail(FDNN_ERROR_UNSUPPORTED,
         "%s needs %zu bytes of workspace, more than workspace_limit %zu: %s", shim,
         workspace_size, a.workspace_limit, describe_problem(a).c_str());
}

void check_execute_args(const FDNN_Conv_Plan_Execute_Args& a, size_t element_size,
                        size_t workspace_needed, NeededPointers needed) {
  const struct {
    bool needed;
    const void* pointer;
    const char* name;
  } data[] = {{needed.x, a.x, "x"}, {needed.w, a.w, "w"}, {needed.y, a.y, "y"},
              {needed.bias, a.bias, "bias"}};
  for (const auto& d : data)
    if (d.needed && d.pointer == nullptr)
      fail(FDNN_ERROR_INVALID_ARGUMENT, "Conv_Plan_Execute: %s is NULL, and the plan needs it",
           d.name);
  check_execute_alignment(a, element_size);
  if (a.workspace_size < workspace_needed)
    fail(FDNN_ERROR_INVALID_ARGUMENT,
         "Conv_Plan_Execute: workspace_size %zu is smaller than the plan's %zu", a.workspace_size,
         workspace_needed);
  if (workspace_needed > 0 && a.workspace == nullptr)
    fail(FDNN_ERROR_INVALID_ARGUMENT,
         "Conv_Plan_Execute: workspace is NULL; the plan needs %zu bytes", workspace_needed);
  // The header's 64 bytes: staging buffers at 64-byte offsets in it and the vendors'
  // scratchpads take aligned vector loads and stores there. A plan that needs none ignores it.
  if (workspace_needed > 0 && reinterpret_cast<uintptr_t>(a.workspace) % kWorkspaceAlignment != 0)
    fail(FDNN_ERROR_INVALID_ARGUMENT,
         "Conv_Plan_Execute: workspace at %p is not %zu-byte aligned, as the header asks", a.workspace,
         kWorkspaceAlignment);
}

void check_pack_args(const FDNN_Conv_Plan_Pack_Weights_Args& a, int32_t op, size_t element_size) {
  if (op != FDNN_CONV_FORWARD)
    fail(FDNN_ERROR_INVALID_ARGUMENT,
         "Conv_Plan_Pack_Weights: the plan is %s; only a forward plan packs its weights",
         op_name(op));
  if (a.w == nullptr) fail(FDNN_ERROR_INVALID_ARGUMENT, "Conv_Plan_Pack_Weights: w is NULL");
  check_aligned(a.w, element_size, "Conv_Plan_Pack_Weights", "w");
}

void check_compute_type_served(const FDNN_Conv_Plan_Create_Args& a, const char* shim) {
  const FDNN_DLDataType c = a.compute_type;
  if (c.code == 0 && c.bits == 0) return;  // the vendor default (form: check_conv_problem)
  const bool wide64 = a.x->dtype.code == FDNN_DTYPE_FLOAT && a.x->dtype.bits == 64;
  if (c.code == FDNN_DTYPE_FLOAT && c.bits == (wide64 ? 64 : 32)) return;
  fail(FDNN_ERROR_UNSUPPORTED, "%s accumulates %s in %s only, not in %s (compute_type)", shim,
       dtype_name(a.x->dtype), wide64 ? "float64" : "float32", dtype_name(c));
}

void fail_unknown_algo(const FDNN_Conv_Plan_Create_Args& a, const char* shim, const char* why) {
  fail(FDNN_ERROR_INVALID_ARGUMENT,
       "%s: algo_id %lld names none of its algorithms (FDNN_ALGO_GIVEN takes an id the shim "
       "returned): %s; %s",
       shim, static_cast<long long>(a.algo_id), why, describe_problem(a).c_str());
}

void fail_algo_cannot_compute(const FDNN_Conv_Plan_Create_Args& a, const char* shim,
                              const char* why) {
  fail(FDNN_ERROR_UNSUPPORTED, "%s: algorithm %lld cannot compute this problem here: %s; %s",
       shim, static_cast<long long>(a.algo_id), why, describe_problem(a).c_str());
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
