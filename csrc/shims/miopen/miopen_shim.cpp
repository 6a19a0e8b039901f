// The MIOpen shim: flux_dnn's ABI (flux_dnn.h) over MIOpen's immediate-mode convolution API
// on AMD GPUs. MIOpen and HIP are dlopened (miopen_lib.cpp); their declarations are ours
// (miopen_api.hpp). It has never run on an AMD GPU: tests/doubles/miopen, which reproduces
// what MIOpen's source does (its file comment names each source), checks it.
//
// MIOpen's gaps, closed here rather than passed on to the caller:
//  - 1-D convolutions: 2-D with a unit height;
//  - asymmetric padding (MIOpen pads symmetrically): x is copied into a zero-padded buffer in
//    the workspace (forward, backward-weight), or dx is computed into one and its interior
//    copied out (backward-data); never dropped;
//  - alpha/beta (immediate mode takes none), bias, activations: MIOpen's own tensor ops
//    (miopenOpTensor, miopenScaleTensor, miopenActivationForward) on the conv result;
//  - tensors not packed in one layout (MIOpen reads the layout from the strides and wants x,
//    w and y alike), views with gaps, repeated (stride 0) inputs: copied into packed buffers of
//    x's layout in the workspace;
//  - the bias gradient of an NHWC dy: dy copied to NCHW first (MIOpen's bias kernel reads
//    each channel's map as contiguous).
// miopenOpTensor is not a strided copy: packed operands are processed flat, the bias kernel
// indexes as NCHW, and the generic kernels take no stride for the last dim (it is assumed 1).
// So every OpTensor call here describes its tensors in 5 dims whose last is a unit dim of
// stride 1 (the generic kernel then sees every real stride): copies as `TensorCopy`, the
// epilogue on a flat view of the packed result (`EpilogueViews`).
// Layout of the caller's workspace: [MIOpen's | staged x | staged w | staged y | activation
// scratch | dy in NCHW | bias gradient | packed bias | constant cells], each 256-byte aligned.
#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "fp16.hpp"
#include "miopen_api.hpp"
#include "miopen_lib.hpp"
#include "shim_common.hpp"

using fdnn_shim::fail;
using fdnn_shim::Failure;
using namespace fdnn_miopen;

