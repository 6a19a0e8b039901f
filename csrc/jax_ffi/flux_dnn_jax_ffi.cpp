// XLA FFI handler: flux_dnn convolutions inside JAX programs, on XLA's own buffers.
//
// Two handlers, FluxDnnConvGeneral (host buffers) and FluxDnnConvGeneralCuda (device buffers,
// XLA's CUDA stream and scratch memory), run forward, backward-data or backward-weight
// through a shim's ABI table (flux_dnn.h); they differ only in where the buffers, stream and
// workspace come from. JAX registers them under one target name, per platform. A plain
// shared library with no Python and no CUDA headers in it (the stream is an opaque pointer),
// loaded by flux_dnn.jax through ctypes. Loading and checking the shim, plan keys, the plan
// cache and the error kinds are the client library's (csrc/client/), as in flux_dnn._core;
// this file is the XLA binding only.
//
// Operands (dense row-major in their own dim order, as XLA hands them to a custom call):
//   forward          a = x (N, C, *sp),  b = w (K, C/g, *k),  out = y (N, K, *out)
//   backward-data    a = dy,              b = w,               out = dx
//   backward-weight  a = x,               b = dy,              out = dw
// in any dim order: attribute `a_spec` (and `b_spec`, `out_spec`) says which dim of the
// operand holds each of the roles' dims in the order above (jax.lax's dimension numbers), and
// the shim gets the operand through strides, so no layout is transposed to suit us.
// Under jax.vmap (vmap_method "expand_dims") every operand carries the same leading batch
// dims, of size 1 where it is not batched: the handler folds them into N when only the data
// operand is batched and N is its outermost dim, and otherwise runs one convolution per
// batch element.
//
// The shim is named by its registered name (attribute `shim`, e.g. "onednn") and the ABI
// major the program was traced for (`abi_major`), never by a path: a program saved with
// jax.export runs on any install. flux_dnn.jax tells the handler where each installed shim's
// library lies (FluxDnnJaxRegisterShim) when it registers the handler.
//
// Attribute `flags` is FDNN_CONV_* bits, or -1 for the device's default flags (Device_Describe:
// TF32 on NVIDIA), which is what the Python path passes when the user says nothing;
// `algo_policy` and `algo_id` are the ABI's algorithm policy.
// A warm call (its plan cached) allocates nothing.

#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "client/error.hpp"
#include "client/plan.hpp"
#include "client/shim.hpp"
#include "flux_dnn/flux_dnn.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using fdnn_client::ErrorKind;
using fdnn_client::Plan;
using fdnn_client::Shim;

ffi::ErrorCode code_of(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidArgument: return ffi::ErrorCode::kInvalidArgument;
    case ErrorKind::kUnsupported: return ffi::ErrorCode::kUnimplemented;
    case ErrorKind::kShimLoad:
    case ErrorKind::kUnavailable: return ffi::ErrorCode::kUnavailable;
    case ErrorKind::kOutOfMemory: return ffi::ErrorCode::kResourceExhausted;
    case ErrorKind::kVendor:
    case ErrorKind::kInternal: break;
  }
  return ffi::ErrorCode::kInternal;
}

ffi::Error to_ffi_error(const fdnn_client::Error& error) {
  return ffi::Error(code_of(error.kind()), std::string("flux_dnn: ") + error.what());
}

bool dtype_of(ffi::DataType t, FDNN_DLDataType* out) {
  switch (t) {
    case ffi::DataType::F64: *out = {FDNN_DTYPE_FLOAT, 64, 1}; return true;
    case ffi::DataType::F32: *out = {FDNN_DTYPE_FLOAT, 32, 1}; return true;
    case ffi::DataType::F16: *out = {FDNN_DTYPE_FLOAT, 16, 1}; return true;
    case ffi::DataType::BF16: *out = {FDNN_DTYPE_BFLOAT, 16, 1}; return true;
    default: return false;
  }
}

constexpr int kItemRank = FDNN_MAX_SPATIAL_DIMS + 2;

