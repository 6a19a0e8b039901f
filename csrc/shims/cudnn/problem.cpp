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

// Shape and strides (no dim is empty, no stride negative: check_conv_problem). Dims of size
// 1 may carry any stride (DLPack producers differ): canonicalise_unit_strides rewrites them
// once the memory order is known. A stride 0 elsewhere (a repeated element, on an operand
// the op only reads) cuDNN cannot take: such an operand is staged (cudnn_can_take).
LogicalTensor read_logical(const FDNN_DLTensor* t, size_t element_size) {
  LogicalTensor out;
  int64_t last_offset = 0;
  for (int i = 0; i < t->ndim; ++i) {
    int64_t size = t->shape[i];
    int64_t stride = t->strides[i];
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

size_t element_count(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

// `t` laid out compactly in the memory order `channels_last`.
LogicalTensor compact_in(const std::vector<int64_t>& shape, bool channels_last,
                         size_t element_size) {
  LogicalTensor c;
  c.shape = shape;
  c.strides = compact_strides(shape, memory_order(shape.size(), channels_last));
  c.span_bytes = element_count(shape) * element_size;
  return c;
}

bool is_compact_in(const LogicalTensor& t, bool channels_last) {
  return same_strides(t, compact_strides(t.shape, memory_order(t.shape.size(), channels_last)));
}

bool has_zero_stride(const LogicalTensor& t) {
  for (size_t d = 0; d < t.shape.size(); ++d)
    if (t.shape[d] != 1 && t.strides[d] == 0) return true;
  return false;
}

// What the graph describes of `o`: the caller's tensor, or its copy at a 256-byte boundary
// of the workspace (16-byte aligned: the workspace itself is 64-byte aligned).
void set_cudnn_view(Operand* o) {
  o->cudnn.alignment = o->staged ? 16 : o->user_alignment;
  Geometry g = to_cudnn(o->seen());
  o->cudnn.dims = g.dims;
  o->cudnn.strides = g.strides;
}

// `o` copied compactly in the order `channels_last`, grown by lead + trail (padding).
void stage(Operand* o, bool channels_last, const std::vector<int64_t>& lead,
           const std::vector<int64_t>& trail, size_t element_size) {
  std::vector<int64_t> shape = o->user.shape;
  for (size_t d = 0; d < shape.size(); ++d) shape[d] += lead[d] + trail[d];
  o->staged = true;
  o->compact = compact_in(shape, channels_last, element_size);
  o->lead = lead;
  set_cudnn_view(o);
}

void unstage(Operand* o) {
  o->staged = false;
  o->compact = LogicalTensor{};
  o->lead.clear();
  set_cudnn_view(o);
}

std::vector<int64_t> zeros(size_t n) { return std::vector<int64_t>(n, 0); }

// w in x's memory order: as it is when it already is (size-1 dims aside, whose strides are
// then written canonically), else staged through the workspace.
void match_w_to_x(ConvProblem* p) {
  size_t n = p->w.user.shape.size();
  if (is_compact_in(p->w.user, p->x.channels_last)) {
    p->w.user.strides =  // canonical strides for the size-1 dims too
        compact_strides(p->w.user.shape, memory_order(n, p->x.channels_last));
    unstage(&p->w);
  } else {
    stage(&p->w, p->x.channels_last, zeros(n), zeros(n), p->element_size);
  }
}

bool asymmetric(const ConvProblem& p) { return p.pad_lo != p.pad_hi; }

// x (or dx) with the padding difference copied in: lo - hi zeros before the data where lo
// is the larger, hi - lo after it where hi is; cuDNN then pads min(lo, hi) on each side.
void stage_padded_x(ConvProblem* p) {
  size_t n = p->x.user.shape.size();
  size_t first = p->pad_lo.size() - (n - 2);  // cuDNN's spatial dim of logical dim 2
  std::vector<int64_t> lead = zeros(n), trail = zeros(n);
  for (size_t d = 2; d < n; ++d) {
    int64_t lo = p->pad_lo[first + d - 2], hi = p->pad_hi[first + d - 2];
    lead[d] = lo > hi ? lo - hi : 0;
    trail[d] = hi > lo ? hi - lo : 0;
  }
  for (size_t i = 0; i < p->pad_lo.size(); ++i)
    p->pad_lo[i] = p->pad_hi[i] = std::min(p->pad_lo[i], p->pad_hi[i]);
  p->padded_copy = true;
  stage(&p->x, p->x.channels_last, lead, trail, p->element_size);
}

const char* role_name(const ConvProblem& p, Role r) {
  switch (r) {
    case Role::kX: return p.op == FDNN_CONV_BACKWARD_DATA ? "dx" : "x";
    case Role::kW: return p.op == FDNN_CONV_BACKWARD_WEIGHT ? "dw" : "w";
    case Role::kY: break;
  }
  return p.op == FDNN_CONV_FORWARD ? "y" : "dy";
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

// The largest power of two (up to 16) that divides a data pointer the caller showed us;
// 16 when it showed none (the ABI allows NULL data at plan time), never below the element
// size. Per tensor, as cuDNN takes it (CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT): one misaligned
// bias must not cost x, w and y their vectorised engines. Execute checks each.
int64_t pointer_alignment(const FDNN_DLTensor* t, size_t element_size) {
  int64_t a = 16;
  if (!has_tensor(t) || t->data == nullptr) return a;
  uintptr_t address = reinterpret_cast<uintptr_t>(t->data) + t->byte_offset;
  while (a > 1 && address % a != 0) a /= 2;
  return std::max(a, static_cast<int64_t>(element_size));
}

// A bias as cuDNN broadcasts it: 1, K, 1, ... with the caller's stride along K. The ABI
// lets a read-only tensor repeat an element (stride 0: torch's b0.expand(K)); the epilogue
// reads bias[k * 0] as it should, but cuDNN takes positive strides only, so such a bias is
// never fused (can_fuse_epilogue) and its graph geometry is never built.
void read_bias(const FDNN_Conv_Plan_Create_Args& a, ConvProblem* p) {
  if (!has_tensor(a.bias)) return;
  int64_t k = p->w.user.shape[0];
  p->has_bias = true;
  p->bias_stride = k == 1 ? 1 : a.bias->strides[0];  // one element: any stride means 1
  if (p->bias_stride <= 0) return;
  p->bias.alignment = pointer_alignment(a.bias, p->element_size);
  size_t dims = p->y.cudnn.dims.size();
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

// The caller's tensor `t` as operand `o`, in the memory order `channels_last`.
void read_operand(const FDNN_DLTensor* t, bool channels_last, size_t element_size,
                  Operand* o) {
  o->user = read_logical(t, element_size);
  o->channels_last = channels_last;
  canonicalise_unit_strides(&o->user, channels_last);
  o->user_alignment = pointer_alignment(t, element_size);
  set_cudnn_view(o);
}

}  // namespace

bool use_w_unstaged(ConvProblem* p) {
  if (has_zero_stride(p->w.user)) return false;
  unstage(&p->w);
  return true;
}

bool cudnn_can_take(const ConvProblem& p) {
  for (const Operand* o : {&p.x, &p.w, &p.y})
    if (!o->staged && has_zero_stride(o->user)) return false;
  // Measured, not documented: on cuDNN 9.19 (H200, GPU check of 2026-12-04) the heuristics'
  // first backward-weight engine for 3-D grouped float16/bfloat16 problems with pre != post
  // padding returned wrong values (relative error 1.5 to 1e18) without an error, where the
  // symmetric problem was right. PyTorch never hands cuDNN asymmetric padding. A weight
  // gradient reads x once anyway, so its padded copy costs little: always stage it.
  if (p.op == FDNN_CONV_BACKWARD_WEIGHT && asymmetric(p) && !p.x.staged) return false;
  return true;
}

bool stage_for_fallback(ConvProblem* p) {
  bool changed = false;
  if (asymmetric(*p)) {
    stage_padded_x(p);
    changed = true;
  }
  for (Operand* o : {&p->x, &p->y}) {
    if (o->staged || is_compact_in(o->user, o->channels_last)) continue;
    size_t n = o->user.shape.size();
    stage(o, o->channels_last, zeros(n), zeros(n), p->element_size);
    changed = true;
  }
  if (!p->w.staged && !is_compact_in(p->w.user, p->x.channels_last)) {  // unstaged by a limit
    match_w_to_x(p);
    changed = true;
  }
  p->fallback = true;
  return changed;
}

std::string staging_text(const ConvProblem& p) {
  std::string text;
  for (Role r : {Role::kX, Role::kW, Role::kY}) {
    const Operand& o = p.operand(r);
    if (!o.staged) continue;
    text += std::string(text.empty() ? "" : ", ") + role_name(p, r) +
            (o.padded() ? " (padded copy)" : " (compact copy)");
  }
  return text;
}

ConvProblem read_problem(const FDNN_Conv_Plan_Create_Args& a) {
  ConvProblem p;
  p.description = fdnn_shim::describe_problem(a);
  p.op = a.op;
  p.device = a.x->device.device_id;
  read_dtype(a.x->dtype, &p);
  read_compute_type(a.compute_type, &p);
  bool channels_last = problem_is_channels_last(a);
  read_operand(a.x, own_or(a.x, channels_last), p.element_size, &p.x);
  read_operand(a.w, own_or(a.w, channels_last), p.element_size, &p.w);
  read_operand(a.y, own_or(a.y, channels_last), p.element_size, &p.y);
  match_w_to_x(&p);
  read_conv_params(a, &p);
  read_epilogue(a, &p);
  read_bias(a, &p);
  p.flags = a.flags;
  return p;
}

}  // namespace fdnn_cudnn