namespace {

constexpr size_t kAlign = 256;
size_t round_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

const MIOpen& mi() { return libraries().miopen; }
const Hip& hip() { return libraries().hip; }

void check_miopen(miopenStatus_t s, const char* what) {
  if (s == miopenStatusSuccess) return;
  const char* text = mi().GetErrorString ? mi().GetErrorString(s) : nullptr;
  int32_t code = s == miopenStatusAllocFailed ? FDNN_ERROR_OUT_OF_MEMORY
                 : s == miopenStatusNotImplemented ? FDNN_ERROR_UNSUPPORTED
                                                    : FDNN_ERROR_VENDOR;
  fail(code, "miopen: %s failed: %s (status %d)", what, text ? text : "unknown", s);
}

void check_hip(hipError_t e, const char* what) {
  if (e == hipSuccess) return;
  const char* text = hip().GetErrorString ? hip().GetErrorString(e) : nullptr;
  fail(e == 2 ? FDNN_ERROR_OUT_OF_MEMORY : FDNN_ERROR_VENDOR, "miopen: %s failed: %s (HIP %d)",
       what, text ? text : "unknown", e);
}

void require_usable() {
  const Libraries& L = libraries();
  if (!L.why_not.empty()) fail(FDNN_ERROR_UNAVAILABLE, "miopen: %s", L.why_not.c_str());
}

void require_device(int device) {
  require_usable();
  if (device < 0 || device >= libraries().num_devices)
    fail(FDNN_ERROR_INVALID_ARGUMENT,
         "miopen: device_id %d: no such AMD GPU device (this process sees %d)", device,
         libraries().num_devices);
}

// Makes `device` current for a scope, as PyTorch's device guard does.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check_hip(hip().GetDevice(&previous_), "hipGetDevice");
    if (previous_ != device) check_hip(hip().SetDevice(device), "hipSetDevice");
  }
  ~DeviceGuard() { hip().SetDevice(previous_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

// One MIOpen handle per device and thread at a time (handles are not thread-safe); the
// stream is set on every call, so the work is ordered on the caller's stream. A thread's
// handles go back to a per-device pool when it ends, for the next thread: MIOpen keeps its
// compiled kernels per handle, as PyTorch's handle pool does (aten/src/ATen/miopen/Handle.cpp).
std::mutex pool_mutex;
std::map<int, std::vector<miopenHandle_t>>& handle_pool() {
  static auto* pool = new std::map<int, std::vector<miopenHandle_t>>();  // never destroyed
  return *pool;
}

miopenHandle_t thread_handle(int device, void* stream) {
  struct Handles {
    std::map<int, miopenHandle_t> by_device;
    ~Handles() {
      std::lock_guard<std::mutex> lock(pool_mutex);
      for (auto& [d, h] : by_device)
        if (h != nullptr) handle_pool()[d].push_back(h);
    }
  };
  thread_local Handles handles;
  miopenHandle_t& h = handles.by_device[device];
  if (h == nullptr) {
    std::lock_guard<std::mutex> lock(pool_mutex);
    std::vector<miopenHandle_t>& free = handle_pool()[device];
    if (!free.empty()) h = free.back(), free.pop_back();
  }
  if (h == nullptr) check_miopen(mi().Create(&h), "miopenCreate");
  check_miopen(mi().SetStream(h, static_cast<hipStream_t>(stream)), "miopenSetStream");
  return h;
}

// ---- tensors -------------------------------------------------------------------------------

// Which memory order a tensor of MIOpen dims (N, C, [D,] H, W) is packed in.
enum class Layout { kNCHW, kNHWC };

struct Dims {
  std::vector<int64_t> shape, strides;  // in elements, MIOpen's dims (unit H for 1-D)
  size_t elements() const {
    size_t n = 1;
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    return n;
  }
};

std::vector<size_t> dim_order(size_t ndim, Layout layout) {  // outermost first
  std::vector<size_t> order{0};
  if (layout == Layout::kNCHW) order.push_back(1);
  for (size_t d = 2; d < ndim; ++d) order.push_back(d);
  if (layout == Layout::kNHWC) order.push_back(1);
  return order;
}

Dims packed(const std::vector<int64_t>& shape, Layout layout) {
  Dims t{shape, std::vector<int64_t>(shape.size())};
  std::vector<size_t> order = dim_order(shape.size(), layout);
  int64_t step = 1;
  for (auto d = order.rbegin(); d != order.rend(); ++d) {
    t.strides[*d] = step;
    step *= shape[*d];
  }
  return t;
}

// Whether t is packed in `layout`, strides of size-1 dims being free.
bool is_packed(const Dims& t, Layout layout) {
  Dims p = packed(t.shape, layout);
  for (size_t d = 0; d < t.shape.size(); ++d)
    if (t.shape[d] != 1 && t.strides[d] != p.strides[d]) return false;
  return true;
}

// The caller's tensor in MIOpen's dims: 1-D gets a unit height (its stride that of a packed
// tensor of either layout: W's stride times W).
Dims read_dims(const FDNN_DLTensor* t, int rank) {
  Dims d;
  for (int i = 0; i < t->ndim; ++i) {
    d.shape.push_back(t->shape[i]);
    d.strides.push_back(t->strides[i]);
  }
  if (rank == 1) {
    d.shape.insert(d.shape.begin() + 2, 1);
    d.strides.insert(d.strides.begin() + 2, d.strides[2] * d.shape[3]);
  }
  return d;
}

// Size-1 dims get the strides of the packed layout, so MIOpen reads the layout it is meant
// to from the strides (a size-1 dim's stride is arbitrary in DLPack).
Dims canonical(const Dims& t, Layout layout) {
  if (!is_packed(t, layout)) return t;
  return packed(t.shape, layout);
}

void check_int32(const Dims& t, const char* name) {
  size_t span = 1;
  for (size_t d = 0; d < t.shape.size(); ++d) {
    if (t.shape[d] > INT_MAX || t.strides[d] > INT_MAX || t.strides[d] < 0)
      fail(FDNN_ERROR_UNSUPPORTED, "miopen: %s dim %zu (size %lld, stride %lld) is beyond "
           "MIOpen's int32 tensor descriptors", name, d, static_cast<long long>(t.shape[d]),
           static_cast<long long>(t.strides[d]));
    span += static_cast<size_t>(t.shape[d] - 1) * static_cast<size_t>(t.strides[d]);
  }
  if (span > static_cast<size_t>(INT_MAX))
    fail(FDNN_ERROR_UNSUPPORTED, "miopen: %s spans %zu elements, beyond MIOpen's int32 "
         "indexing (2^31 - 1)", name, span);
}

miopenDataType_t miopen_type(FDNN_DLDataType t) {
  if (t.code == FDNN_DTYPE_BFLOAT) return miopenBFloat16;
  return t.bits == 16 ? miopenHalf : miopenFloat;
}

// A host scalar in the tensor's own type: miopenSetTensor and miopenScaleTensor read their
// alpha as the tensor's type, not as float (MIOpen's tensorocl.cpp: `*as_float(alpha)`;
// visit_float.hpp). A float 0.75 read as half would be 0.
struct Scalar {
  alignas(8) unsigned char bytes[8] = {0};
  Scalar(miopenDataType_t type, double v) {
    const float f = static_cast<float>(v);
    if (type == miopenHalf || type == miopenBFloat16) {
      const uint16_t h = type == miopenHalf ? fdnn_shim::float_to_half(f) : fdnn_shim::float_to_bf16(f);
      std::memcpy(bytes, &h, sizeof h);
    } else {
      std::memcpy(bytes, &f, sizeof f);
    }
  }
  const void* get() const { return bytes; }
};

// An owned miopenTensorDescriptor_t.
class Tensor {
 public:
  Tensor() = default;
  Tensor(const Dims& d, miopenDataType_t type) : dims_(d) {
    check_miopen(mi().CreateTensorDescriptor(&desc_), "miopenCreateTensorDescriptor");
    std::vector<int> shape(d.shape.begin(), d.shape.end());
    std::vector<int> strides(d.strides.begin(), d.strides.end());
    check_miopen(mi().SetTensorDescriptor(desc_, type, static_cast<int>(shape.size()),
                                          shape.data(), strides.data()),
                 "miopenSetTensorDescriptor");
  }
  ~Tensor() {
    if (desc_) mi().DestroyTensorDescriptor(desc_);
  }
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;
  Tensor(Tensor&& o) noexcept : desc_(o.desc_), dims_(std::move(o.dims_)) { o.desc_ = nullptr; }
  Tensor& operator=(Tensor&& o) noexcept {
    std::swap(desc_, o.desc_);
    std::swap(dims_, o.dims_);
    return *this;
  }
  miopenTensorDescriptor_t get() const { return desc_; }
  const Dims& dims() const { return dims_; }

 private:
  miopenTensorDescriptor_t desc_ = nullptr;
  Dims dims_;
};

// Dims of 5 for miopenOpTensor: `shape` (at most 4 dims) padded with leading unit dims, and a
// unit last dim of stride 1. MIOpen's 5-D tensor kernel (Op5dTensorGeneric) takes the
// strides of the first four dims and assumes 1 for the last, so every real stride reaches it.
Dims op_dims(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides) {
  Dims d{std::vector<int64_t>(5, 1), std::vector<int64_t>(5, 1)};
  const size_t lead = 4 - shape.size();
  for (size_t i = 0; i < shape.size(); ++i) {
    d.shape[lead + i] = shape[i];
    d.strides[lead + i] = std::max<int64_t>(strides[i], 1);  // MIOpen: strides > 0
  }
  return d;
}

// dst = alpha * src + beta * dst for two tensors of one shape and any strides (src may repeat
// elements: stride 0), with MIOpen's tensor ops only: miopenOpTensor max(a, a) on op_dims
// descriptors, or, when src repeats elements (a stride-0 descriptor is refused: "Strides must
// be > 0"), dst zeroed by miopenSetTensor and src added as a broadcast B. Size-1 dims are
// dropped and dims contiguous in both merged; a tensor left with 5 dims is copied in one call
// per index of its outermost dim.
class TensorCopy {
 public:
  TensorCopy() = default;
  TensorCopy(std::vector<int64_t> shape, std::vector<int64_t> src, std::vector<int64_t> dst,
             miopenDataType_t type, size_t element_size) : type_(type), element_size_(element_size) {
    simplify(&shape, &src, &dst);
    if (shape.size() > 4) {
      calls_ = shape[0], src_step_ = src[0], dst_step_ = dst[0];
      shape.erase(shape.begin()), src.erase(src.begin()), dst.erase(dst.begin());
    }
    std::vector<int64_t> src_shape = shape;
    for (size_t i = 0; i < shape.size(); ++i)
      if (src[i] == 0) src_shape[i] = 1, broadcast_ = true;
    src_ = Tensor(op_dims(src_shape, src), type);
    dst_ = Tensor(op_dims(shape, dst), type);
    active_ = true;
  }
  bool active() const { return active_; }

  void run(miopenHandle_t h, const void* src, void* dst, float alpha, float beta) const {
    for (int64_t i = 0; i < calls_; ++i) {
      const char* s = static_cast<const char*>(src) + offset(i * src_step_);
      char* d = static_cast<char*>(dst) + offset(i * dst_step_);
      if (broadcast_) {  // dst = 0 + src (an overlapping src is read, never written: beta 0)
        const float one = 1.f, zero = 0.f;
        check_miopen(mi().SetTensor(h, dst_.get(), d, Scalar(type_, 0).get()),
                     "miopenSetTensor (copy)");
        check_miopen(mi().OpTensor(h, miopenTensorOpAdd, &one, dst_.get(), d, &one, src_.get(), s,
                                   &zero, dst_.get(), d),
                     "miopenOpTensor (copy)");
      } else {
        check_miopen(mi().OpTensor(h, miopenTensorOpMax, &alpha, src_.get(), s, &alpha, src_.get(),
                                   s, &beta, dst_.get(), d),
                     "miopenOpTensor (copy)");
      }
    }
  }

 private:
  size_t offset(int64_t elements) const { return static_cast<size_t>(elements) * element_size_; }
  static void simplify(std::vector<int64_t>* shape, std::vector<int64_t>* src,
                       std::vector<int64_t>* dst) {
    std::vector<int64_t> n, s, d;
    for (size_t i = 0; i < shape->size(); ++i) {
      if ((*shape)[i] == 1) continue;
      if (!n.empty() && s.back() == (*src)[i] * (*shape)[i] && d.back() == (*dst)[i] * (*shape)[i]) {
        n.back() *= (*shape)[i], s.back() = (*src)[i], d.back() = (*dst)[i];  // merged
        continue;
      }
      n.push_back((*shape)[i]), s.push_back((*src)[i]), d.push_back((*dst)[i]);
    }
    if (n.empty()) n = {1}, s = {1}, d = {1};
    *shape = n, *src = s, *dst = d;
  }
  miopenDataType_t type_ = miopenFloat;
  size_t element_size_ = 4;
  Tensor src_, dst_;
  bool broadcast_ = false, active_ = false;
  int64_t calls_ = 1, src_step_ = 0, dst_step_ = 0;
};

// ---- the plan ------------------------------------------------------------------------------

// One of x, w, y as the convolution sees it.
struct Operand {
  bool staged = false;   // a packed copy in the workspace, in the plan's layout
  bool padded = false;   // x in a zero-padded buffer (asymmetric padding)
  size_t offset = 0;     // of the staged copy in the workspace
  size_t bytes = 0;      // of the staged copy
  Tensor full;           // the whole tensor the convolution reads or writes
  TensorCopy copy;       // staged: the caller's tensor into the copy (or out of it, for c)
  size_t interior_bytes = 0;  // padded x: where x starts in `full` (after the lo padding)
  char* data_at(char* base) const { return base + interior_bytes; }
};

// The forward epilogue's view of the packed result r: 5-D op_dims of (N, K, spatial) for NCHW
// and (N * spatial, K) for NHWC, the bias as (1, K, 1) / (1, K) beside it, and one element
// for the constant cells. Every OpTensor then runs MIOpen's 5-D kernel with unit last strides.
struct EpilogueViews {
  Tensor out, bias, cell;
};

enum { X = 0, W = 1, Y = 2 };

struct Solution {
  uint64_t id = 0;
  size_t workspace = 0;
  int algorithm = 0;
};

// An owned miopenActivationDescriptor_t (move-only).
struct Activation {
  miopenActivationDescriptor_t desc = nullptr;
  Activation() = default;
  Activation(Activation&& o) noexcept : desc(o.desc) { o.desc = nullptr; }
  Activation& operator=(Activation&& o) noexcept {
    std::swap(desc, o.desc);
    return *this;
  }
  ~Activation() {
    if (desc) mi().DestroyActivationDescriptor(desc);
  }
};

}  // namespace

struct FDNN_Plan {
  int32_t op = 0;
  int device = 0;
  size_t element_size = 4;
  miopenDataType_t type = miopenFloat;
  Layout layout = Layout::kNCHW;
  Operand operand[3];  // X, W, Y
  int in_a = Y, in_b = W, out = X;  // the direction's (a, b, conv, c) order of operands
  miopenConvolutionDescriptor_t conv = nullptr;
  Solution solution;
  std::string algo_name;
  float alpha = 1.f, beta = 0.f;
  int32_t activation = FDNN_ACTIVATION_NONE;
  float activation_alpha = 0.f, activation_beta = 0.f;
  bool has_bias = false;
  EpilogueViews views;  // forward: the result, the bias and a cell as OpTensor sees them
  TensorCopy bias_in;   // forward: a bias of stride != 1 into a packed one in the workspace
  Tensor dy_nchw;       // backward-weight: dy as the bias gradient reads it (packed NCHW)
  TensorCopy dy_copy;   // dy into dy_nchw, when dy is not NCHW
  Tensor db;            // the bias gradient as MIOpen writes it: K contiguous elements
  TensorCopy db_out;    // db into the caller's, when not written there directly
  size_t dy_nchw_offset = 0, act_offset = 0, cells_offset = 0, db_offset = 0, bias_offset = 0;
  std::vector<Activation> activations;  // descriptors the activation uses, in order
  size_t workspace_size = 0;
  std::string description;
  ~FDNN_Plan() {
    if (conv) mi().DestroyConvolutionDescriptor(conv);
  }
};

namespace {

// The direction's operand order: (a, b, c) = (w, x, y) forward, (dy, w, dx) backward-data,
// (dy, x, dw) backward-weights; c is written.
void set_direction(FDNN_Plan* p) {
  if (p->op == FDNN_CONV_FORWARD) {
    p->in_a = W, p->in_b = X, p->out = Y;
  } else if (p->op == FDNN_CONV_BACKWARD_DATA) {
    p->in_a = Y, p->in_b = W, p->out = X;
  } else {
    p->in_a = Y, p->in_b = X, p->out = W;
  }
}

bool asymmetric(const FDNN_Conv_Plan_Create_Args& a) {
  for (int i = 0; i < a.spatial_rank; ++i)
    if (a.padding_lo[i] != a.padding_hi[i]) return true;
  return false;
}

// MIOpen's spatial parameters (a unit first dim for 1-D).
std::vector<int> spatial(const int64_t* v, int rank, int unit) {
  std::vector<int> out;
  if (rank == 1) out.push_back(unit);
  for (int i = 0; i < rank; ++i) out.push_back(static_cast<int>(v[i]));
  return out;
}

void check_params_int32(const FDNN_Conv_Plan_Create_Args& a) {
  for (int i = 0; i < a.spatial_rank; ++i)
    for (int64_t v : {a.stride[i], a.dilation[i], a.padding_lo[i], a.padding_hi[i]})
      if (v > INT_MAX)
        fail(FDNN_ERROR_UNSUPPORTED, "miopen: stride, dilation or padding %lld is beyond "
             "MIOpen's int32 parameters", static_cast<long long>(v));
  if (a.groups > INT_MAX)
    fail(FDNN_ERROR_UNSUPPORTED, "miopen: groups %lld is beyond int32",
         static_cast<long long>(a.groups));
}

// Lays out one operand: the caller's tensor, whether it is staged (and padded), and the
// descriptor the convolution sees. `lo`/`hi` pad the spatial dims of x (0 elsewhere).
void plan_operand(FDNN_Plan* p, int which, const FDNN_DLTensor* t, int rank, bool pad,
                  const std::vector<int64_t>& lo, const std::vector<int64_t>& hi,
                  bool is_output, size_t* cursor, const char* name) {
  Operand& o = p->operand[which];
  Dims user = canonical(read_dims(t, rank), p->layout);
  check_int32(user, name);
  o.padded = pad;
  o.staged = pad || !is_packed(user, p->layout) || (is_output && p->beta != 0.f);
  std::vector<int64_t> full_shape = user.shape;
  if (pad)
    for (size_t d = 2; d < full_shape.size(); ++d) full_shape[d] += lo[d - 2] + hi[d - 2];
  Dims full = o.staged ? packed(full_shape, p->layout) : user;
  check_int32(full, name);
  o.full = Tensor(full, p->type);
  if (!o.staged) return;
  if (pad)
    for (size_t d = 2; d < full.shape.size(); ++d)
      o.interior_bytes += static_cast<size_t>(lo[d - 2] * full.strides[d]) * p->element_size;
  // The copy between the caller's tensor and the staged one's (interior) elements.
  o.copy = is_output ? TensorCopy(user.shape, full.strides, user.strides, p->type, p->element_size)
                     : TensorCopy(user.shape, user.strides, full.strides, p->type, p->element_size);
  o.bytes = round_up(full.elements() * p->element_size);
  o.offset = *cursor;
  *cursor += o.bytes;
}

// Whether this MIOpen has the DETERMINISTIC attribute: miopenSetConvolutionAttribute came in
// 2.16 with FP16_ALT_IMPL only, DETERMINISTIC in 2.18 (MIOpen commit 95716c2ed,
// ROCm/MIOpen#1551); before, setting it fails "Attribute [1] does not exist".
bool has_deterministic() {
  return mi().SetConvolutionAttribute != nullptr && libraries().version_at_least(2, 18);
}

void plan_convolution(FDNN_Plan* p, const FDNN_Conv_Plan_Create_Args& a, bool pad_copy) {
  check_miopen(mi().CreateConvolutionDescriptor(&p->conv), "miopenCreateConvolutionDescriptor");
  int64_t zero[FDNN_MAX_SPATIAL_DIMS] = {0, 0, 0};
  std::vector<int> pads = spatial(pad_copy ? zero : a.padding_lo, a.spatial_rank, 0);
  std::vector<int> strides = spatial(a.stride, a.spatial_rank, 1);
  std::vector<int> dilations = spatial(a.dilation, a.spatial_rank, 1);
  check_miopen(mi().InitConvolutionNdDescriptor(p->conv, static_cast<int>(pads.size()),
                                                pads.data(), strides.data(), dilations.data(),
                                                miopenConvolution),
               "miopenInitConvolutionNdDescriptor");
  // Groups with dilation too: MIOpen serves both at once (its ValidateGroupCount has no
  // dilation test; PyTorch's Conv_Miopen.cpp passes both).
  if (a.groups > 1)
    check_miopen(mi().SetConvolutionGroupCount(p->conv, static_cast<int>(a.groups)),
                 "miopenSetConvolutionGroupCount");
  if (a.flags & FDNN_CONV_DETERMINISTIC)
    check_miopen(mi().SetConvolutionAttribute(p->conv, MIOPEN_CONVOLUTION_ATTRIB_DETERMINISTIC, 1),
                 "miopenSetConvolutionAttribute(DETERMINISTIC)");
  // float16 backward ops on MI200 default to an alternate implementation through bfloat16
  // (MIOpen docs/conceptual/MI200-alt-implementation.rst): off unless reduced precision is
  // allowed.
  if (p->type == miopenHalf && a.op != FDNN_CONV_FORWARD && mi().SetConvolutionAttribute &&
      !(a.flags & FDNN_CONV_ALLOW_REDUCED_PRECISION))
    check_miopen(mi().SetConvolutionAttribute(p->conv, MIOPEN_CONVOLUTION_ATTRIB_FP16_ALT_IMPL, 0),
                 "miopenSetConvolutionAttribute(FP16_ALT_IMPL)");
}

const Direction& direction(const FDNN_Plan& p) { return mi().direction[p.op]; }

// MIOpen's name of one step of the plan's direction ("miopenConvolutionForwardImmediate").
std::string step_name(const FDNN_Plan& p, const char* step) {
  static const char* const prefix[3] = {"miopenConvolutionForward", "miopenConvolutionBackwardData",
                                        "miopenConvolutionBackwardWeights"};
  return std::string(prefix[p.op]) + step;
}

std::vector<Solution> solutions(const FDNN_Plan& p, miopenHandle_t h) {
  const Direction& d = direction(p);
  auto A = p.operand[p.in_a].full.get(), B = p.operand[p.in_b].full.get();
  auto C = p.operand[p.out].full.get();
  size_t count = 0;
  check_miopen(d.GetSolutionCount(h, A, B, p.conv, C, &count),
               step_name(p, "GetSolutionCount").c_str());
  std::vector<miopenConvSolution_t> found(std::max<size_t>(count, 1));
  size_t returned = 0;
  if (count > 0)
    check_miopen(d.GetSolution(h, A, B, p.conv, C, count, &returned, found.data()),
                 step_name(p, "GetSolution").c_str());
  std::vector<Solution> out;
  for (size_t i = 0; i < returned && i < found.size(); ++i)
    out.push_back({found[i].solution_id, found[i].workspace_size, found[i].algorithm});
  return out;
}

const char* algorithm_name(int a) {
  switch (a) {
    case miopenConvolutionAlgoGEMM: return "GEMM";
    case miopenConvolutionAlgoDirect: return "Direct";
    case miopenConvolutionAlgoFFT: return "FFT";
    case miopenConvolutionAlgoWinograd: return "Winograd";
    case miopenConvolutionAlgoImplicitGEMM: return "ImplicitGEMM";
    case -1: return "given";
    default: return "other";
  }
}

void compile(const FDNN_Plan& p, miopenHandle_t h, uint64_t id) {
  check_miopen(direction(p).CompileSolution(h, p.operand[p.in_a].full.get(),
                                            p.operand[p.in_b].full.get(), p.conv,
                                            p.operand[p.out].full.get(), id),
               step_name(p, "CompileSolution").c_str());
}

// The convolution itself: one immediate-mode call.
void run_convolution(const FDNN_Plan& p, miopenHandle_t h, char* const base[3],
                     const Solution& s, void* workspace) {
  const Operand &A = p.operand[p.in_a], &B = p.operand[p.in_b], &C = p.operand[p.out];
  check_miopen(direction(p).Immediate(h, A.full.get(), base[p.in_a], B.full.get(), base[p.in_b],
                                      p.conv, C.full.get(), base[p.out],
                                      s.workspace ? workspace : nullptr, s.workspace, s.id),
               step_name(p, "Immediate").c_str());
}

// Device buffers for benchmarking: never the caller's tensors, which may hold data a
// candidate must not overwrite (MIOpen's Find writes the outputs). From the caller's
// allocator when it chained one (ABI 2.2: the array library's pool), else hipMalloc. A
// refusal is OUT_OF_MEMORY, on which the heuristic's choice is kept.
struct Scratch {
  const FDNN_Device_Allocator* from = nullptr;
  hipStream_t stream = nullptr;
  std::vector<void*> blocks;
  Scratch(const FDNN_Device_Allocator* a, hipStream_t s) : from(a), stream(s) {}
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() {
    for (void* b : blocks) {
      if (from != nullptr)
        from->release(from->context, b, stream);
      else
        hip().Free(b);
    }
  }
  char* alloc(size_t bytes) {
    void* ptr = nullptr;
    if (from != nullptr) {
      ptr = from->allocate(from->context, std::max<size_t>(bytes, 1), stream);
      if (ptr == nullptr)
        fail(FDNN_ERROR_OUT_OF_MEMORY,
             "miopen: the caller's allocator refused %zu bytes of benchmark scratch", bytes);
    } else {
      check_hip(hip().Malloc(&ptr, std::max<size_t>(bytes, 1)), "hipMalloc (benchmark scratch)");
    }
    blocks.push_back(ptr);
    check_hip(hip().MemsetAsync(ptr, 0, bytes, stream), "hipMemsetAsync");
    return static_cast<char*>(ptr);
  }
};

size_t span_bytes(const Dims& d, size_t element_size) {
  size_t span = 1;
  for (size_t i = 0; i < d.shape.size(); ++i)
    span += static_cast<size_t>(d.shape[i] - 1) * static_cast<size_t>(d.strides[i]);
  return span * element_size;
}

// Times each candidate once (after a warm-up run that also compiles it) into scratch buffers,
// and returns the fastest.
Solution benchmark(const FDNN_Plan& p, miopenHandle_t h, const std::vector<Solution>& cands,
                   hipStream_t stream, const FDNN_Device_Allocator* allocator) {
  Scratch scratch(allocator, stream);
  char* base[3];
  for (int which : {X, W, Y})
    base[which] = scratch.alloc(span_bytes(p.operand[which].full.dims(), p.element_size));
  size_t most = 0;
  for (const Solution& s : cands) most = std::max(most, s.workspace);
  char* workspace = scratch.alloc(most);
  hipEvent_t start = nullptr, stop = nullptr;
  check_hip(hip().EventCreate(&start), "hipEventCreate");
  check_hip(hip().EventCreate(&stop), "hipEventCreate");
  Solution best = cands.front();
  float best_ms = INFINITY;
  std::string first_failure;
  for (const Solution& s : cands) {
    try {
      compile(p, h, s.id);
      run_convolution(p, h, base, s, workspace);  // warm-up
      check_hip(hip().EventRecord(start, stream), "hipEventRecord");
      run_convolution(p, h, base, s, workspace);
      check_hip(hip().EventRecord(stop, stream), "hipEventRecord");
      check_hip(hip().EventSynchronize(stop), "hipEventSynchronize");
      float ms = 0.f;
      check_hip(hip().EventElapsedTime(&ms, start, stop), "hipEventElapsedTime");
      if (ms < best_ms) best_ms = ms, best = s;
    } catch (const Failure& f) {  // a candidate that fails here is no candidate
      if (first_failure.empty()) first_failure = f.what();
    }
  }
  hip().EventDestroy(start);
  hip().EventDestroy(stop);
  if (best_ms == INFINITY)
    fail(FDNN_ERROR_VENDOR, "miopen: no candidate solution ran: %s", first_failure.c_str());
  return best;
}

// The workspace a solution makes the plan need: MIOpen's, then (256-byte aligned) the shim's.
size_t total_workspace(size_t miopen_bytes, size_t cursor) {
  return cursor > 0 ? round_up(miopen_bytes) + cursor : miopen_bytes;
}

// FDNN_ALGO_GIVEN: any id MIOpen finds applicable, listed now or not. GetSolution lists a
// find-db record's solutions once one exists, else the fallback's, so the list can change
// between two plans of one problem (MIOpen's convolutionocl.cpp GetSolutions); the header
// keeps GetSolutionWorkspaceSize "for users who may have serialized the solution id".
Solution given_solution(FDNN_Plan* p, miopenHandle_t h, const FDNN_Conv_Plan_Create_Args& a,
                        size_t cursor) {
  const auto id = static_cast<uint64_t>(a.algo_id);
  Solution s{id, 0, -1};
  const Direction& d = direction(*p);
  if (a.algo_id < 0 ||
      d.GetSolutionWorkspaceSize(h, p->operand[p->in_a].full.get(), p->operand[p->in_b].full.get(),
                                 p->conv, p->operand[p->out].full.get(), id,
                                 &s.workspace) != miopenStatusSuccess)
    fail(FDNN_ERROR_INVALID_ARGUMENT, "miopen: algo_id %lld is not a MIOpen solution for this "
         "problem (%s refuses it)", static_cast<long long>(a.algo_id),
         step_name(*p, "GetSolutionWorkspaceSize").c_str());
  for (const Solution& listed : solutions(*p, h))
    if (listed.id == id) s.algorithm = listed.algorithm;  // for its name, when it is listed
  if (total_workspace(s.workspace, cursor) > a.workspace_limit)
    fail(FDNN_ERROR_UNSUPPORTED, "miopen: solution %lld needs %zu bytes of workspace, over the "
         "limit", static_cast<long long>(a.algo_id), s.workspace);
  compile(*p, h, id);
  return s;
}

Solution choose_solution(FDNN_Plan* p, const FDNN_Conv_Plan_Create_Args& a, size_t cursor) {
  miopenHandle_t h = thread_handle(p->device, a.stream);
  if (a.algo_policy == FDNN_ALGO_GIVEN) return given_solution(p, h, a, cursor);
  std::vector<Solution> all = solutions(*p, h), fit;
  for (const Solution& s : all)
    if (total_workspace(s.workspace, cursor) <= a.workspace_limit) fit.push_back(s);
  if (fit.empty())
    fail(FDNN_ERROR_UNSUPPORTED, "miopen: no MIOpen solution fits the workspace limit of %zu "
         "bytes with the shim's %zu (%zu solutions apply)", a.workspace_limit, cursor, all.size());
  Solution chosen = fit.front();  // MIOpen sorts them fastest first (its heuristic)
  if (a.algo_policy == FDNN_ALGO_BENCHMARK && fit.size() > 1) {
    const auto* allocator = reinterpret_cast<const FDNN_Device_Allocator*>(
        fdnn_shim::find_extension(a.extension_start, FDNN_EXTENSION_DEVICE_ALLOCATOR,
                                  FDNN_Device_Allocator_STRUCT_SIZE, "Conv_Plan_Create"));
    try {
      chosen = benchmark(*p, h, fit, static_cast<hipStream_t>(a.stream), allocator);
    } catch (const Failure& f) {
      if (f.code() != FDNN_ERROR_OUT_OF_MEMORY) throw;
      // No memory to time candidates on: keep MIOpen's heuristic order.
    }
  }
  compile(*p, h, chosen.id);
  return chosen;
}

Activation make_activation(miopenActivationMode_t mode, double alpha, double beta, double gamma) {
  Activation act;
  check_miopen(mi().CreateActivationDescriptor(&act.desc), "miopenCreateActivationDescriptor");
  check_miopen(mi().SetActivationDescriptor(act.desc, mode, alpha, beta, gamma),
               "miopenSetActivationDescriptor");
  return act;
}

// The activation descriptors, in the order apply_activation uses them.
void plan_activation(FDNN_Plan* p) {
  auto add = [&](miopenActivationMode_t m, double al, double be, double ga) {
    p->activations.push_back(make_activation(m, al, be, ga));
  };
  switch (p->activation) {
    case FDNN_ACTIVATION_RELU: add(miopenActivationRELU, 0, 0, 0); break;
    case FDNN_ACTIVATION_LEAKY_RELU: add(miopenActivationLEAKYRELU, p->activation_alpha, 0, 0); break;
    case FDNN_ACTIVATION_SIGMOID: add(miopenActivationLOGISTIC, 0, 0, 0); break;
    case FDNN_ACTIVATION_TANH: add(miopenActivationTANH, 1, 1, 0); break;
    case FDNN_ACTIVATION_SILU: add(miopenActivationLOGISTIC, 0, 0, 0); break;
    case FDNN_ACTIVATION_GELU_TANH:  // v^3 by OpTensor Mul: POWER is 0 for bases <= 1e-6
      add(miopenActivationTANH, 0.7978845608028654 /* sqrt(2/pi) */, 1, 0);  // tanh(k u)
      break;
    default: break;  // NONE; CLIP uses OpTensor Max/Min with two constant cells
  }
}

bool needs_activation_scratch(int32_t act) {
  return act == FDNN_ACTIVATION_SILU || act == FDNN_ACTIVATION_GELU_TANH;
}

size_t take(size_t* cursor, size_t bytes) {
  const size_t at = *cursor;
  *cursor += round_up(bytes);
  return at;
}

// The forward epilogue's views of the packed result (EpilogueViews).
void plan_views(FDNN_Plan* p) {
  const Dims& r = p->operand[Y].full.dims();
  const int64_t N = r.shape[0], K = r.shape[1], S = static_cast<int64_t>(r.elements()) / (N * K);
  const bool nchw = p->layout == Layout::kNCHW;
  p->views.out = nchw ? Tensor(op_dims({N, K, S}, {K * S, S, 1}), p->type)
                      : Tensor(op_dims({N * S, K}, {K, 1}), p->type);
  p->views.bias = nchw ? Tensor(op_dims({1, K, 1}, {K, 1, 1}), p->type)
                       : Tensor(op_dims({1, K}, {K, 1}), p->type);
  p->views.cell = Tensor(op_dims({1}, {1}), p->type);
}

// Forward: a bias of stride != 1 (a view, or one element repeated) is copied packed first.
void plan_bias(FDNN_Plan* p, const FDNN_DLTensor* bias, size_t* cursor) {
  const int64_t K = bias->shape[0], s = K == 1 ? 1 : bias->strides[0];
  if (K > INT_MAX || K * std::max<int64_t>(s, 1) > INT_MAX)
    fail(FDNN_ERROR_UNSUPPORTED, "miopen: bias of %lld elements is beyond int32",
         static_cast<long long>(K));
  if (s == 1) return;
  p->bias_in = TensorCopy({K}, {s}, {1}, p->type, p->element_size);
  p->bias_offset = take(cursor, static_cast<size_t>(K) * p->element_size);
}

// Backward-weight with a bias: dy as MIOpenConvBwdB reads it (each channel's map contiguous:
// NCHW), and db as it writes it (K contiguous elements, whatever the caller's strides, and
// only alpha 1, beta 0).
void plan_bias_gradient(FDNN_Plan* p, const FDNN_DLTensor* db, size_t* cursor) {
  const Dims& dy = p->operand[Y].full.dims();
  const int64_t K = db->shape[0], s = K == 1 ? 1 : db->strides[0];
  Dims contiguous{std::vector<int64_t>(dy.shape.size(), 1), std::vector<int64_t>(dy.shape.size(), 1)};
  contiguous.shape[1] = K;
  contiguous.strides[0] = K;
  p->db = Tensor(contiguous, p->type);
  if (!is_packed(dy, Layout::kNCHW)) {
    Dims nchw = packed(dy.shape, Layout::kNCHW);
    p->dy_nchw = Tensor(nchw, p->type);
    p->dy_copy = TensorCopy(dy.shape, dy.strides, nchw.strides, p->type, p->element_size);
    p->dy_nchw_offset = take(cursor, dy.elements() * p->element_size);
  }
  if (p->alpha != 1.f || p->beta != 0.f || s != 1) {
    p->db_out = TensorCopy({K}, {1}, {s}, p->type, p->element_size);
    p->db_offset = take(cursor, static_cast<size_t>(K) * p->element_size);
  }
}

void lay_out_extras(FDNN_Plan* p, const FDNN_Conv_Plan_Create_Args& a, size_t* cursor) {
  const Operand& out = p->operand[p->out];
  if (needs_activation_scratch(p->activation))
    p->act_offset = take(cursor, span_bytes(out.full.dims(), p->element_size));
  if (p->op == FDNN_CONV_FORWARD) {
    plan_views(p);
    if (p->activation == FDNN_ACTIVATION_CLIP)  // its two bounds, 64 bytes apart
      p->cells_offset = take(cursor, 128);
  }
  if (!p->has_bias) return;
  if (p->op == FDNN_CONV_FORWARD) plan_bias(p, a.bias, cursor);
  if (p->op == FDNN_CONV_BACKWARD_WEIGHT) plan_bias_gradient(p, a.bias, cursor);
}

fdnn_shim::Capabilities capabilities(int32_t op, FDNN_DLDataType dtype);

std::unique_ptr<FDNN_Plan> build_plan(const FDNN_Conv_Plan_Create_Args& a) {
  auto p = std::make_unique<FDNN_Plan>();
  p->op = a.op;
  p->device = a.x->device.device_id;
  p->element_size = fdnn_shim::element_bytes(a.x->dtype);
  p->type = miopen_type(a.x->dtype);
  p->alpha = a.alpha;
  p->beta = a.beta;
  p->activation = a.activation;
  p->activation_alpha = a.activation_alpha;
  p->activation_beta = a.activation_beta;
  p->has_bias = fdnn_shim::has_tensor(a.bias);
  p->description = fdnn_shim::describe_problem(a);
  set_direction(p.get());
  check_params_int32(a);
  // The plan's layout is x's when x is channels-last (NHWC/NDHWC), else NCHW.
  p->layout = is_packed(read_dims(a.x, a.spatial_rank), Layout::kNHWC) &&
                      !is_packed(read_dims(a.x, a.spatial_rank), Layout::kNCHW)
                  ? Layout::kNHWC
                  : Layout::kNCHW;
  const bool pad_copy = asymmetric(a);
  std::vector<int64_t> lo(a.padding_lo, a.padding_lo + a.spatial_rank);
  std::vector<int64_t> hi(a.padding_hi, a.padding_hi + a.spatial_rank);
  if (a.spatial_rank == 1) lo.insert(lo.begin(), 0), hi.insert(hi.begin(), 0);
  size_t cursor = 0;  // the shim's part of the workspace, after MIOpen's
  plan_operand(p.get(), X, a.x, a.spatial_rank, pad_copy, lo, hi, p->out == X, &cursor, "x");
  plan_operand(p.get(), W, a.w, a.spatial_rank, false, lo, hi, p->out == W, &cursor, "w");
  plan_operand(p.get(), Y, a.y, a.spatial_rank, false, lo, hi, p->out == Y, &cursor, "y");
  lay_out_extras(p.get(), a, &cursor);
  plan_convolution(p.get(), a, pad_copy);
  if (a.workspace_limit < cursor)
    fail(FDNN_ERROR_UNSUPPORTED, "miopen: needs %zu bytes of workspace for its copies "
         "(padding, layout, beta), over the limit of %zu", cursor, a.workspace_limit);
  p->solution = choose_solution(p.get(), a, cursor);
  // Shift the shim's parts behind MIOpen's workspace.
  const size_t base = round_up(p->solution.workspace);
  for (Operand& o : p->operand)
    if (o.staged) o.offset += base;
  for (size_t* at : {&p->act_offset, &p->cells_offset, &p->dy_nchw_offset, &p->db_offset,
                     &p->bias_offset})
    *at += base;
  p->workspace_size = total_workspace(p->solution.workspace, cursor);
  plan_activation(p.get());
  p->algo_name = "miopen solution " + std::to_string(p->solution.id) + " (" +
                 algorithm_name(p->solution.algorithm) + ")";
  return p;
}

void with_problem(const std::string& description, const std::function<void()>& body) {
  try {
    body();
  } catch (const Failure& f) {
    throw Failure(f.code(), std::string(f.what()) + " [" + description + "]");
  }
}

void create_plan(FDNN_Conv_Plan_Create_Args* args) {
  fdnn_shim::check_struct_size(args, FDNN_Conv_Plan_Create_Args_STRUCT_SIZE, "Conv_Plan_Create");
  require_usable();
  const FDNN_Conv_Plan_Create_Args& a = *args;
  fdnn_shim::check_conv_problem(a, FDNN_DEVICE_ROCM);
  require_device(a.x->device.device_id);
  fdnn_shim::check_covered(a, capabilities(a.op, a.x->dtype), "miopen");
  // Immediate mode takes no accumulation type: MIOpen's own, float32 (as the CPU shims').
  fdnn_shim::check_compute_type_served(a, "miopen");
  std::unique_ptr<FDNN_Plan> plan;
  with_problem(fdnn_shim::describe_problem(a), [&] {
    DeviceGuard guard(a.x->device.device_id);
    plan = build_plan(a);
  });
  args->workspace_size = plan->workspace_size;
  args->chosen_algo_id = static_cast<int64_t>(plan->solution.id);
  args->algo_name = plan->algo_name.c_str();
  args->plan = plan.release();
}

// ---- execute -------------------------------------------------------------------------------

void stage_inputs(const FDNN_Plan& p, miopenHandle_t h, void* const user[3], char* ws,
                  char* base[3]) {
  for (int which : {X, W, Y}) {
    const Operand& o = p.operand[which];
    base[which] = static_cast<char*>(user[which]);
    if (!o.staged) continue;
    base[which] = ws + o.offset;
    if (which == p.out) continue;  // written by the convolution
    if (o.padded)
      check_miopen(mi().SetTensor(h, o.full.get(), base[which], Scalar(p.type, 0).get()),
                   "miopenSetTensor");
    o.copy.run(h, user[which], o.data_at(base[which]), 1.f, 0.f);
  }
}

void activate(const FDNN_Plan& p, miopenHandle_t h, size_t i, const void* in, void* out) {
  const float one = 1.f, zero = 0.f;  // MIOpen's activations take alpha 1, beta 0 only
  const Tensor& r = p.views.out;
  check_miopen(mi().ActivationForward(h, p.activations[i].desc, &one, r.get(), in, &zero,
                                      r.get(), out),
               "miopenActivationForward");
}

// c = op(a1 * a, a2 * b) on the epilogue's views (B the result's view unless given).
void op_tensor(miopenHandle_t h, miopenTensorOp_t op, const Tensor& view, float a1, const void* a,
               float a2, const void* b, void* c, const Tensor* b_view = nullptr) {
  const float zero = 0.f;
  check_miopen(mi().OpTensor(h, op, &a1, view.get(), a, &a2, (b_view ? *b_view : view).get(), b,
                             &zero, view.get(), c),
               "miopenOpTensor");
}

// act(v) in place, MIOpen's activation modes where one matches, compositions otherwise.
void apply_activation(const FDNN_Plan& p, miopenHandle_t h, void* v, char* ws) {
  void* t = ws + p.act_offset;
  const Tensor& r = p.views.out;
  switch (p.activation) {
    case FDNN_ACTIVATION_NONE: return;
    case FDNN_ACTIVATION_CLIP: {  // max then min against cells written in the tensor's type
      void* lo = ws + p.cells_offset;
      void* hi = ws + p.cells_offset + 64;
      const Tensor& cell = p.views.cell;
      check_miopen(mi().SetTensor(h, cell.get(), lo, Scalar(p.type, p.activation_alpha).get()),
                   "miopenSetTensor");
      check_miopen(mi().SetTensor(h, cell.get(), hi, Scalar(p.type, p.activation_beta).get()),
                   "miopenSetTensor");
      op_tensor(h, miopenTensorOpMax, r, 1.f, v, 1.f, lo, v, &cell);
      op_tensor(h, miopenTensorOpMin, r, 1.f, v, 1.f, hi, v, &cell);
      return;
    }
    case FDNN_ACTIVATION_SILU:  // v * sigmoid(v)
      activate(p, h, 0, v, t);
      op_tensor(h, miopenTensorOpMul, r, 1.f, v, 1.f, t, v);
      return;
    case FDNN_ACTIVATION_GELU_TANH:  // 0.5 v + 0.5 v tanh(sqrt(2/pi) (v + 0.044715 v^3))
      op_tensor(h, miopenTensorOpMul, r, 1.f, v, 1.f, v, t);          // v^2
      op_tensor(h, miopenTensorOpMul, r, 1.f, t, 1.f, v, t);          // v^3
      op_tensor(h, miopenTensorOpAdd, r, 1.f, v, 0.044715f, t, t);    // u
      activate(p, h, 0, t, t);                                         // tanh(k u)
      op_tensor(h, miopenTensorOpMul, r, 0.5f, v, 1.f, t, t);         // 0.5 v tanh
      op_tensor(h, miopenTensorOpAdd, r, 0.5f, v, 1.f, t, v);         // + 0.5 v
      return;
    default: activate(p, h, 0, v, v); return;
  }
}

// The header's alpha * act(conv + bias) on the conv result in place (forward; beta comes
// with the copy out); alpha alone otherwise. alpha scales the activated value, so it comes
// last; ScaleTensor reads it in the tensor's type, and it is strided.
void epilogue(const FDNN_Plan& p, miopenHandle_t h, void* v, const void* bias, char* ws) {
  if (p.op == FDNN_CONV_FORWARD && p.has_bias) {
    if (p.bias_in.active()) {
      p.bias_in.run(h, bias, ws + p.bias_offset, 1.f, 0.f);
      bias = ws + p.bias_offset;
    }
    op_tensor(h, miopenTensorOpAdd, p.views.out, 1.f, v, 1.f, bias, v, &p.views.bias);
  }
  if (p.op == FDNN_CONV_FORWARD) apply_activation(p, h, v, ws);
  if (p.alpha != 1.f)
    check_miopen(mi().ScaleTensor(h, p.operand[p.out].full.get(), v, Scalar(p.type, p.alpha).get()),
                 "miopenScaleTensor");
}

void bias_gradient(const FDNN_Plan& p, miopenHandle_t h, const void* dy_data, void* db, char* ws) {
  const Tensor* src = &p.operand[Y].full;
  if (p.dy_copy.active()) {
    p.dy_copy.run(h, dy_data, ws + p.dy_nchw_offset, 1.f, 0.f);
    src = &p.dy_nchw, dy_data = ws + p.dy_nchw_offset;
  }
  const float one = 1.f, zero = 0.f;
  void* out = p.db_out.active() ? ws + p.db_offset : db;
  check_miopen(mi().ConvolutionBackwardBias(h, &one, src->get(), dy_data, &zero, p.db.get(), out),
               "miopenConvolutionBackwardBias");
  if (p.db_out.active()) p.db_out.run(h, out, db, p.alpha, p.beta);
}

void execute_plan(FDNN_Conv_Plan_Execute_Args* args) {
  fdnn_shim::check_struct_size(args, FDNN_Conv_Plan_Execute_Args_STRUCT_SIZE, "Conv_Plan_Execute");
  const FDNN_Plan& p = fdnn_shim::plan_of<FDNN_Plan>(args->plan, "Conv_Plan_Execute");
  with_problem(p.description, [&] {
    fdnn_shim::check_execute_args(*args, p.element_size, p.workspace_size,
                                  {true, true, true, p.has_bias});
    DeviceGuard guard(p.device);
    miopenHandle_t h = thread_handle(p.device, args->stream);
    char* ws = static_cast<char*>(args->workspace);
    void* const user[3] = {args->x, args->w, args->y};
    char* base[3];
    stage_inputs(p, h, user, ws, base);
    run_convolution(p, h, base, p.solution, ws);
    const Operand& out = p.operand[p.out];
    epilogue(p, h, base[p.out], args->bias, ws);
    if (out.staged) out.copy.run(h, out.data_at(base[p.out]), user[p.out], 1.f, p.beta);
    if (p.op == FDNN_CONV_BACKWARD_WEIGHT && p.has_bias)
      bias_gradient(p, h, base[Y], args->bias, ws);
  });
}

// ---- the table -----------------------------------------------------------------------------

void Error_Destroy(FDNN_Error_Destroy_Args* args) { fdnn_shim::error_destroy(args); }
void Error_Describe(FDNN_Error_Describe_Args* args) { fdnn_shim::error_describe(args); }

FDNN_Error* Shim_Info(FDNN_Shim_Info_Args* args) {
  return fdnn_shim::guarded([&] {
    fdnn_shim::check_struct_size(args, FDNN_Shim_Info_Args_STRUCT_SIZE, "Shim_Info");
    const Libraries& L = libraries();
    args->shim_name = "miopen";
    args->vendor_name = "MIOpen";
    // Built against no vendor header: the declarations of miopen_api.hpp (MIOpen 2.x/3.x).
    args->vendor_version_built = "none (own declarations of MIOpen's C API)";
    args->vendor_version_runtime = L.version.c_str();
    args->shim_version = FLUX_DNN_VERSION_STRING;
    args->device_type = FDNN_DEVICE_ROCM;
    args->num_devices = L.num_devices;
    args->priority = FDNN_PRIORITY_VENDOR;
    args->unavailable_reason = L.why_not.empty() ? nullptr : L.why_not.c_str();
  });
}

const std::vector<std::string>& device_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (int d = 0; d < libraries().num_devices; ++d) {
      char name[256] = {0};
      if (hip().DeviceGetName(name, sizeof name - 1, d) != hipSuccess)
        std::snprintf(name, sizeof name, "AMD GPU %d", d);
      out.push_back(std::string(name) + " (MIOpen " + libraries().version + ")");
    }
    return out;
  }();
  return names;
}

