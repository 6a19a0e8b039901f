// The MIOpen shim: flux_dnn's ABI (flux_dnn.h) over MIOpen's immediate-mode convolution API
// on AMD GPUs. MIOpen and HIP are dlopened (miopen_lib.cpp); their declarations are ours
// (miopen_api.hpp). It has never run on an AMD GPU: tests/doubles/miopen checks its plumbing.
//
// MIOpen's gaps, closed here rather than passed on to the caller:
//  - 1-D convolutions: 2-D with a unit height;
//  - asymmetric padding (MIOpen pads symmetrically): x is copied into a zero-padded buffer in
//    the workspace (forward, backward-weight), or dx is computed into one and its interior
//    copied out (backward-data); never dropped;
//  - grouped + dilated convolutions: one call per group on channel slices;
//  - alpha/beta (immediate mode takes none), bias, activations: MIOpen's own tensor ops
//    (miopenOpTensor, miopenScaleTensor, miopenActivationForward) on the conv result;
//  - tensors not packed in one layout (MIOpen reads the layout from the strides and wants x,
//    w and y alike): copied into packed buffers of x's layout in the workspace;
//  - the bias gradient of an NHWC dy: dy copied to NCHW first (MIOpen's bias kernels are
//    NCHW only).
// Layout of the caller's workspace: [MIOpen's | staged x | staged w | staged y | activation
// scratch | dy in NCHW | two constant cells], each part 256-byte aligned.
#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

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

