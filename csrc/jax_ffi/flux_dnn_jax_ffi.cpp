// XLA FFI handler: flux_dnn convolutions inside JAX programs, on XLA's own buffers.
//
// Two handlers, FluxDnnConv (host buffers) and FluxDnnConvCuda (device buffers, XLA's CUDA
// stream and scratch memory), run forward, backward-data or backward-weight through a shim's
// ABI table (flux_dnn.h); they differ only in where the buffers, stream and workspace come
// from. JAX registers them under one target name, per platform. A plain shared library with
// no Python and no CUDA headers in it (the stream is an opaque pointer), loaded by
// flux_dnn.jax through ctypes.
//
// Operands (all dense row-major, as XLA hands them to a custom call):
//   forward          a = x (N, C, *sp),  b = w (K, C/g, *k),  out = y (N, K, *out)
//   backward-data    a = dy,              b = w,               out = dx
//   backward-weight  a = x,               b = dy,              out = dw
// Under jax.vmap (vmap_method "expand_dims") every operand carries the same leading batch
// dims, of size 1 where it is not batched: the handler folds them into N when only the data
// operand is batched, and otherwise runs one convolution per batch element.

#include <dlfcn.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "flux_dnn/flux_dnn.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// ---------------------------------------------------------------------------------------
// The shim's table, found by path. The library is already loaded by flux_dnn's core (which
// checked its ABI version); dlopen returns that same instance.

const FDNN_Api* api_for(const std::string& path, std::string* error) {
  static std::mutex mu;
  static std::map<std::string, const FDNN_Api*> tables;
  std::lock_guard<std::mutex> lock(mu);
  auto it = tables.find(path);
  if (it != tables.end()) return it->second;
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);  // kept open for the process
  if (!lib) {
    *error = std::string("cannot load flux_dnn shim ") + path + ": " + dlerror();
    return nullptr;
  }
  auto get = reinterpret_cast<FDNN_GetApiFn*>(dlsym(lib, FDNN_GET_API_SYMBOL));
  const FDNN_Api* api = get ? get() : nullptr;
  // The handler uses the ABI 1.0 functions only, so any 1.x table that has them will do.
  if (!api || api->abi_major != FDNN_ABI_MAJOR || api->struct_size < FDNN_STRUCT_SIZE(FDNN_Api, Plan_Destroy)) {
    *error = "flux_dnn shim " + path + " has no compatible fdnn_get_api (ABI major " +
             std::to_string(FDNN_ABI_MAJOR) + " expected)";
    return nullptr;
  }
  tables[path] = api;
  return api;
}