// One problem's tensor (no vmapped dims) on `device`: an operand dense in its own dim order
// (`dims`), seen in the roles' order through `spec` (role dim i is operand dim spec[i]).
// `data` is set to the first element of its least aligned batch element: the plan is keyed
// by it.
struct Tensor {
  int64_t shape[kItemRank] = {};
  int64_t strides[kItemRank] = {};
  FDNN_DLTensor desc{};
  Tensor(const int64_t* dims, const int64_t* spec, int32_t rank, FDNN_DLDataType dt, FDNN_DLDevice device) {
    int64_t compact[kItemRank] = {}, step = 1;
    for (int32_t i = rank; i-- > 0;) {
      compact[i] = step;
      step *= dims[i];
    }
    for (int32_t i = 0; i < rank; ++i) {
      shape[i] = dims[spec[i]];
      strides[i] = compact[spec[i]];
    }
    desc.device = device;
    desc.ndim = rank;
    desc.dtype = dt;
    desc.shape = shape;
    desc.strides = strides;
  }
  int64_t size() const {
    int64_t n = 1;
    for (int32_t i = 0; i < desc.ndim; ++i) n *= shape[i];
    return n;
  }
};

// ---------------------------------------------------------------------------------------
// The handlers

struct Operand {
  char* data;
  ffi::Span<const int64_t> dims;  // leading (vmapped) dims, then the item's
  int64_t lead_rank;
  int64_t item[kItemRank];  // the N, C, *sp or K, C/g, *k dims
  int64_t item_bytes;
  int64_t lead(int64_t i) const { return dims[i]; }
};

Operand operand(void* data, ffi::Span<const int64_t> dims, int64_t lead_rank, int64_t elem_bytes) {
  Operand o{static_cast<char*>(data), dims, lead_rank, {}, elem_bytes};
  for (int64_t i = lead_rank; i < static_cast<int64_t>(dims.size()); ++i) {
    o.item[i - lead_rank] = dims[i];
    o.item_bytes *= dims[i];
  }
  return o;
}

bool lead_all_ones(const Operand& o) {
  for (int64_t i = 0; i < o.lead_rank; ++i)
    if (o.lead(i) != 1) return false;
  return true;
}

bool same_lead(const Operand& a, const Operand& b) {
  for (int64_t i = 0; i < a.lead_rank; ++i)
    if (a.lead(i) != b.lead(i)) return false;
  return true;
}

// Byte offset of batch element `flat` (row-major over the output's leading dims) in operand
// o, broadcasting o's size-1 leading dims.
int64_t offset_of(const Operand& o, const Operand& out, int64_t flat) {
  int64_t offset = 0, step = 1;
  for (int64_t i = o.lead_rank; i-- > 0;) {
    const int64_t index = flat % out.lead(i);
    flat /= out.lead(i);
    if (o.lead(i) != 1) offset += index * step;
    step *= o.lead(i);
  }
  return offset * o.item_bytes;
}

// The alignment of p up to 16 bytes, as plan keys count it.
uintptr_t alignment_of(const char* p) {
  const uintptr_t bits = reinterpret_cast<uintptr_t>(p) | 16;
  return bits & (~bits + 1);  // the lowest set bit
}

// The first element of o's least aligned batch element among `calls` (alignment repeats
// every 16 elements at most): the alignment the plan may assume for all of them.
char* least_aligned(const Operand& o, const Operand& out, int64_t calls) {
  char* worst = o.data;
  for (int64_t i = 1; i < calls && i < 16; ++i) {
    char* p = o.data + offset_of(o, out, i);
    if (alignment_of(p) < alignment_of(worst)) worst = p;
  }
  return worst;
}

// Where a call runs: the buffers' device, the stream to enqueue on (NULL on CPU) and how to
// get `bytes` of workspace on that device (NULL: allocation failed; valid until the handler
// returns).
struct Target {
  FDNN_DLDevice device;
  void* stream;
  std::function<void*(size_t bytes)> workspace;
};

