#include "problem.hpp"

#include <algorithm>

namespace fdnn_cudnn {
namespace {

using fdnn_shim::fail;
using fdnn_shim::has_tensor;

[[noreturn]] void bad(const char* fmt, const std::string& what) {
  fail(FDNN_ERROR_INVALID_ARGUMENT, fmt, what.c_str());
}

void read_dtype(const FDNN_DLDataType& t, ConvProblem* p) {
  p->abi_dtype = t;
  if (t.lanes != 1) fail(FDNN_ERROR_UNSUPPORTED, "cudnn: vector dtypes (lanes %u)", t.lanes);
  if (t.code == FDNN_DTYPE_FLOAT && t.bits == 16) {
    p->dtype = CUDNN_DATA_HALF;
    p->compute = CUDNN_DATA_FLOAT;
  } else if (t.code == FDNN_DTYPE_BFLOAT && t.bits == 16) {
    p->dtype = CUDNN_DATA_BFLOAT16;
    p->compute = CUDNN_DATA_FLOAT;
  } else if (t.code == FDNN_DTYPE_FLOAT && t.bits == 32) {
    p->dtype = CUDNN_DATA_FLOAT;
    p->compute = CUDNN_DATA_FLOAT;
  } else if (t.code == FDNN_DTYPE_FLOAT && t.bits == 64) {
    p->dtype = CUDNN_DATA_DOUBLE;
    p->compute = CUDNN_DATA_DOUBLE;
  } else {
    fail(FDNN_ERROR_UNSUPPORTED,
         "cudnn: dtype (code %u, bits %u) is not supported; use float16, bfloat16, float32 "
         "or float64", t.code, t.bits);
  }
  p->element_size = t.bits / 8;
}

// An explicit accumulation type, where cuDNN offers it for this input type.
void read_compute_type(const FDNN_DLDataType& c, ConvProblem* p) {
  if (c.code == 0 && c.bits == 0) return;  // vendor default, set by read_dtype
  bool is_float = c.code == FDNN_DTYPE_FLOAT;
  if (is_float && c.bits == 32 && p->dtype != CUDNN_DATA_DOUBLE) {
    p->compute = CUDNN_DATA_FLOAT;
  } else if (is_float && c.bits == 64 && p->dtype == CUDNN_DATA_DOUBLE) {
    p->compute = CUDNN_DATA_DOUBLE;
  } else if (is_float && c.bits == 16 && p->dtype == CUDNN_DATA_HALF) {
    p->compute = CUDNN_DATA_HALF;
  } else {
    fail(FDNN_ERROR_UNSUPPORTED,
         "cudnn: accumulation in %s is not offered for %s inputs (float32 for 16- and "
         "32-bit floats, float16 for float16, float64 for float64)",
         fdnn_shim::dtype_name(c), fdnn_shim::dtype_name(p->abi_dtype));
  }
}

void check_same_dtype(const FDNN_DLTensor* t, const FDNN_DLDataType& want, const char* name) {
  if (t->dtype.code != want.code || t->dtype.bits != want.bits || t->dtype.lanes != 1)
    fail(FDNN_ERROR_INVALID_ARGUMENT, "cudnn: %s is %s but x is %s; all tensors must share "
         "one dtype", name, fdnn_shim::dtype_name(t->dtype), fdnn_shim::dtype_name(want));
}

void check_device(const FDNN_DLTensor* t, const char* name, int device) {
  if (t->device.device_type != FDNN_DEVICE_CUDA)
    fail(FDNN_ERROR_INVALID_ARGUMENT, "cudnn: %s is on DLPack device type %d, not CUDA (2)",
         name, t->device.device_type);
  if (t->device.device_id != device)
    fail(FDNN_ERROR_INVALID_ARGUMENT, "cudnn: %s is on cuda:%d but x is on cuda:%d", name,
         t->device.device_id, device);
}

// Shape and strides; dims of size 1 may carry any stride (DLPack producers differ), so a
// non-positive one there is replaced by 1; elsewhere cuDNN needs positive strides.
LogicalTensor read_logical(const FDNN_DLTensor* t, const char* name, size_t element_size) {
  LogicalTensor out;
  int64_t last_offset = 0;
  for (int i = 0; i < t->ndim; ++i) {
    int64_t size = t->shape[i];
    int64_t stride = t->strides[i];
    if (size <= 0)
      fail(FDNN_ERROR_UNSUPPORTED, "cudnn: %s has an empty dim %d (size %lld); cuDNN needs "
           "non-empty tensors", name, i, static_cast<long long>(size));
    if (size == 1 && stride <= 0) stride = 1;
    if (stride <= 0)
      fail(FDNN_ERROR_UNSUPPORTED, "cudnn: %s has stride %lld in dim %d; cuDNN needs "
           "positive strides", name, static_cast<long long>(stride), i);
    out.shape.push_back(size);
    out.strides.push_back(stride);
    last_offset += (size - 1) * stride;
  }
  out.span_bytes = static_cast<size_t>(last_offset + 1) * element_size;
  return out;
}

// cuDNN wants at least 2 spatial dims: a 1-D problem gets a unit height in front of its
// width, laid out just outside the width dim so the layout (NCW or NWC) stays recognisable.
Geometry to_cudnn(const LogicalTensor& t) {
  Geometry g{t.shape, t.strides};
  if (t.shape.size() == 3) {
    g.dims.insert(g.dims.begin() + 2, 1);
    g.strides.insert(g.strides.begin() + 2, t.strides[2] * t.shape[2]);
  }
  return g;
}

// Strides of `shape` laid out compactly in the order `outer_to_inner` of its dims.
std::vector<int64_t> compact_strides(const std::vector<int64_t>& shape,
                                     const std::vector<size_t>& outer_to_inner) {
  std::vector<int64_t> strides(shape.size());
  int64_t step = 1;
  for (auto d = outer_to_inner.rbegin(); d != outer_to_inner.rend(); ++d) {
    strides[*d] = step;
    step *= shape[*d];
  }
  return strides;
}

// N, *spatial, C when channels-last; N, C, *spatial otherwise.
std::vector<size_t> memory_order(size_t ndim, bool channels_last) {
  std::vector<size_t> order{0};
  if (!channels_last) order.push_back(1);
  for (size_t d = 2; d < ndim; ++d) order.push_back(d);
  if (channels_last) order.push_back(1);
  return order;
}

// Channels-last when the channel dim is inside the innermost spatial dim.
bool is_channels_last(const LogicalTensor& t) {
  size_t last = t.shape.size() - 1;
  return t.shape[1] > 1 && t.shape[last] > 1 && t.strides[1] < t.strides[last];
}

bool same_strides(const LogicalTensor& t, const std::vector<int64_t>& strides) {
  for (size_t d = 0; d < strides.size(); ++d)  // strides of size-1 dims never matter
    if (t.shape[d] != 1 && t.strides[d] != strides[d]) return false;
  return true;
}

// w in x's memory order: as it is when it already is (size-1 dims aside, whose strides are
// then written canonically), else staged through the workspace.
void match_w_to_x(ConvProblem* p) {
  bool x_channels_last = is_channels_last(p->x_logical);
  std::vector<int64_t> wanted = compact_strides(
      p->w_logical.shape, memory_order(p->w_logical.shape.size(), x_channels_last));
  LogicalTensor canonical = p->w_logical;
  canonical.strides = wanted;
  p->stage_w = !same_strides(p->w_logical, wanted);
  if (p->stage_w) p->w_staged = canonical;
  p->w = to_cudnn(canonical);
}

void read_conv_params(const FDNN_Conv_Plan_Create_Args& a, ConvProblem* p) {
  int rank = a.spatial_rank;
  if (rank == 1) {  // the unit height of to_cudnn
    p->stride.push_back(1);
    p->dilation.push_back(1);
    p->pad_lo.push_back(0);
    p->pad_hi.push_back(0);
  }
  for (int i = 0; i < rank; ++i) {
    if (a.stride[i] < 1 || a.dilation[i] < 1 || a.padding_lo[i] < 0 || a.padding_hi[i] < 0)
      fail(FDNN_ERROR_INVALID_ARGUMENT, "cudnn: spatial dim %d has stride %lld, dilation "
           "%lld, padding (%lld, %lld); need stride >= 1, dilation >= 1, padding >= 0", i,
           static_cast<long long>(a.stride[i]), static_cast<long long>(a.dilation[i]),
           static_cast<long long>(a.padding_lo[i]), static_cast<long long>(a.padding_hi[i]));
    p->stride.push_back(a.stride[i]);
    p->dilation.push_back(a.dilation[i]);
    p->pad_lo.push_back(a.padding_lo[i]);
    p->pad_hi.push_back(a.padding_hi[i]);
  }
}

void check_shapes(const FDNN_Conv_Plan_Create_Args& a, const ConvProblem& p) {
  const auto& xs = p.x_logical.shape;
  const auto& ws = p.w_logical.shape;
  const auto& ys = p.y_logical.shape;
  int64_t groups = a.groups;
  if (groups < 1) bad("cudnn: groups must be >= 1 (%s)", p.description);
  if (xs[1] % groups != 0 || ws[0] % groups != 0)
    bad("cudnn: channels C and K must be divisible by groups (%s)", p.description);
  if (ws[1] * groups != xs[1])
    bad("cudnn: w.shape[1] * groups must equal x.shape[1] (%s)", p.description);
  if (ys[0] != xs[0] || ys[1] != ws[0])
    bad("cudnn: y must be N x K x ... with N from x and K from w (%s)", p.description);
  for (int i = 0; i < a.spatial_rank; ++i) {
    int64_t span = a.dilation[i] * (ws[2 + i] - 1) + 1;
    int64_t padded = xs[2 + i] + a.padding_lo[i] + a.padding_hi[i];
    int64_t out = padded >= span ? (padded - span) / a.stride[i] + 1 : 0;
    if (out != ys[2 + i])
      fail(FDNN_ERROR_INVALID_ARGUMENT, "cudnn: spatial dim %d of y is %lld, the "
           "convolution gives %lld (%s)", i, static_cast<long long>(ys[2 + i]),
           static_cast<long long>(out), p.description.c_str());
  }
}

void read_bias(const FDNN_Conv_Plan_Create_Args& a, ConvProblem* p) {
  if (!has_tensor(a.bias)) return;
  if (a.op == FDNN_CONV_BACKWARD_DATA)
    bad("cudnn: backward_data takes no bias (%s)", p->description);
  int64_t k = p->w_logical.shape[0];
  if (a.bias->ndim != 1 || a.bias->shape[0] != k)
    bad("cudnn: bias must have shape (K,) (%s)", p->description);
  check_same_dtype(a.bias, p->abi_dtype, "bias");
  check_device(a.bias, "bias", p->device);
  p->has_bias = true;
  p->bias_stride = a.bias->strides[0] > 0 ? a.bias->strides[0] : 1;
  size_t dims = p->y.dims.size();
  p->bias.dims.assign(dims, 1);
  p->bias.dims[1] = k;
  p->bias.strides.assign(dims, k * p->bias_stride);
  p->bias.strides[1] = p->bias_stride;
}

void read_epilogue(const FDNN_Conv_Plan_Create_Args& a, ConvProblem* p) {
  p->alpha = a.alpha;
  p->beta = a.beta;
  p->activation = a.activation;
  p->activation_alpha = a.activation_alpha;
  p->activation_beta = a.activation_beta;
  if (a.activation < FDNN_ACTIVATION_NONE || a.activation > FDNN_ACTIVATION_SILU)
    fail(FDNN_ERROR_UNSUPPORTED, "cudnn: unknown activation %d", static_cast<int>(a.activation));
  if (a.activation != FDNN_ACTIVATION_NONE && a.op != FDNN_CONV_FORWARD)
    bad("cudnn: an activation applies to forward only (%s)", p->description);
}

// The largest power of two (up to 16) that divides a data pointer the caller showed us;
// 16 when it showed none (the ABI allows NULL data at plan time). Execute checks it.
int64_t pointer_alignment(const FDNN_DLTensor* t, int64_t current) {
  if (!has_tensor(t) || t->data == nullptr) return current;
  uintptr_t address = reinterpret_cast<uintptr_t>(t->data) + t->byte_offset;
  int64_t a = 16;
  while (a > 1 && address % a != 0) a /= 2;
  return std::min(current, a);
}

}  // namespace

ConvProblem read_problem(const FDNN_Conv_Plan_Create_Args& a) {
  ConvProblem p;
  p.description = fdnn_shim::describe_problem(a);
  if (a.op < FDNN_CONV_FORWARD || a.op > FDNN_CONV_BACKWARD_WEIGHT)
    fail(FDNN_ERROR_INVALID_ARGUMENT, "cudnn: unknown conv op %d", static_cast<int>(a.op));
  if (a.spatial_rank < 1 || a.spatial_rank > 3)
    fail(FDNN_ERROR_INVALID_ARGUMENT, "cudnn: spatial_rank is %d; need 1, 2 or 3",
         a.spatial_rank);
  if (!has_tensor(a.x) || !has_tensor(a.w) || !has_tensor(a.y))
    bad("cudnn: x, w and y must all be described (%s)", p.description);
  int ndim = a.spatial_rank + 2;
  if (a.x->ndim != ndim || a.w->ndim != ndim || a.y->ndim != ndim)
    bad("cudnn: x, w and y need spatial_rank + 2 dims (%s)", p.description);
  p.op = a.op;
  p.device = a.x->device.device_id;
  check_device(a.x, "x", p.device);
  check_device(a.w, "w", p.device);
  check_device(a.y, "y", p.device);
  read_dtype(a.x->dtype, &p);
  check_same_dtype(a.w, p.abi_dtype, "w");
  check_same_dtype(a.y, p.abi_dtype, "y");
  read_compute_type(a.compute_type, &p);
  p.x_logical = read_logical(a.x, "x", p.element_size);
  p.w_logical = read_logical(a.w, "w", p.element_size);
  p.y_logical = read_logical(a.y, "y", p.element_size);
  check_shapes(a, p);
  p.x = to_cudnn(p.x_logical);
  match_w_to_x(&p);
  p.y = to_cudnn(p.y_logical);
  read_conv_params(a, &p);
  read_epilogue(a, &p);
  read_bias(a, &p);
  p.flags = a.flags;
  int64_t align = 16;
  for (const FDNN_DLTensor* t : {a.x, a.w, a.y, a.bias}) align = pointer_alignment(t, align);
  p.alignment = std::max<int64_t>(align, static_cast<int64_t>(p.element_size));
  return p;
}

}  // namespace fdnn_cudnn