ffi::Error to_ffi_error(const FDNN_Api* api, FDNN_Error* err, const char* what) {
  FDNN_Error_Describe_Args d{};
  d.struct_size = FDNN_Error_Describe_Args_STRUCT_SIZE;
  d.error = err;
  api->Error_Describe(&d);
  std::string message = std::string("flux_dnn ") + what + ": " + (d.message ? d.message : "");
  ffi::ErrorCode code = d.code == FDNN_ERROR_INVALID_ARGUMENT ? ffi::ErrorCode::kInvalidArgument
                        : d.code == FDNN_ERROR_UNSUPPORTED     ? ffi::ErrorCode::kUnimplemented
                        : d.code == FDNN_ERROR_UNAVAILABLE     ? ffi::ErrorCode::kUnavailable
                        : d.code == FDNN_ERROR_OUT_OF_MEMORY   ? ffi::ErrorCode::kResourceExhausted
                                                               : ffi::ErrorCode::kInternal;
  FDNN_Error_Destroy_Args x{};
  x.struct_size = FDNN_Error_Destroy_Args_STRUCT_SIZE;
  x.error = err;
  api->Error_Destroy(&x);
  return ffi::Error(code, message);
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

// ---------------------------------------------------------------------------------------
// Plans, cached per (shim, op, shapes, dtype, parameters). A plan may execute on several
// threads at once (ABI rule); shared_ptr keeps an evicted plan alive for a call using it.

struct Plan {
  const FDNN_Api* api = nullptr;
  FDNN_Plan* plan = nullptr;
  size_t workspace_size = 0;
  ~Plan() {
    if (plan) {
      FDNN_Plan_Destroy_Args d{};
      d.struct_size = FDNN_Plan_Destroy_Args_STRUCT_SIZE;
      d.plan = plan;
      api->Plan_Destroy(&d);
    }
  }
};

// One problem's tensor (no vmapped dims) with compact strides, on `device`.
struct Tensor {
  std::vector<int64_t> shape, strides;
  FDNN_DLTensor desc{};
  Tensor(std::vector<int64_t> s, FDNN_DLDataType dt, FDNN_DLDevice device)
      : shape(std::move(s)), strides(shape.size()) {
    int64_t step = 1;
    for (size_t i = shape.size(); i-- > 0;) {
      strides[i] = step;
      step *= shape[i];
    }
    desc.device = device;
    desc.ndim = static_cast<int32_t>(shape.size());
    desc.dtype = dt;
    desc.shape = shape.data();
    desc.strides = strides.data();
  }
  int64_t size() const {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    return n;
  }
};

struct Params {
  int64_t op, nd, groups, flags;
  int64_t stride[3], dilation[3], lo[3], hi[3];
};

std::string plan_key(const FDNN_Api* api, const Params& p, const Tensor& x, const Tensor& w,
                     const Tensor& y) {
  std::string k(reinterpret_cast<const char*>(&api), sizeof(api));
  k.append(reinterpret_cast<const char*>(&p), sizeof(p));
  k.append(reinterpret_cast<const char*>(&x.desc.dtype), sizeof(x.desc.dtype));
  k.append(reinterpret_cast<const char*>(&x.desc.device), sizeof(x.desc.device));  // a GPU plan is per device
  for (const Tensor* t : {&x, &w, &y})
    k.append(reinterpret_cast<const char*>(t->shape.data()), t->shape.size() * sizeof(int64_t));
  return k;
}

ffi::Error get_plan(const FDNN_Api* api, const Params& p, const Tensor& x, const Tensor& w,
                    const Tensor& y, void* stream, std::shared_ptr<Plan>* out) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<Plan>> cache;
  constexpr size_t kCapacity = 512;
  const std::string key = plan_key(api, p, x, w, y);
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(key);
    if (it != cache.end()) {
      *out = it->second;
      return ffi::Error::Success();
    }
  }
  FDNN_DLTensor no_bias{};
  FDNN_Conv_Plan_Create_Args a{};
  a.struct_size = FDNN_Conv_Plan_Create_Args_STRUCT_SIZE;
  a.op = static_cast<FDNN_ConvOp>(p.op);
  a.spatial_rank = static_cast<int32_t>(p.nd);
  a.x = &x.desc;
  a.w = &w.desc;
  a.y = &y.desc;
  a.bias = &no_bias;
  for (int i = 0; i < 3; ++i) {
    a.stride[i] = p.stride[i];
    a.dilation[i] = p.dilation[i];
    a.padding_lo[i] = p.lo[i];
    a.padding_hi[i] = p.hi[i];
  }
  a.groups = p.groups;
  a.alpha = 1.0f;
  a.beta = 0.0f;
  a.activation = FDNN_ACTIVATION_NONE;
  a.flags = static_cast<uint32_t>(p.flags);
  a.algo_policy = FDNN_ALGO_HEURISTIC;
  a.workspace_limit = SIZE_MAX;
  a.stream = stream;  // only a benchmarking GPU shim uses it; the heuristic plan does not
  if (FDNN_Error* err = api->Conv_Plan_Create(&a)) return to_ffi_error(api, err, "plan");
  auto plan = std::make_shared<Plan>();
  plan->api = api;
  plan->plan = a.plan;
  plan->workspace_size = a.workspace_size;
  std::lock_guard<std::mutex> lock(mu);
  if (cache.size() >= kCapacity) cache.clear();  // plans in use live on through shared_ptr
  cache.emplace(key, plan);
  *out = std::move(plan);
  return ffi::Error::Success();
}