FDNN_Error* Device_Describe(FDNN_Device_Describe_Args* args) {
  return fdnn_shim::guarded([&] {
    fdnn_shim::check_struct_size(args, FDNN_Device_Describe_Args_STRUCT_SIZE, "Device_Describe");
    require_device(args->device_id);
    args->default_flags = 0;  // MIOpen has no TF32-like mode for float32 to default to
    args->name = device_names()[static_cast<size_t>(args->device_id)].c_str();
  });
}

// MIOpen convolves float32 and float16 here, 2-D and 3-D (1-D as 2-D). Every activation but
// the erf GELU is MIOpen's own or composed of its tensor ops. bfloat16 is not served: MIOpen
// convolves it, but has none of the tensor ops the ABI's basics need around a convolution
// (strided and channels-last staging, bias): miopenOpTensor's kernels define no bfloat16,
// miopenScaleTensor refuses it, miopenActivationForward returns NotImplemented
// (docs/reference/datatypes.rst: bfloat16 is for convolutions, tensor set and tensor copy).
fdnn_shim::Capabilities capabilities(int32_t op, FDNN_DLDataType t) {
  const bool f16 = t.lanes == 1 && t.code == FDNN_DTYPE_FLOAT && t.bits == 16;
  const bool f32 = t.lanes == 1 && t.code == FDNN_DTYPE_FLOAT && t.bits == 32;
  const bool f64 = t.lanes == 1 && t.code == FDNN_DTYPE_FLOAT && t.bits == 64;
  const bool bf16 = t.lanes == 1 && t.code == FDNN_DTYPE_BFLOAT && t.bits == 16;
  if (f64) return fdnn_shim::not_computed("MIOpen has no float64 convolution");
  if (bf16)
    return fdnn_shim::not_computed(
        "MIOpen has no bfloat16 tensor ops (OpTensor, ScaleTensor, activations) for the bias, "
        "epilogue and strided or channels-last copies around its bfloat16 convolutions");
  if (!(f16 || f32))
    return fdnn_shim::not_computed("MIOpen convolutions take float32 and float16 here");
  fdnn_shim::Capabilities c;
  c.support = FDNN_SUPPORT_NATIVE;
  c.detail = "MIOpen kernels; gelu (erf) is not fused: MIOpen has no erf activation";
  c.spatial_ranks = fdnn_shim::kRanks1To3;
  c.activations = fdnn_shim::activations_of_op(
      op, fdnn_shim::kEveryActivation & ~(1u << FDNN_ACTIVATION_GELU_ERF));
  c.features = FDNN_FEATURE_GROUPS | FDNN_FEATURE_DILATION | FDNN_FEATURE_ALPHA_BETA |
               FDNN_FEATURE_BENCHMARK;
  if (op == FDNN_CONV_BACKWARD_WEIGHT) c.features |= FDNN_FEATURE_BIAS_GRADIENT;
  if (has_deterministic()) c.features |= FDNN_FEATURE_DETERMINISTIC;
  // float16 backward ops may run MI200's bfloat16 alternate implementation when allowed.
  if (f16 && op != FDNN_CONV_FORWARD && mi().SetConvolutionAttribute)
    c.features |= FDNN_FEATURE_REDUCED_PRECISION;
  return c;
}