// The cached plan for these tensors, made on a miss. Keys are written into this thread's
// buffers, which stop allocating once grown.
std::shared_ptr<Plan> cached_plan(const Shim& shim, const fdnn_client::ConvParams& params,
                                  const Tensor& x, const Tensor& w, const Tensor& y, void* stream) {
  thread_local std::string params_key, key;
  params_key.clear();
  fdnn_client::append_params(params_key, params);
  fdnn_client::write_plan_key(key, shim, x.desc.device.device_id, params_key, x.desc, w.desc,
                              y.desc, nullptr);
  if (std::shared_ptr<Plan> plan = fdnn_client::plan_cache().find(key)) return plan;
  // The stream matters only to a benchmarking GPU shim; the heuristic plan ignores it.
  FDNN_Conv_Plan_Create_Args args =
      fdnn_client::plan_create_args(params, x.desc, w.desc, y.desc, nullptr, stream);
  return fdnn_client::plan_cache().insert(key, fdnn_client::create_plan(shim, args, key));
}

// The shims flux_dnn.jax registered: name -> library path. Looked up by string_view (a
// transparent comparator), so a warm call allocates nothing.
std::mutex shim_paths_mutex;
std::map<std::string, std::string, std::less<>>& shim_paths() {
  static auto* paths = new std::map<std::string, std::string, std::less<>>();  // never destroyed
  return *paths;
}

const Shim& shim_named(std::string_view name, int64_t abi_major) {
  if (abi_major != FDNN_ABI_MAJOR)
    throw fdnn_client::Error(ErrorKind::kUnsupported,
                             "this program was traced for flux_dnn ABI major " + std::to_string(abi_major) +
                                 ", but this handler speaks ABI major " + std::to_string(FDNN_ABI_MAJOR) +
                                 ": trace it again with this install");
  std::string_view path;
  {
    std::lock_guard<std::mutex> lock(shim_paths_mutex);
    auto found = shim_paths().find(name);
    if (found == shim_paths().end())
      throw fdnn_client::Error(ErrorKind::kUnavailable,
                               "no flux_dnn shim named '" + std::string(name) +
                                   "' is installed in this process (import flux_dnn.jax registers the "
                                   "installed ones; 'python -m flux_dnn info' lists them)");
    path = found->second;  // entries are never removed or changed: the view stays valid
  }
  return Shim::load(path);
}

// A convolution's attributes, as the custom call carries them.
struct Attrs {
  std::string_view shim;
  int64_t abi_major, op;
  ffi::Span<const int64_t> stride, lo, hi, dilation;
  int64_t groups, flags, algo_policy, algo_id;
  ffi::Span<const int64_t> a_spec, b_spec, out_spec;
};

// Whether every spec is a permutation of 0..rank-1.
bool valid_specs(const Attrs& at, int64_t rank) {
  for (ffi::Span<const int64_t> spec : {at.a_spec, at.b_spec, at.out_spec}) {
    if (static_cast<int64_t>(spec.size()) != rank) return false;
    bool seen[kItemRank] = {};
    for (int64_t d : spec) {
      if (d < 0 || d >= rank || seen[d]) return false;
      seen[d] = true;
    }
  }
  return true;
}

bool valid_attrs(const Attrs& at) {
  const size_t nd = at.stride.size();
  return nd >= 1 && nd <= FDNN_MAX_SPATIAL_DIMS && at.lo.size() == nd && at.hi.size() == nd &&
         at.dilation.size() == nd && at.op >= 0 && at.op <= 2 && at.flags >= -1 && at.flags <= UINT32_MAX &&
         valid_specs(at, static_cast<int64_t>(nd) + 2);
}

