#include "problem.hpp"

#include <algorithm>

namespace fdnn_cudnn {
namespace {

using fdnn_shim::fail;
using fdnn_shim::has_tensor;

// The dtype in cuDNN's terms (check_covered has refused every other).
void read_dtype(const FDNN_DLDataType& t, ConvProblem* p) {
  p->abi_dtype = t;
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
    fail(FDNN_ERROR_INTERNAL, "cudnn: dtype %s passed the capability check",
         fdnn_shim::dtype_name(t));
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

// Shape and strides (no dim is empty: check_conv_problem). Dims of size 1 may carry any
// stride (DLPack producers differ): canonicalise_unit_strides rewrites them once the memory
// order is known. Elsewhere cuDNN needs positive strides.
LogicalTensor read_logical(const FDNN_DLTensor* t, const char* name, size_t element_size) {
  LogicalTensor out;
  int64_t last_offset = 0;
  for (int i = 0; i < t->ndim; ++i) {
    int64_t size = t->shape[i];
    int64_t stride = t->strides[i];
    if (size != 1 && stride <= 0)
      fail(FDNN_ERROR_UNSUPPORTED, "cudnn: %s has stride %lld in dim %d; cuDNN needs "
           "positive strides", name, static_cast<long long>(stride), i);
    out.shape.push_back(size);
    out.strides.push_back(stride);
    if (size != 1) last_offset += (size - 1) * stride;
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

// The memory order a tensor's strides show. Channels-last when the channel dim is inside
// every spatial dim of size > 1; with one channel, or no spatial dim above 1, both orders
// describe the same memory, so the tensor does not say (kEither).
enum class Order { kChannelsFirst, kChannelsLast, kEither };

Order order_of(const FDNN_DLTensor* t) {
  if (t->shape[1] == 1) return Order::kEither;
  bool any_spatial = false, channel_inside = true;
  for (int d = 2; d < t->ndim; ++d) {
    if (t->shape[d] == 1) continue;
    any_spatial = true;
    if (t->strides[1] >= t->strides[d]) channel_inside = false;
  }
  if (!any_spatial) return Order::kEither;
  return channel_inside ? Order::kChannelsLast : Order::kChannelsFirst;
}

// The problem's memory order: the first of x, y, w that says (an NHWC model's first layer
// on one-channel images has an x that does not), channels-first when none does.
bool problem_is_channels_last(const FDNN_Conv_Plan_Create_Args& a) {
  for (const FDNN_DLTensor* t : {a.x, a.y, a.w}) {
    Order o = order_of(t);
    if (o != Order::kEither) return o == Order::kChannelsLast;
  }
  return false;
}

bool own_or(const FDNN_DLTensor* t, bool problem_channels_last) {
  Order o = order_of(t);
  return o == Order::kEither ? problem_channels_last : o == Order::kChannelsLast;
}

// Strides of size-1 dims written as a compact tensor in this memory order would have them
// (cuDNN infers layouts from strides, and an odd stride on a unit dim can cost it its fast
// engines); the strides of the other dims stay the caller's.
void canonicalise_unit_strides(LogicalTensor* t, bool channels_last) {
  std::vector<size_t> order = memory_order(t->shape.size(), channels_last);
  int64_t extent = 1;  // elements spanned by the dims inside the current one
  for (auto d = order.rbegin(); d != order.rend(); ++d) {
    if (t->shape[*d] == 1)
      t->strides[*d] = extent;
    else
      extent = std::max(extent, t->strides[*d] * t->shape[*d]);
  }
}

bool same_strides(const LogicalTensor& t, const std::vector<int64_t>& strides) {
  for (size_t d = 0; d < strides.size(); ++d)  // strides of size-1 dims never matter
    if (t.shape[d] != 1 && t.strides[d] != strides[d]) return false;
  return true;
}

// w in x's memory order: as it is when it already is (size-1 dims aside, whose strides are
// then written canonically), else staged through the workspace.
void match_w_to_x(ConvProblem* p) {
  std::vector<int64_t> wanted = compact_strides(
      p->w_logical.shape, memory_order(p->w_logical.shape.size(), p->x_channels_last));
  LogicalTensor canonical = p->w_logical;
  canonical.strides = wanted;
  p->stage_w = !same_strides(p->w_logical, wanted);
  if (p->stage_w) p->w_staged = canonical;
  p->w = to_cudnn(canonical);
}

void read_conv_params(const FDNN_Conv_Plan_Create_Args& a, ConvProblem* p) {
  if (a.spatial_rank == 1) {  // the unit height of to_cudnn
    p->stride.push_back(1);
    p->dilation.push_back(1);
    p->pad_lo.push_back(0);
    p->pad_hi.push_back(0);
  }
  for (int i = 0; i < a.spatial_rank; ++i) {
    p->stride.push_back(a.stride[i]);
    p->dilation.push_back(a.dilation[i]);
    p->pad_lo.push_back(a.padding_lo[i]);
    p->pad_hi.push_back(a.padding_hi[i]);
  }
}

// A bias as cuDNN broadcasts it: 1, K, 1, ... with the caller's stride along K. The ABI
// lets a read-only tensor repeat an element (stride 0: torch's b0.expand(K)); the epilogue
// reads bias[k * 0] as it should, but cuDNN takes positive strides only, so such a bias is
// never fused (can_fuse_epilogue) and its graph geometry is never built.
void read_bias(const FDNN_Conv_Plan_Create_Args& a, ConvProblem* p) {
  if (!has_tensor(a.bias)) return;
  int64_t k = p->w_logical.shape[0];
  p->has_bias = true;
  p->bias_stride = k == 1 ? 1 : a.bias->strides[0];  // one element: any stride means 1
  if (p->bias_stride <= 0) return;
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

void use_w_unstaged(ConvProblem* p) {
  p->stage_w = false;
  p->w_staged = LogicalTensor{};
  p->w = to_cudnn(p->w_logical);
}

ConvProblem read_problem(const FDNN_Conv_Plan_Create_Args& a) {
  ConvProblem p;
  p.description = fdnn_shim::describe_problem(a);
  p.op = a.op;
  p.device = a.x->device.device_id;
  read_dtype(a.x->dtype, &p);
  read_compute_type(a.compute_type, &p);
  p.x_logical = read_logical(a.x, "x", p.element_size);
  p.w_logical = read_logical(a.w, "w", p.element_size);
  p.y_logical = read_logical(a.y, "y", p.element_size);
  bool channels_last = problem_is_channels_last(a);
  p.x_channels_last = own_or(a.x, channels_last);
  p.w_channels_last = own_or(a.w, channels_last);
  canonicalise_unit_strides(&p.x_logical, p.x_channels_last);
  canonicalise_unit_strides(&p.w_logical, p.w_channels_last);
  canonicalise_unit_strides(&p.y_logical, own_or(a.y, channels_last));
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