// ---------------------------------------------------------------------------------------
// The handlers

struct Operand {
  char* data;
  std::vector<int64_t> lead;  // leading (vmapped) dims
  std::vector<int64_t> item;  // the N, C, *sp or K, C/g, *k dims
  int64_t item_bytes;
};

Operand operand(void* data, ffi::Span<const int64_t> dims, int64_t lead_rank, int64_t elem_bytes) {
  Operand o{static_cast<char*>(data), {dims.begin(), dims.begin() + lead_rank},
            {dims.begin() + lead_rank, dims.end()}, elem_bytes};
  for (int64_t d : o.item) o.item_bytes *= d;
  return o;
}

bool all_ones(const std::vector<int64_t>& v) {
  for (int64_t d : v)
    if (d != 1) return false;
  return true;
}

// Byte offset of batch element `flat` (row-major over `lead`) in operand o, broadcasting o's
// size-1 leading dims.
int64_t offset_of(const Operand& o, const std::vector<int64_t>& lead, int64_t flat) {
  int64_t offset = 0, step = 1;
  std::vector<int64_t> idx(lead.size());
  for (size_t i = lead.size(); i-- > 0;) {
    idx[i] = flat % lead[i];
    flat /= lead[i];
  }
  for (size_t i = lead.size(); i-- > 0;) {
    if (o.lead[i] != 1) offset += idx[i] * step;
    step *= o.lead[i];
  }
  return offset * o.item_bytes;
}

// Where a call runs: the buffers' device, the stream to enqueue on (NULL on CPU) and how to
// get `bytes` of workspace on that device (NULL: allocation failed; valid until the handler
// returns).
struct Target {
  FDNN_DLDevice device;
  void* stream;
  std::function<void*(size_t bytes)> workspace;
};