fdnn_client::ConvParams params_of(const Attrs& at, const Shim& shim, int32_t device_id) {
  fdnn_client::ConvParams p;
  p.op = static_cast<int32_t>(at.op);
  p.spatial_rank = static_cast<int32_t>(at.stride.size());
  for (size_t i = 0; i < at.stride.size(); ++i) {
    p.stride[i] = at.stride[i];
    p.dilation[i] = at.dilation[i];
    p.padding_lo[i] = at.lo[i];
    p.padding_hi[i] = at.hi[i];
  }
  p.groups = at.groups;
  p.flags = at.flags < 0 ? shim.default_flags(device_id) : static_cast<uint32_t>(at.flags);
  p.algo_policy = static_cast<int32_t>(at.algo_policy);
  p.algo_id = at.algo_id;
  return p;
}

ffi::Error run_conv(const Target& target, ffi::AnyBuffer a_buf, ffi::AnyBuffer b_buf,
                    ffi::Result<ffi::AnyBuffer> out_buf, const Attrs& at) {
  if (!valid_attrs(at)) return ffi::Error::InvalidArgument("flux_dnn: malformed convolution attributes");
  const int64_t nd = static_cast<int64_t>(at.stride.size()), op = at.op;
  FDNN_DLDataType dt{};
  if (!dtype_of(a_buf.element_type(), &dt) || b_buf.element_type() != a_buf.element_type() ||
      out_buf->element_type() != a_buf.element_type())
    return ffi::Error::InvalidArgument("flux_dnn: operands must share one dtype: float64, float32, float16 or bfloat16");
  const int64_t rank = static_cast<int64_t>(a_buf.dimensions().size());
  const int64_t lead_rank = rank - nd - 2;
  if (lead_rank < 0 || b_buf.dimensions().size() != size_t(rank) || out_buf->dimensions().size() != size_t(rank))
    return ffi::Error::InvalidArgument("flux_dnn: operands must have rank spatial_rank + 2 (+ vmapped dims)");

  const int64_t elem = dt.bits / 8;
  Operand a = operand(a_buf.untyped_data(), a_buf.dimensions(), lead_rank, elem);
  Operand b = operand(b_buf.untyped_data(), b_buf.dimensions(), lead_rank, elem);
  Operand o = operand(out_buf->untyped_data(), out_buf->dimensions(), lead_rank, elem);
  int64_t batch = 1;
  for (int64_t i = 0; i < lead_rank; ++i) batch *= o.lead(i);

  // Shared weights under vmap (forward, backward-data): the batch joins N, one call, where N
  // is the outermost dim of the data operands (then batch element and sample are one index).
  int64_t a_item[kItemRank], o_item[kItemRank];
  std::memcpy(a_item, a.item, sizeof a_item);
  std::memcpy(o_item, o.item, sizeof o_item);
  int64_t calls = batch;
  if (batch > 1 && op != FDNN_CONV_BACKWARD_WEIGHT && lead_all_ones(b) && same_lead(a, o) && at.a_spec[0] == 0 &&
      at.out_spec[0] == 0) {
    a_item[0] *= batch;
    o_item[0] *= batch;
    calls = 1;
  }
  // Map (a, b, out) to the ABI's (x, w, y) roles.
  const int32_t item_rank = static_cast<int32_t>(nd + 2);
  const bool bd = op == FDNN_CONV_BACKWARD_DATA, bw = op == FDNN_CONV_BACKWARD_WEIGHT, fw = op == FDNN_CONV_FORWARD;
  Tensor x(bd ? o_item : a_item, bd ? at.out_spec.begin() : at.a_spec.begin(), item_rank, dt, target.device);
  Tensor w(bw ? o_item : b.item, bw ? at.out_spec.begin() : at.b_spec.begin(), item_rank, dt, target.device);
  Tensor y(fw ? o_item : bd ? a_item : b.item, fw ? at.out_spec.begin() : bd ? at.a_spec.begin() : at.b_spec.begin(),
           item_rank, dt, target.device);
  if (x.size() == 0 || y.size() == 0) {  // nothing to compute; a weight gradient is zero
    // Device memory cannot be cleared from here without CUDA; flux_dnn.jax never sends an
    // empty problem (it returns zeros itself), so only a direct caller can get this error.
    if (target.device.device_type != FDNN_DEVICE_CPU)
      return ffi::Error(ffi::ErrorCode::kUnimplemented, "flux_dnn: empty operands on a GPU");
    std::memset(o.data, 0, size_t(o.item_bytes) * size_t(batch));
    return ffi::Error::Success();
  }
  Operand* x_of = bd ? &o : &a;
  Operand* w_of = bw ? &o : &b;
  Operand* y_of = fw ? &o : bd ? &a : &b;
  x.desc.data = least_aligned(*x_of, o, calls);
  w.desc.data = least_aligned(*w_of, o, calls);
  y.desc.data = least_aligned(*y_of, o, calls);

  try {
    const Shim& shim = shim_named(at.shim, at.abi_major);
    fdnn_client::ConvParams p = params_of(at, shim, target.device.device_id);
    std::shared_ptr<Plan> plan = cached_plan(shim, p, x, w, y, target.stream);

    void* workspace = plan->workspace_size ? target.workspace(plan->workspace_size) : nullptr;
    if (plan->workspace_size && !workspace)
      return ffi::Error(ffi::ErrorCode::kResourceExhausted,
                        "flux_dnn: cannot allocate the " + std::to_string(plan->workspace_size) +
                            "-byte convolution workspace");
    for (int64_t i = 0; i < calls; ++i) {
      FDNN_Conv_Plan_Execute_Args e{};
      e.x = x_of->data + (calls > 1 ? offset_of(*x_of, o, i) : 0);
      e.w = w_of->data + (calls > 1 ? offset_of(*w_of, o, i) : 0);
      e.y = y_of->data + (calls > 1 ? offset_of(*y_of, o, i) : 0);
      e.workspace = workspace;
      e.workspace_size = plan->workspace_size;
      e.stream = target.stream;
      fdnn_client::execute_plan(*plan, e);
    }
  } catch (const fdnn_client::Error& error) {
    return to_ffi_error(error);
  } catch (const std::bad_alloc&) {
    return ffi::Error(ffi::ErrorCode::kResourceExhausted, "flux_dnn: out of host memory");
  } catch (const std::exception& error) {  // nothing may leave through XLA's C API
    return ffi::Error(ffi::ErrorCode::kInternal, std::string("flux_dnn: ") + error.what());
  }
  return ffi::Error::Success();
}