// One MIOpen handle per device and thread (handles are not thread-safe); the stream is set
// on every call, so the work is ordered on the caller's stream.
miopenHandle_t thread_handle(int device, void* stream) {
  struct Handles {
    std::map<int, miopenHandle_t> by_device;
    // At thread exit, destroying handles could run after the HIP runtime is gone: left to
    // the process's end, as PyTorch does with its pools.
  };
  thread_local Handles handles;
  miopenHandle_t& h = handles.by_device[device];
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

// ---- the plan ------------------------------------------------------------------------------

// One of x, w, y as the convolution sees it.
struct Operand {
  bool staged = false;   // a packed copy in the workspace, in the plan's layout
  bool padded = false;   // x in a zero-padded buffer (asymmetric padding)
  size_t offset = 0;     // of the staged copy in the workspace
  size_t bytes = 0;      // of the staged copy
  int64_t group_step = 0;  // elements between the channel slices of two groups
  Tensor user;           // the caller's tensor
  Tensor full;           // the whole tensor the convolution reads or writes
  Tensor interior;       // padded x: the view of `full` that holds x; else unused
  Tensor conv;           // what one convolution call sees (a group's slice, or `full`)
  size_t interior_bytes = 0;  // padded x: where x starts in `full` (after the lo padding)
  const Tensor& data_view() const { return padded ? interior : full; }
  char* data_at(char* base) const { return base + interior_bytes; }
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
  int64_t group_calls = 1;  // > 1: one call per group (grouped + dilated)
  Solution solution;
  std::string algo_name;
  float alpha = 1.f, beta = 0.f;
  int32_t activation = FDNN_ACTIVATION_NONE;
  float activation_alpha = 0.f, activation_beta = 0.f;
  bool has_bias = false;
  Tensor bias;        // (1, K, 1, 1[, 1]) for the forward bias and the bias gradient
  Tensor dy_nchw;     // dy copied to NCHW for the bias gradient, when dy is not NCHW
  size_t dy_nchw_offset = 0, act_offset = 0, cells_offset = 0, db_offset = 0;
  Tensor cell;        // one element, broadcast (clip bounds)
  Tensor db_scratch;  // the bias gradient before alpha/beta
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

bool any_dilation(const FDNN_Conv_Plan_Create_Args& a) {
  for (int i = 0; i < a.spatial_rank; ++i)
    if (a.dilation[i] != 1) return true;
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
// descriptors the convolution sees. `lo`/`hi` pad the spatial dims of x (0 elsewhere).
void plan_operand(FDNN_Plan* p, int which, const FDNN_DLTensor* t, int rank, bool pad,
                  const std::vector<int64_t>& lo, const std::vector<int64_t>& hi,
                  bool is_output, size_t* cursor, const char* name) {
  Operand& o = p->operand[which];
  Dims user = canonical(read_dims(t, rank), p->layout);
  check_int32(user, name);
  o.user = Tensor(user, p->type);
  o.padded = pad;
  o.staged = pad || !is_packed(user, p->layout) || (is_output && p->beta != 0.f);
  std::vector<int64_t> full_shape = user.shape;
  if (pad)
    for (size_t d = 2; d < full_shape.size(); ++d) full_shape[d] += lo[d - 2] + hi[d - 2];
  Dims full = o.staged ? packed(full_shape, p->layout) : user;
  check_int32(full, name);
  o.full = Tensor(full, p->type);
  if (pad) {
    Dims interior{user.shape, full.strides};
    o.interior = Tensor(interior, p->type);
    for (size_t d = 2; d < full.shape.size(); ++d)
      o.interior_bytes += static_cast<size_t>(lo[d - 2] * full.strides[d]) * p->element_size;
  }
  if (o.staged) {
    o.bytes = round_up(full.elements() * p->element_size);
    o.offset = *cursor;
    *cursor += o.bytes;
  }
}

// The group slices of one call: the channel dim (w's K) divided by the number of calls.
void plan_slices(FDNN_Plan* p, int64_t calls) {
  p->group_calls = calls;
  for (int which : {X, W, Y}) {
    Operand& o = p->operand[which];
    Dims d = o.full.dims();
    const size_t channel = which == W ? 0 : 1;
    d.shape[channel] /= calls;
    o.group_step = d.shape[channel] * d.strides[channel];
    o.conv = Tensor(d, p->type);
  }
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
  // MIOpen has no grouped convolution with dilation: one call per group instead.
  const bool per_group = a.groups > 1 && any_dilation(a);
  if (a.groups > 1 && !per_group)
    check_miopen(mi().SetConvolutionGroupCount(p->conv, static_cast<int>(a.groups)),
                 "miopenSetConvolutionGroupCount");
  if (a.flags & FDNN_CONV_DETERMINISTIC)
    check_miopen(mi().SetConvolutionAttribute(p->conv, MIOPEN_CONVOLUTION_ATTRIB_DETERMINISTIC, 1),
                 "miopenSetConvolutionAttribute(DETERMINISTIC)");
  plan_slices(p, per_group ? a.groups : 1);
}

const Direction& direction(const FDNN_Plan& p) { return mi().direction[p.op]; }

std::vector<Solution> solutions(const FDNN_Plan& p, miopenHandle_t h) {
  const Direction& d = direction(p);
  auto A = p.operand[p.in_a].conv.get(), B = p.operand[p.in_b].conv.get();
  auto C = p.operand[p.out].conv.get();
  size_t count = 0;
  check_miopen(d.GetSolutionCount(h, A, B, p.conv, C, &count), "GetSolutionCount");
  std::vector<miopenConvSolution_t> found(std::max<size_t>(count, 1));
  size_t returned = 0;
  if (count > 0)
    check_miopen(d.GetSolution(h, A, B, p.conv, C, count, &returned, found.data()),
                 "GetSolution");
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
    default: return "other";
  }
}

void compile(const FDNN_Plan& p, miopenHandle_t h, uint64_t id) {
  check_miopen(direction(p).CompileSolution(h, p.operand[p.in_a].conv.get(),
                                            p.operand[p.in_b].conv.get(), p.conv,
                                            p.operand[p.out].conv.get(), id),
               "CompileSolution");
}

// The convolution itself: one immediate-mode call per group slice (one in all otherwise).
void run_convolution(const FDNN_Plan& p, miopenHandle_t h, char* const base[3],
                     const Solution& s, void* workspace) {
  const Operand &A = p.operand[p.in_a], &B = p.operand[p.in_b], &C = p.operand[p.out];
  for (int64_t g = 0; g < p.group_calls; ++g) {
    auto at = [&](const Operand& o, int which) {
      return base[which] + static_cast<size_t>(g * o.group_step) * p.element_size;
    };
    check_miopen(direction(p).Immediate(h, A.conv.get(), at(A, p.in_a), B.conv.get(),
                                        at(B, p.in_b), p.conv, C.conv.get(), at(C, p.out),
                                        s.workspace ? workspace : nullptr, s.workspace, s.id),
                 "Immediate");
  }
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

Solution choose_solution(FDNN_Plan* p, const FDNN_Conv_Plan_Create_Args& a, size_t budget) {
  miopenHandle_t h = thread_handle(p->device, a.stream);
  std::vector<Solution> all = solutions(*p, h), fit;
  for (const Solution& s : all)
    if (s.workspace <= budget) fit.push_back(s);
  if (a.algo_policy == FDNN_ALGO_GIVEN) {
    for (const Solution& s : all)
      if (static_cast<int64_t>(s.id) == a.algo_id) {
        if (s.workspace > budget)
          fail(FDNN_ERROR_UNSUPPORTED, "miopen: solution %lld needs %zu bytes of workspace, "
               "over the limit", static_cast<long long>(a.algo_id), s.workspace);
        compile(*p, h, s.id);
        return s;
      }
    fail(FDNN_ERROR_INVALID_ARGUMENT, "miopen: algo_id %lld is not a MIOpen solution for "
         "this problem (%zu solutions apply)", static_cast<long long>(a.algo_id), all.size());
  }
  if (fit.empty())
    fail(FDNN_ERROR_UNSUPPORTED, "miopen: no MIOpen solution fits the workspace limit of %zu "
         "bytes (%zu solutions apply)", budget, all.size());
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
    case FDNN_ACTIVATION_GELU_TANH:
      add(miopenActivationPOWER, 0, 1, 3);                          // v^3
      add(miopenActivationTANH, 0.7978845608028654 /* sqrt(2/pi) */, 1, 0);       // tanh(k u)
      add(miopenActivationPOWER, 1, 1, 1);                          // 1 + t
      break;
    default: break;  // NONE; CLIP uses OpTensor Max/Min with two constant cells
  }
}

bool needs_activation_scratch(int32_t act) {
  return act == FDNN_ACTIVATION_SILU || act == FDNN_ACTIVATION_GELU_TANH;
}

void lay_out_extras(FDNN_Plan* p, const FDNN_Conv_Plan_Create_Args& a, size_t* cursor) {
  const Operand& out = p->operand[p->out];
  if (needs_activation_scratch(p->activation)) {
    p->act_offset = *cursor;
    *cursor += round_up(span_bytes(out.full.dims(), p->element_size));
  }
  if (p->activation == FDNN_ACTIVATION_CLIP) {
    p->cells_offset = *cursor;
    *cursor += kAlign;
    Dims one{std::vector<int64_t>(out.full.dims().shape.size(), 1),
             std::vector<int64_t>(out.full.dims().shape.size(), 1)};
    p->cell = Tensor(one, p->type);
  }
  if (!p->has_bias) return;
  const int64_t K = a.bias->shape[0], s = a.bias->strides[0];
  const size_t nd = out.full.dims().shape.size();
  Dims b{std::vector<int64_t>(nd, 1), std::vector<int64_t>(nd, 1)};
  b.shape[1] = K;
  b.strides[1] = s;
  b.strides[0] = K * s;
  if (K > INT_MAX || K * s > INT_MAX)
    fail(FDNN_ERROR_UNSUPPORTED, "miopen: bias of %lld elements is beyond int32",
         static_cast<long long>(K));
  p->bias = Tensor(b, p->type);
  if (p->op != FDNN_CONV_BACKWARD_WEIGHT) return;
  const Operand& dy = p->operand[Y];
  if (!is_packed(dy.full.dims(), Layout::kNCHW)) {
    p->dy_nchw = Tensor(packed(dy.full.dims().shape, Layout::kNCHW), p->type);
    p->dy_nchw_offset = *cursor;
    *cursor += round_up(dy.full.dims().elements() * p->element_size);
  }
  if (p->alpha != 1.f || p->beta != 0.f) {  // MIOpen's bias gradient takes (1, 0) only
    p->db_offset = *cursor;
    *cursor += round_up(static_cast<size_t>(K) * p->element_size);
    Dims db = packed(b.shape, Layout::kNCHW);
    p->db_scratch = Tensor(db, p->type);
  }
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
  const size_t budget = a.workspace_limit == SIZE_MAX ? SIZE_MAX : a.workspace_limit - cursor;
  p->solution = choose_solution(p.get(), a, budget);
  // Shift the shim's parts behind MIOpen's workspace.
  const size_t base = round_up(p->solution.workspace);
  for (Operand& o : p->operand)
    if (o.staged) o.offset += base;
  p->act_offset += base, p->cells_offset += base, p->dy_nchw_offset += base, p->db_offset += base;
  p->workspace_size = cursor > 0 ? base + cursor : p->solution.workspace;
  plan_activation(p.get());
  p->algo_name = "miopen solution " + std::to_string(p->solution.id) + " (" +
                 algorithm_name(p->solution.algorithm) + ")" +
                 (p->group_calls > 1 ? ", one call per group" : "");
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

// dst = alpha * src + beta * dst through miopenOpTensor: max(a, a) is a, exactly.
void copy(miopenHandle_t h, const Tensor& src_desc, const void* src, const Tensor& dst_desc,
          void* dst, float alpha, float beta) {
  check_miopen(mi().OpTensor(h, miopenTensorOpMax, &alpha, src_desc.get(), src, &alpha,
                             src_desc.get(), src, &beta, dst_desc.get(), dst),
               "miopenOpTensor (copy)");
}

void stage_inputs(const FDNN_Plan& p, miopenHandle_t h, void* const user[3], char* ws,
                  char* base[3]) {
  for (int which : {X, W, Y}) {
    const Operand& o = p.operand[which];
    base[which] = static_cast<char*>(user[which]);
    if (!o.staged) continue;
    base[which] = ws + o.offset;
    if (which == p.out) continue;  // written by the convolution
    const float zero = 0.f;
    if (o.padded) check_miopen(mi().SetTensor(h, o.full.get(), base[which], &zero), "miopenSetTensor");
    copy(h, o.user, user[which], o.data_view(), o.data_at(base[which]), 1.f, 0.f);
  }
}

void activate(const FDNN_Plan& p, miopenHandle_t h, const Tensor& r, void* out, size_t i,
              const Tensor& src, const void* in) {
  const float one = 1.f, zero = 0.f;
  check_miopen(mi().ActivationForward(h, p.activations[i].desc, &one, src.get(), in, &zero,
                                      r.get(), out),
               "miopenActivationForward");
}

void op_tensor(miopenHandle_t h, miopenTensorOp_t op, float a1, const Tensor& A, const void* a,
               float a2, const Tensor& B, const void* b, const Tensor& C, void* c) {
  const float zero = 0.f;
  check_miopen(mi().OpTensor(h, op, &a1, A.get(), a, &a2, B.get(), b, &zero, C.get(), c),
               "miopenOpTensor");
}

// act(r) in place, MIOpen's activation modes where one matches, compositions otherwise.
void apply_activation(const FDNN_Plan& p, miopenHandle_t h, const Tensor& r, void* v, char* ws) {
  void* t = ws + p.act_offset;
  switch (p.activation) {
    case FDNN_ACTIVATION_NONE: return;
    case FDNN_ACTIVATION_CLIP: {
      void* lo = ws + p.cells_offset;
      void* hi = ws + p.cells_offset + 64;
      check_miopen(mi().SetTensor(h, p.cell.get(), lo, &p.activation_alpha), "miopenSetTensor");
      check_miopen(mi().SetTensor(h, p.cell.get(), hi, &p.activation_beta), "miopenSetTensor");
      op_tensor(h, miopenTensorOpMax, 1.f, r, v, 1.f, p.cell, lo, r, v);
      op_tensor(h, miopenTensorOpMin, 1.f, r, v, 1.f, p.cell, hi, r, v);
      return;
    }
    case FDNN_ACTIVATION_SILU:  // v * sigmoid(v)
      activate(p, h, r, t, 0, r, v);
      op_tensor(h, miopenTensorOpMul, 1.f, r, v, 1.f, r, t, r, v);
      return;
    case FDNN_ACTIVATION_GELU_TANH:  // 0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3)))
      activate(p, h, r, t, 0, r, v);
      op_tensor(h, miopenTensorOpAdd, 1.f, r, v, 0.044715f, r, t, r, t);
      activate(p, h, r, t, 1, r, t);
      activate(p, h, r, t, 2, r, t);
      op_tensor(h, miopenTensorOpMul, 0.5f, r, v, 1.f, r, t, r, v);
      return;
    default: activate(p, h, r, v, 0, r, v); return;
  }
}

// The header's alpha * act(conv + bias) on the conv result in place (forward; beta comes
// with the copy out); alpha alone otherwise. alpha scales the activated value, so it comes
// last.
void epilogue(const FDNN_Plan& p, miopenHandle_t h, const Tensor& r, void* v, const void* bias,
              char* ws) {
  if (p.op == FDNN_CONV_FORWARD && p.has_bias)
    op_tensor(h, miopenTensorOpAdd, 1.f, r, v, 1.f, p.bias, bias, r, v);
  if (p.op == FDNN_CONV_FORWARD) apply_activation(p, h, r, v, ws);
  if (p.alpha != 1.f) check_miopen(mi().ScaleTensor(h, r.get(), v, &p.alpha), "miopenScaleTensor");
}

void bias_gradient(const FDNN_Plan& p, miopenHandle_t h, const Tensor& dy, const void* dy_data,
                   void* db, char* ws) {
  const Tensor* src = &dy;
  const void* src_data = dy_data;
  if (p.dy_nchw.get() != nullptr) {
    copy(h, dy, dy_data, p.dy_nchw, ws + p.dy_nchw_offset, 1.f, 0.f);
    src = &p.dy_nchw, src_data = ws + p.dy_nchw_offset;
  }
  const float one = 1.f, zero = 0.f;
  const bool plain = p.alpha == 1.f && p.beta == 0.f;
  void* out = plain ? db : ws + p.db_offset;
  const Tensor& out_desc = plain ? p.bias : p.db_scratch;
  check_miopen(mi().ConvolutionBackwardBias(h, &one, src->get(), src_data, &zero,
                                            out_desc.get(), out),
               "miopenConvolutionBackwardBias");
  if (!plain) copy(h, p.db_scratch, out, p.bias, db, p.alpha, p.beta);
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
    epilogue(p, h, out.full, base[p.out], args->bias, ws);
    if (out.staged)
      copy(h, out.data_view(), out.data_at(base[p.out]), out.user, user[p.out], 1.f, p.beta);
    if (p.op == FDNN_CONV_BACKWARD_WEIGHT && p.has_bias)
      bias_gradient(p, h, p.operand[Y].full, base[Y], args->bias, ws);
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

// MIOpen convolves float32, float16 and bfloat16 (no float64), 2-D and 3-D (1-D as 2-D here).
// Every activation but the erf GELU is MIOpen's own or composed of its tensor ops.
fdnn_shim::Capabilities capabilities(int32_t op, FDNN_DLDataType t) {
  const bool f16 = t.lanes == 1 && t.code == FDNN_DTYPE_FLOAT && t.bits == 16;
  const bool f32 = t.lanes == 1 && t.code == FDNN_DTYPE_FLOAT && t.bits == 32;
  const bool f64 = t.lanes == 1 && t.code == FDNN_DTYPE_FLOAT && t.bits == 64;
  const bool bf16 = t.lanes == 1 && t.code == FDNN_DTYPE_BFLOAT && t.bits == 16;
  if (f64) return fdnn_shim::not_computed("MIOpen has no float64 convolution");
  if (!(f16 || f32 || bf16))
    return fdnn_shim::not_computed("MIOpen convolutions take float32, float16 and bfloat16");
  fdnn_shim::Capabilities c;
  c.support = FDNN_SUPPORT_NATIVE;
  c.detail = bf16 && op == FDNN_CONV_BACKWARD_WEIGHT
                 ? "MIOpen kernels; no bias gradient: MIOpen's bias kernels have no bfloat16"
                 : "MIOpen kernels; gelu (erf) is not fused: MIOpen has no erf activation";
  c.spatial_ranks = fdnn_shim::kRanks1To3;
  c.activations = fdnn_shim::activations_of_op(
      op, fdnn_shim::kEveryActivation & ~(1u << FDNN_ACTIVATION_GELU_ERF));
  c.features = FDNN_FEATURE_GROUPS | FDNN_FEATURE_DILATION | FDNN_FEATURE_ALPHA_BETA |
               FDNN_FEATURE_BENCHMARK;
  if (op == FDNN_CONV_BACKWARD_WEIGHT && !bf16) c.features |= FDNN_FEATURE_BIAS_GRADIENT;
  if (mi().SetConvolutionAttribute != nullptr) c.features |= FDNN_FEATURE_DETERMINISTIC;
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