FDNN_Error* Conv_Capabilities(FDNN_Conv_Capabilities_Args* args) {
  return fdnn_shim::conv_capabilities(args, [](int32_t device_id, int32_t op, FDNN_DLDataType t) {
    require_device(device_id);
    return capabilities(op, t);
  });
}

FDNN_Error* Conv_Plan_Create(FDNN_Conv_Plan_Create_Args* args) {
  return fdnn_shim::guarded([&] { create_plan(args); });
}

FDNN_Error* Conv_Plan_Execute(FDNN_Conv_Plan_Execute_Args* args) {
  return fdnn_shim::guarded([&] { execute_plan(args); });
}

void Plan_Destroy(FDNN_Plan_Destroy_Args* args) {
  if (args == nullptr || args->plan == nullptr) return;
  try {
    delete args->plan;
  } catch (...) {
  }
}

const FDNN_Api kApi = {
    FDNN_Api_STRUCT_SIZE,
    FDNN_ABI_MAJOR,
    FDNN_ABI_MINOR,
    nullptr,  // extension_start
    Error_Destroy,
    Error_Describe,
    Shim_Info,
    Device_Describe,
    Conv_Capabilities,
    Conv_Plan_Create,
    Conv_Plan_Execute,
    Plan_Destroy,
    nullptr,  // Conv_Plan_Pack_Weights: MIOpen reads w as it is
};

}  // namespace

extern "C" FDNN_EXPORT const FDNN_Api* fdnn_get_api(void) { return &kApi; }