ffi::Error run_conv(const Target& target, ffi::AnyBuffer a_buf, ffi::AnyBuffer b_buf,
                    ffi::Result<ffi::AnyBuffer> out_buf, std::string_view shim_path, int64_t op,
                    ffi::Span<const int64_t> stride, ffi::Span<const int64_t> padding_lo,
                    ffi::Span<const int64_t> padding_hi, ffi::Span<const int64_t> dilation,
                    int64_t groups, int64_t flags) {
  const int64_t nd = static_cast<int64_t>(stride.size());
  if (nd < 1 || nd > 3 || padding_lo.size() != stride.size() || padding_hi.size() != stride.size() ||
      dilation.size() != stride.size() || op < 0 || op > 2)
    return ffi::Error::InvalidArgument("flux_dnn: malformed convolution attributes");
  FDNN_DLDataType dt{};
  if (!dtype_of(a_buf.element_type(), &dt) || b_buf.element_type() != a_buf.element_type() ||
      out_buf->element_type() != a_buf.element_type())
    return ffi::Error::InvalidArgument("flux_dnn: operands must share one dtype: float64, float32, float16 or bfloat16");
  const int64_t rank = static_cast<int64_t>(a_buf.dimensions().size());
  const int64_t lead_rank = rank - nd - 2;
  if (lead_rank < 0 || b_buf.dimensions().size() != size_t(rank) || out_buf->dimensions().size() != size_t(rank))
    return ffi::Error::InvalidArgument("flux_dnn: operands must have rank spatial_rank + 2 (+ vmapped dims)");
  std::string error;
  const FDNN_Api* api = api_for(std::string(shim_path), &error);
  if (!api) return ffi::Error(ffi::ErrorCode::kUnavailable, error);

  const int64_t elem = dt.bits / 8;
  Operand a = operand(a_buf.untyped_data(), a_buf.dimensions(), lead_rank, elem);
  Operand b = operand(b_buf.untyped_data(), b_buf.dimensions(), lead_rank, elem);
  Operand o = operand(out_buf->untyped_data(), out_buf->dimensions(), lead_rank, elem);
  int64_t batch = 1;
  for (int64_t d : o.lead) batch *= d;

  Params p{op, nd, groups, flags, {1, 1, 1}, {1, 1, 1}, {0, 0, 0}, {0, 0, 0}};
  for (int64_t i = 0; i < nd; ++i) {
    p.stride[i] = stride[i];
    p.dilation[i] = dilation[i];
    p.lo[i] = padding_lo[i];
    p.hi[i] = padding_hi[i];
  }
  // Shared weights under vmap (forward, backward-data): the batch joins N, one call.
  std::vector<int64_t> a_item = a.item, o_item = o.item;
  int64_t calls = batch;
  if (batch > 1 && op != FDNN_CONV_BACKWARD_WEIGHT && all_ones(b.lead) && a.lead == o.lead) {
    a_item[0] *= batch;
    o_item[0] *= batch;
    calls = 1;
  }
  // Map (a, b, out) to the ABI's (x, w, y) roles.
  const std::vector<int64_t>* x_shape = op == FDNN_CONV_BACKWARD_DATA ? &o_item : &a_item;
  const std::vector<int64_t>* w_shape = op == FDNN_CONV_BACKWARD_WEIGHT ? &o_item : &b.item;
  const std::vector<int64_t>* y_shape = op == FDNN_CONV_FORWARD ? &o_item : op == FDNN_CONV_BACKWARD_DATA ? &a_item : &b.item;
  Tensor x(*x_shape, dt, target.device), w(*w_shape, dt, target.device), y(*y_shape, dt, target.device);
  if (x.size() == 0 || y.size() == 0) {  // nothing to compute; a weight gradient is zero
    // Device memory cannot be cleared from here without CUDA; flux_dnn.jax never sends an
    // empty problem (it returns zeros itself), so only a direct caller can get this error.
    if (target.device.device_type != FDNN_DEVICE_CPU)
      return ffi::Error(ffi::ErrorCode::kUnimplemented, "flux_dnn: empty operands on a GPU");
    std::memset(o.data, 0, size_t(o.item_bytes) * size_t(batch));
    return ffi::Error::Success();
  }
  std::shared_ptr<Plan> plan;
  if (ffi::Error e = get_plan(api, p, x, w, y, target.stream, &plan); e.failure()) return e;

  void* workspace = plan->workspace_size ? target.workspace(plan->workspace_size) : nullptr;
  if (plan->workspace_size && !workspace)
    return ffi::Error(ffi::ErrorCode::kResourceExhausted,
                      "flux_dnn: cannot allocate the " + std::to_string(plan->workspace_size) +
                          "-byte convolution workspace");
  for (int64_t i = 0; i < calls; ++i) {
    char* ap = a.data + (calls > 1 ? offset_of(a, o.lead, i) : 0);
    char* bp = b.data + (calls > 1 ? offset_of(b, o.lead, i) : 0);
    char* op_ = o.data + (calls > 1 ? offset_of(o, o.lead, i) : 0);
    FDNN_Conv_Plan_Execute_Args e{};
    e.struct_size = FDNN_Conv_Plan_Execute_Args_STRUCT_SIZE;
    e.plan = plan->plan;
    e.x = op == FDNN_CONV_BACKWARD_DATA ? op_ : ap;
    e.w = op == FDNN_CONV_BACKWARD_WEIGHT ? op_ : bp;
    e.y = op == FDNN_CONV_FORWARD ? op_ : op == FDNN_CONV_BACKWARD_DATA ? ap : bp;
    e.workspace = workspace;
    e.workspace_size = plan->workspace_size;
    e.stream = target.stream;
    if (FDNN_Error* err = api->Conv_Plan_Execute(&e)) return to_ffi_error(api, err, "execute");
  }
  return ffi::Error::Success();
}

