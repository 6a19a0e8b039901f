#include "mps_problem.hpp"

#include <algorithm>
#include <map>
#include <mutex>
#include <numeric>
#include <sstream>

namespace fdnn_mps {

using fdnn_shim::Capabilities;
using fdnn_shim::fail;

namespace {

bool is_float(FDNN_DLDataType t, int bits) {
  return t.code == FDNN_DTYPE_FLOAT && t.bits == bits && t.lanes == 1;
}
bool is_bfloat16(FDNN_DLDataType t) {
  return t.code == FDNN_DTYPE_BFLOAT && t.bits == 16 && t.lanes == 1;
}

constexpr uint32_t kFeatures = FDNN_FEATURE_GROUPS | FDNN_FEATURE_DILATION |
                               FDNN_FEATURE_ALPHA_BETA | FDNN_FEATURE_BIAS_GRADIENT |
                               FDNN_FEATURE_ASYMMETRIC_PADDING;

// What this OS does and refuses, in words, for a dtype's capabilities detail. Made once per
// (OS version, dtype) and kept for the life of the process: the ABI wants static storage.
const char* detail_text(OsVersion os, const char* kernels) {
  static std::mutex mutex;
  static std::map<std::string, std::string> texts;  // node-based: c_str() stays put
  std::ostringstream key;
  key << os.major << "." << os.minor << " " << kernels;
  std::lock_guard<std::mutex> lock(mutex);
  std::string& text = texts[key.str()];
  if (text.empty()) {
    std::ostringstream t;
    t << kernels << "; channels-last "
      << (has_native_nhwc(os) ? "natively (NHWC)" : "through transposes in the graph (NHWC natively from macOS 15)")
      << "; 3-D " << (has_conv3d(os) ? "served" : "from macOS 13.2")
      << "; refused: 2-D forward filter dims >= 256, tensors beyond int32 element counts, "
         "ranges bound through an MPSNDArray beyond 4 GiB"
      << (has_large_outputs(os) ? "" : ", dims > 65536 of y (forward) or dy (backward data) before macOS 15.1")
      << " (macOS " << os.major
      << "." << os.minor << ")";
    text = t.str();
  }
  return text.c_str();
}

Capabilities served(OsVersion os, int32_t op, const char* kernels) {
  Capabilities c;
  c.support = FDNN_SUPPORT_NATIVE;
  c.spatial_ranks = (1u << 1) | (1u << 2) | (has_conv3d(os) ? 1u << 3 : 0u);
  c.activations = fdnn_shim::activations_of_op(op, fdnn_shim::kEveryActivation);
  // No feature bit for what MPSGraph does not promise: it documents no deterministic mode,
  // offers no algorithm choice to benchmark and keeps no packed weights.
  c.features = kFeatures;
  c.detail = detail_text(os, kernels);
  return c;
}

}  // namespace

const char* os_unavailable_reason(OsVersion os) {
  if (!has_graph_executables(os))
    return "the MPS shim needs macOS 13 or later (MPSGraph executables with transposes by "
           "permutation)";
  return nullptr;
}

Capabilities capabilities(OsVersion os, int32_t op, FDNN_DLDataType dtype) {
  if (os_unavailable_reason(os) != nullptr)
    return fdnn_shim::not_computed("the MPS shim needs macOS 13 or later");
  if (is_float(dtype, 32)) return served(os, op, "float32 kernels");
  if (is_float(dtype, 16))
    return served(os, op, "float16 kernels (compute_type float32: cast to float32 in the graph)");
  if (is_bfloat16(dtype)) {
    if (!has_bfloat16(os))
      return fdnn_shim::not_computed("MPSGraph has bfloat16 from macOS 14 on (MPSDataTypeBFloat16)");
    return served(os, op, "bfloat16 kernels (compute_type float32: cast to float32 in the graph)");
  }
  if (is_float(dtype, 64)) return fdnn_shim::not_computed("Metal has no float64 arithmetic");
  return fdnn_shim::not_computed("MPSGraph convolution computes float32, float16 and bfloat16 only");
}

// ------------------------------------------------------------------------------------------
// Tensors

std::vector<int64_t> TensorPlan::memory_shape() const {
  std::vector<int64_t> s;
  for (int d : memory_order) s.push_back(shape[d]);
  return s;
}

std::vector<int> TensorPlan::memory_to_logical() const {
  // Logical dim d sits at position p of the memory-order tensor where memory_order[p] == d.
  std::vector<int> perm(memory_order.size());
  for (size_t p = 0; p < memory_order.size(); ++p) perm[memory_order[p]] = static_cast<int>(p);
  return perm;
}

bool TensorPlan::is_identity_order() const {
  for (size_t i = 0; i < memory_order.size(); ++i)
    if (memory_order[i] != static_cast<int>(i)) return false;
  return true;
}

namespace {

// Shape and strides of one descriptor, with a unit dim inserted before the last one when a
// 1-D problem runs as 2-D (its stride makes it the outer neighbour of the width: size-1
// dims take no part in the layout anyway).
struct Dims {
  std::vector<int64_t> shape, strides;
};

Dims dims_of(const FDNN_DLTensor* t, bool widen_1d) {
  Dims d;
  d.shape.assign(t->shape, t->shape + t->ndim);
  d.strides.assign(t->strides, t->strides + t->ndim);
  if (widen_1d) {
    const size_t w = d.shape.size() - 1;
    d.shape.insert(d.shape.begin() + w, 1);
    d.strides.insert(d.strides.begin() + w, d.strides[w] * d.shape[w + 1]);
  }
  return d;
}

TensorPlan describe(const char* name, const Dims& d, bool is_output) {
  TensorPlan t;
  t.present = true;
  t.shape = d.shape;
  const int n = static_cast<int>(d.shape.size());
  t.count = 1;
  t.span = 1;
  for (int i = 0; i < n; ++i) {
    if (d.strides[i] < 0)
      fail(FDNN_ERROR_UNSUPPORTED, "MPS shim: %s has a negative stride (%lld in dim %d)", name,
           static_cast<long long>(d.strides[i]), i);
    if (is_output && d.shape[i] > 1 && d.strides[i] == 0)
      fail(FDNN_ERROR_UNSUPPORTED, "MPS shim: %s has stride 0 in dim %d: an output whose "
           "elements alias cannot be written", name, i);
    t.count *= d.shape[i];
    t.span += (d.shape[i] - 1) * d.strides[i];
  }
  if (t.count > kMaxElements || t.span > kMaxElements)
    fail(FDNN_ERROR_UNSUPPORTED,
         "MPS shim: %s spans %lld elements (%lld in the tensor); MPSGraph indexes with int32 "
         "(at most %lld)", name, static_cast<long long>(t.span), static_cast<long long>(t.count),
         static_cast<long long>(kMaxElements));
  // Memory order: dims of size > 1 by stride, largest first, ties in logical order; dims of
  // size 1 where they are logically (they can sit anywhere).
  t.memory_order.resize(n);
  std::iota(t.memory_order.begin(), t.memory_order.end(), 0);
  std::vector<int> big;
  for (int i = 0; i < n; ++i)
    if (d.shape[i] > 1) big.push_back(i);
  std::stable_sort(big.begin(), big.end(),
                   [&](int a, int b) { return d.strides[a] > d.strides[b]; });
  size_t next = 0;
  for (int i = 0; i < n; ++i)
    if (d.shape[i] > 1) t.memory_order[i] = big[next++];
  // (positions of size-1 dims keep their own index; the big dims fill the rest in order)
  int64_t expected = 1;
  for (int p = n - 1; p >= 0; --p) {
    const int dim = t.memory_order[p];
    if (d.shape[dim] == 1) continue;
    if (d.strides[dim] != expected) t.dense = false;
    expected *= d.shape[dim];
  }
  if (!t.dense) {
    t.gather_index.resize(static_cast<size_t>(t.count));
    std::vector<int64_t> index(n, 0);
    for (int64_t e = 0; e < t.count; ++e) {
      int64_t offset = 0;
      for (int i = 0; i < n; ++i) offset += index[i] * d.strides[i];
      t.gather_index[static_cast<size_t>(e)] = static_cast<int32_t>(offset);
      for (int i = n - 1; i >= 0; --i) {
        if (++index[i] < d.shape[i]) break;
        index[i] = 0;
      }
    }
  }
  return t;
}

GraphDtype graph_dtype(FDNN_DLDataType t) {
  if (is_float(t, 16)) return GraphDtype::kFloat16;
  if (is_bfloat16(t)) return GraphDtype::kBFloat16;
  return GraphDtype::kFloat32;
}

bool wants_float32_compute(const FDNN_Conv_Plan_Create_Args& a) {
  const FDNN_DLDataType c = a.compute_type;
  if (c.code == 0 && c.bits == 0) return false;  // the vendor default
  if (c.code == a.x->dtype.code && c.bits == a.x->dtype.bits) return false;
  if (c.code == FDNN_DTYPE_FLOAT && c.bits == 32) return true;
  fail(FDNN_ERROR_UNSUPPORTED,
       "MPS shim: compute_type (code %d, %d bits) is not served: float32, or the input's own "
       "type (%s)", static_cast<int>(c.code), static_cast<int>(c.bits),
       fdnn_shim::dtype_name(a.x->dtype));
}

// The tensor PyTorch's pre-15.1 guard checks (Convolution.mm): y on forward, dy on backward
// data (what that op reads); none on backward weight, where PyTorch checks nothing.
const FDNN_DLTensor* guarded_desc(const FDNN_Conv_Plan_Create_Args& a) {
  return a.op == FDNN_CONV_FORWARD ? a.y : a.op == FDNN_CONV_BACKWARD_DATA ? a.y : nullptr;
}

// 2-D (and 1-D, which runs as 2-D) forward only: the case PyTorch takes away from MPSGraph.
void check_filter_dims(const FDNN_Conv_Plan_Create_Args& a) {
  if (a.op != FDNN_CONV_FORWARD || a.spatial_rank == 3) return;
  for (int i = 2; i < a.w->ndim; ++i)
    if (a.w->shape[i] > kMaxFilterDim2dForward)
      fail(FDNN_ERROR_UNSUPPORTED,
           "MPS shim: filter dim %d is %lld; MPSGraph's 2-D forward convolution miscomputes "
           "filter dims of 256 or more (its backward ops and 3-D are served)",
           i - 2, static_cast<long long>(a.w->shape[i]));
}

void check_known_limits(const FDNN_Conv_Plan_Create_Args& a, OsVersion os) {
  check_filter_dims(a);
  const FDNN_DLTensor* guarded = guarded_desc(a);
  if (has_large_outputs(os) || guarded == nullptr) return;
  for (int i = 0; i < guarded->ndim; ++i)
    if (guarded->shape[i] > kMaxOutputDimBefore15_1)
      fail(FDNN_ERROR_UNSUPPORTED,
           "MPS shim: dim %d of %s is %lld; before macOS 15.1 MPSGraph convolution mishandles "
           "dims (channels included) above 65536 (this is macOS %d.%d)",
           i, a.op == FDNN_CONV_FORWARD ? "y" : "dy", static_cast<long long>(guarded->shape[i]),
           os.major, os.minor);
}

void fill_geometry(const FDNN_Conv_Plan_Create_Args& a, bool widen_1d, ProblemPlan* p) {
  int g = 0;
  if (widen_1d) ++g;  // the unit height: stride 1, dilation 1, no padding (the defaults)
  for (int i = 0; i < a.spatial_rank; ++i, ++g) {
    p->stride[g] = a.stride[i];
    p->dilation[g] = a.dilation[i];
    p->pad_lo[g] = a.padding_lo[i];
    p->pad_hi[g] = a.padding_hi[i];
  }
}

// NHWC only for a channels-last x on FORWARD (macOS 15+): PyTorch runs the 2-D gradient ops
// in NCHW on every macOS, so the shim does too until a Mac shows NHWC gradients right.
bool uses_native_nhwc(const ProblemPlan& p, OsVersion os) {
  return p.op == FDNN_CONV_FORWARD && p.graph_rank == 2 && has_native_nhwc(os) && is_channels_last(p.x);
}

// Written tensors that the graph also reads are always staged: refused now when too large.
void check_always_staged(const ProblemPlan& p) {
  if (p.reads_old(p.written()))
    check_ndarray_size("the written tensor", p.written(), p.element_size, Binding::kStaged);
  if (p.writes_bias_gradient() && p.reads_old(p.bias))
    check_ndarray_size("the bias gradient", p.bias, p.element_size, Binding::kStaged);
}

std::string plan_name(const ProblemPlan& p) {
  std::ostringstream os;
  os << "mpsgraph_conv" << p.graph_rank << "d";
  if (p.data_layout == GraphLayout::kNHWC) os << "_nhwc";
  if (p.compute_in_float32) os << "_f32compute";
  return os.str();
}

}  // namespace

bool is_channels_last(const TensorPlan& t) {
  const int n = static_cast<int>(t.shape.size());
  if (n < 3) return false;
  // Compare the dims of size > 1 in memory order with N, *spatial, C.
  std::vector<int> want{0};
  for (int i = 2; i < n; ++i) want.push_back(i);
  want.push_back(1);
  std::vector<int> have, expect;
  for (int d : t.memory_order)
    if (t.shape[d] > 1) have.push_back(d);
  for (int d : want)
    if (t.shape[d] > 1) expect.push_back(d);
  // With C == 1 (or everything but one dim of size 1) both layouts are the same bytes.
  const bool channels_matter = t.shape[1] > 1 && expect.size() > 1;
  return t.dense && channels_matter && have == expect;
}

const TensorPlan& ProblemPlan::written() const {
  return op == FDNN_CONV_FORWARD ? y : op == FDNN_CONV_BACKWARD_DATA ? x : w;
}

ProblemPlan plan_problem(const FDNN_Conv_Plan_Create_Args& a, OsVersion os) {
  fdnn_shim::check_covered(a, capabilities(os, a.op, a.x->dtype), "the MPS shim");
  check_known_limits(a, os);
  ProblemPlan p;
  p.op = a.op;
  p.dtype = graph_dtype(a.x->dtype);
  p.element_size = fdnn_shim::element_bytes(a.x->dtype);
  p.compute_in_float32 = conv_in_float32(a);
  const bool widen_1d = a.spatial_rank == 1;
  p.graph_rank = a.spatial_rank == 3 ? 3 : 2;
  p.x = describe("x", dims_of(a.x, widen_1d), a.op == FDNN_CONV_BACKWARD_DATA);
  p.w = describe("w", dims_of(a.w, widen_1d), a.op == FDNN_CONV_BACKWARD_WEIGHT);
  p.y = describe("y", dims_of(a.y, widen_1d), a.op == FDNN_CONV_FORWARD);
  if (fdnn_shim::has_tensor(a.bias))
    p.bias = describe("bias", dims_of(a.bias, false), a.op == FDNN_CONV_BACKWARD_WEIGHT);
  fill_geometry(a, widen_1d, &p);
  p.groups = a.groups;
  p.alpha = a.alpha;
  p.beta = a.beta;
  p.activation = a.activation;
  p.activation_alpha = a.activation_alpha;
  p.activation_beta = a.activation_beta;
  p.data_layout = p.graph_rank == 3        ? GraphLayout::kNCDHW
                  : uses_native_nhwc(p, os) ? GraphLayout::kNHWC
                                            : GraphLayout::kNCHW;
  p.weights_layout = p.graph_rank == 3 ? GraphLayout::kOIDHW : GraphLayout::kOIHW;
  check_always_staged(p);
  p.name = plan_name(p);
  return p;
}

bool conv_in_float32(const FDNN_Conv_Plan_Create_Args& a) {
  if (wants_float32_compute(a)) return true;
  if (fdnn_shim::element_bytes(a.x->dtype) != 2) return false;
  const bool forward_epilogue =
      a.op == FDNN_CONV_FORWARD && (fdnn_shim::has_tensor(a.bias) || a.activation != FDNN_ACTIVATION_NONE);
  return forward_epilogue || a.alpha != 1.f || a.beta != 0.f;
}

Binding binding_for(uint64_t byte_offset, bool is_weight, OsVersion os) {
  if (byte_offset == 0) return Binding::kDirect;
  if (!is_weight && has_ndarray_views(os)) return Binding::kView;
  return Binding::kStaged;
}

Binding output_binding(const ProblemPlan& p, const TensorPlan& out, uint64_t byte_offset, OsVersion os) {
  if (p.reads_old(out)) return Binding::kStaged;
  return binding_for(byte_offset, &out == &p.w, os);
}

void check_ndarray_size(const char* name, const TensorPlan& t, size_t element_size, Binding binding) {
  const uint64_t bytes = span_bytes(t, element_size);
  if (binding == Binding::kDirect || bytes <= kMaxNDArrayBytes) return;
  fail(FDNN_ERROR_UNSUPPORTED,
       "MPS shim: %s spans %llu bytes (%.2f GiB) and would be %s through an MPSNDArray; MPS "
       "aborts on MPSNDArrays over 4 GiB (2^32 bytes)",
       name, static_cast<unsigned long long>(bytes), static_cast<double>(bytes) / (1u << 30),
       binding == Binding::kView ? "viewed" : "staged");
}

DeviceChoice choose_device(const std::vector<DeviceTraits>& devices) {
  DeviceChoice choice;
  std::ostringstream skipped;
  for (size_t i = 0; i < devices.size(); ++i) {
    const DeviceTraits& d = devices[i];
    const char* why = d.low_power                                         ? "low power"
                      : !d.supports_mac2                                  ? "no MTLGPUFamilyMac2"
                      : d.name.find("Paravirtual") != std::string::npos ? "a virtual machine's GPU"
                                                                          : nullptr;
    if (why == nullptr) {
      choice.index = static_cast<int>(i);
      return choice;
    }
    skipped << (skipped.tellp() > 0 ? "; " : "") << d.name << ": " << why;
  }
  choice.reason = devices.empty() ? "no Metal device (MTLCopyAllDevices returned none)"
                                  : "no Metal device MPS supports (" + skipped.str() + ")";
  return choice;
}

size_t max_staging_bytes(const ProblemPlan& p, OsVersion os) {
  const size_t es = p.element_size;
  size_t total = 0;
  const TensorPlan* inputs[] = {&p.x, &p.w, &p.y, &p.bias};
  const TensorPlan& out = p.written();
  for (const TensorPlan* t : inputs) {
    if (!t->present) continue;
    const bool is_written = t == &out || (p.writes_bias_gradient() && t == &p.bias);
    const bool read = !is_written || p.reads_old(*t);
    const bool is_weight = t == &p.w;
    if (read && (is_weight || !has_ndarray_views(os))) total += span_bytes(*t, es);
    if (is_written) total += span_bytes(*t, es);  // the result, staged at worst
  }
  return total;
}

}  // namespace fdnn_mps