Attrs attrs(std::string_view shim, int64_t abi_major, int64_t op, ffi::Span<const int64_t> stride,
            ffi::Span<const int64_t> lo, ffi::Span<const int64_t> hi, ffi::Span<const int64_t> dilation,
            int64_t groups, int64_t flags, int64_t algo_policy, int64_t algo_id, ffi::Span<const int64_t> a_spec,
            ffi::Span<const int64_t> b_spec, ffi::Span<const int64_t> out_spec) {
  return Attrs{shim, abi_major, op, stride, lo, hi, dilation, groups, flags, algo_policy, algo_id, a_spec, b_spec,
               out_spec};
}

// Host buffers; the workspace is this thread's grow-only host buffer.
ffi::Error FluxDnnConvGeneralImpl(ffi::AnyBuffer a, ffi::AnyBuffer b, ffi::Result<ffi::AnyBuffer> out,
                                  std::string_view shim, int64_t abi_major, int64_t op,
                                  ffi::Span<const int64_t> stride, ffi::Span<const int64_t> lo,
                                  ffi::Span<const int64_t> hi, ffi::Span<const int64_t> dilation, int64_t groups,
                                  int64_t flags, int64_t algo_policy, int64_t algo_id,
                                  ffi::Span<const int64_t> a_spec, ffi::Span<const int64_t> b_spec,
                                  ffi::Span<const int64_t> out_spec) {
  Target target{{FDNN_DEVICE_CPU, 0}, nullptr, &fdnn_client::host_workspace};
  return run_conv(target, a, b, out,
                  attrs(shim, abi_major, op, stride, lo, hi, dilation, groups, flags, algo_policy, algo_id, a_spec,
                        b_spec, out_spec));
}