// Host buffers; the workspace is host memory owned by this call.
ffi::Error FluxDnnConvImpl(ffi::AnyBuffer a, ffi::AnyBuffer b, ffi::Result<ffi::AnyBuffer> out,
                           std::string_view shim, int64_t op, ffi::Span<const int64_t> stride,
                           ffi::Span<const int64_t> lo, ffi::Span<const int64_t> hi,
                           ffi::Span<const int64_t> dilation, int64_t groups, int64_t flags) {
  std::unique_ptr<void, decltype(&std::free)> ws(nullptr, &std::free);
  auto host_workspace = [&ws](size_t bytes) {
    ws.reset(std::aligned_alloc(64, (bytes + 63) / 64 * 64));  // size: a multiple of the alignment
    return ws.get();
  };
  Target target{{FDNN_DEVICE_CPU, 0}, nullptr, host_workspace};
  return run_conv(target, a, b, out, shim, op, stride, lo, hi, dilation, groups, flags);
}

// CUDA buffers on XLA's device `ordinal`; the work is enqueued on XLA's stream, so it is
// ordered with the rest of the program without a sync. The workspace comes from XLA's scratch
// allocator: device memory freed when the handler returns, which is safe because XLA's device
// allocator orders reuse on that same stream (jaxlib's own GPU kernels rely on this too).
ffi::Error FluxDnnConvCudaImpl(void* stream, ffi::ScratchAllocator scratch, int32_t ordinal,
                               ffi::AnyBuffer a, ffi::AnyBuffer b, ffi::Result<ffi::AnyBuffer> out,
                               std::string_view shim, int64_t op, ffi::Span<const int64_t> stride,
                               ffi::Span<const int64_t> lo, ffi::Span<const int64_t> hi,
                               ffi::Span<const int64_t> dilation, int64_t groups, int64_t flags) {
  auto device_workspace = [&scratch](size_t bytes) -> void* {
    std::optional<void*> p = scratch.Allocate(bytes, 256);  // 256: what cudaMalloc guarantees
    return p ? *p : nullptr;
  };
  Target target{{FDNN_DEVICE_CUDA, ordinal}, stream, device_workspace};
  return run_conv(target, a, b, out, shim, op, stride, lo, hi, dilation, groups, flags);
}

// The operands and attributes both handlers take, after their context.
template <typename Binding>  // `.template`: Binding's type grows with each call
auto bind_conv(Binding b) {
  return std::move(b)
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .template Attr<std::string_view>("shim")
      .template Attr<int64_t>("op")
      .template Attr<ffi::Span<const int64_t>>("stride")
      .template Attr<ffi::Span<const int64_t>>("padding_lo")
      .template Attr<ffi::Span<const int64_t>>("padding_hi")
      .template Attr<ffi::Span<const int64_t>>("dilation")
      .template Attr<int64_t>("groups")
      .template Attr<int64_t>("flags");
}

}  // namespace

// The exported symbols (the build hides everything else).
extern "C" FDNN_EXPORT XLA_FFI_Error* FluxDnnConv(XLA_FFI_CallFrame* call_frame);
extern "C" FDNN_EXPORT XLA_FFI_Error* FluxDnnConvCuda(XLA_FFI_CallFrame* call_frame);

XLA_FFI_DEFINE_HANDLER_SYMBOL(FluxDnnConv, FluxDnnConvImpl, bind_conv(ffi::Ffi::Bind()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(FluxDnnConvCuda, FluxDnnConvCudaImpl,
                              bind_conv(ffi::Ffi::Bind()
                                            .Ctx<ffi::PlatformStream<void*>>()
                                            .Ctx<ffi::ScratchAllocator>()
                                            .Ctx<ffi::DeviceOrdinal>()));