// CUDA buffers on XLA's device `ordinal`; the work is enqueued on XLA's stream, so it is
// ordered with the rest of the program without a sync. The workspace comes from XLA's scratch
// allocator: device memory freed when the handler returns, which is safe because XLA's device
// allocator orders reuse on that same stream (jaxlib's own GPU kernels rely on this too).
ffi::Error FluxDnnConvGeneralCudaImpl(void* stream, ffi::ScratchAllocator scratch, int32_t ordinal, ffi::AnyBuffer a,
                                      ffi::AnyBuffer b, ffi::Result<ffi::AnyBuffer> out, std::string_view shim,
                                      int64_t abi_major, int64_t op, ffi::Span<const int64_t> stride,
                                      ffi::Span<const int64_t> lo, ffi::Span<const int64_t> hi,
                                      ffi::Span<const int64_t> dilation, int64_t groups, int64_t flags,
                                      int64_t algo_policy, int64_t algo_id, ffi::Span<const int64_t> a_spec,
                                      ffi::Span<const int64_t> b_spec, ffi::Span<const int64_t> out_spec) {
  auto device_workspace = [&scratch](size_t bytes) -> void* {
    std::optional<void*> p = scratch.Allocate(bytes, 256);  // 256: what cudaMalloc guarantees
    return p ? *p : nullptr;
  };
  Target target{{FDNN_DEVICE_CUDA, ordinal}, stream, device_workspace};
  return run_conv(target, a, b, out,
                  attrs(shim, abi_major, op, stride, lo, hi, dilation, groups, flags, algo_policy, algo_id, a_spec,
                        b_spec, out_spec));
}

// The operands and attributes both handlers take, after their context.
template <typename Binding>  // `.template`: Binding's type grows with each call
auto bind_conv(Binding b) {
  return std::move(b)
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .template Attr<std::string_view>("shim")
      .template Attr<int64_t>("abi_major")
      .template Attr<int64_t>("op")
      .template Attr<ffi::Span<const int64_t>>("stride")
      .template Attr<ffi::Span<const int64_t>>("padding_lo")
      .template Attr<ffi::Span<const int64_t>>("padding_hi")
      .template Attr<ffi::Span<const int64_t>>("dilation")
      .template Attr<int64_t>("groups")
      .template Attr<int64_t>("flags")
      .template Attr<int64_t>("algo_policy")
      .template Attr<int64_t>("algo_id")
      .template Attr<ffi::Span<const int64_t>>("a_spec")
      .template Attr<ffi::Span<const int64_t>>("b_spec")
      .template Attr<ffi::Span<const int64_t>>("out_spec");
}

}  // namespace

// The exported symbols (the build hides everything else).
extern "C" FDNN_EXPORT XLA_FFI_Error* FluxDnnConvGeneral(XLA_FFI_CallFrame* call_frame);
extern "C" FDNN_EXPORT XLA_FFI_Error* FluxDnnConvGeneralCuda(XLA_FFI_CallFrame* call_frame);

XLA_FFI_DEFINE_HANDLER_SYMBOL(FluxDnnConvGeneral, FluxDnnConvGeneralImpl, bind_conv(ffi::Ffi::Bind()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(FluxDnnConvGeneralCuda, FluxDnnConvGeneralCudaImpl,
                              bind_conv(ffi::Ffi::Bind()
                                            .Ctx<ffi::PlatformStream<void*>>()
                                            .Ctx<ffi::ScratchAllocator>()
                                            .Ctx<ffi::DeviceOrdinal>()));

// Where the shim registered as `name` lies (flux_dnn.jax calls it for every installed shim
// when it registers the handlers). A name registered again keeps its first path: a program
// running in this process may hold a view of it. Returns 0, or -1 for a NULL or empty
// argument.
extern "C" FDNN_EXPORT int FluxDnnJaxRegisterShim(const char* name, const char* path) {
  if (name == nullptr || path == nullptr || *name == '\0' || *path == '\0') return -1;
  std::lock_guard<std::mutex> lock(shim_paths_mutex);
  shim_paths().emplace(name, path);
  return 0;
}
