// The onednn_sycl shim: flux_dnn's ABI on oneDNN's SYCL runtime, for arrays on SYCL devices
// (DLPack kDLOneAPI = 14: dpnp/dpctl arrays, PyTorch XPU tensors): Intel GPUs (Level Zero)
// and, through Intel's OpenCL CPU runtime, the CPU as a SYCL device.
//
// Memory is USM: each tensor's `data` is a USM pointer (device or shared) in the context of
// the caller's queue, wrapped by dnnl_sycl_interop_memory_create(..., usm, ptr) without a copy.
// The ABI's `stream` is a `sycl::queue*` (dpctl's SyclQueue.addressof_ref(), torch XPU's
// current stream's queue): every primitive runs on a oneDNN stream made on that very queue
// (dnnl_sycl_interop_stream_create), never on a queue of the shim's own. Conv_Plan_Execute
// returns once its work is queued, with no host wait, ordered after the queue's earlier work;
// on an in-order queue the queue orders its later work after it, on an out-of-order queue a
// barrier submitted after the call does (see Execution below).
//
// Engines: one per (SYCL device, SYCL context), made from the caller's own device and context
// (dnnl_sycl_interop_engine_create), cached for the process: a GPU, the CPU device and several
// devices each get theirs. A plan is made on the engine of the queue given at plan time (the
// args' stream), or, with none, on device_id's device in its platform's default context (the
// context dpctl and torch XPU allocate in); executed on a queue of another device or context,
// it makes its primitives again for that engine once and keeps them.
//
// A plan is one oneDNN convolution primitive plus, where the primitive computes in other
// layouts than the caller's, reorders staged through the caller's workspace; oneDNN's
// scratchpad is in the workspace too (user scratchpad mode), so execute allocates nothing.
// The epilogue y = alpha * act(conv + bias) + beta * y is oneDNN's: post-ops (eltwise, then
// eltwise_linear for alpha, then sum for beta) on forward, and on the backward ops a staged
// output whose reorder applies alpha (a source scale) and beta (a sum post-op).
#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "shim_common.hpp"
#include "sycl_lib.hpp"

using fdnn_shim::fail;
using fdnn_sycl::libraries;

namespace {

const fdnn_sycl::Dnnl& D() { return libraries().dnnl; }

// A failed oneDNN call: its status and what was being done.
struct DnnlError {
  dnnl_status_t status;
  const char* what;
};

void check(dnnl_status_t s, const char* what) {
  if (s != dnnl_success) throw DnnlError{s, what};
}

const char* status_text(dnnl_status_t s) {
  switch (s) {
    case dnnl_out_of_memory: return "dnnl_out_of_memory";
    case dnnl_invalid_arguments: return "dnnl_invalid_arguments";
    case dnnl_unimplemented: return "dnnl_unimplemented";
    case dnnl_last_impl_reached: return "dnnl_last_impl_reached";
    case dnnl_runtime_error: return "dnnl_runtime_error";
    case dnnl_not_required: return "dnnl_not_required";
    default: return "dnnl_error";
  }
}

// Owning handles of oneDNN objects (shared: plans are copied when packed).
using Md = std::shared_ptr<dnnl_memory_desc>;
using Pd = std::shared_ptr<dnnl_primitive_desc>;
using Prim = std::shared_ptr<dnnl_primitive>;
using Mem = std::shared_ptr<dnnl_memory>;

Md own(dnnl_memory_desc_t h) { return Md(h, [](dnnl_memory_desc_t p) { D().dnnl_memory_desc_destroy(p); }); }
Pd own(dnnl_primitive_desc_t h) { return Pd(h, [](dnnl_primitive_desc_t p) { D().dnnl_primitive_desc_destroy(p); }); }
Prim own(dnnl_primitive_t h) { return Prim(h, [](dnnl_primitive_t p) { D().dnnl_primitive_destroy(p); }); }
Mem own(dnnl_memory_t h) { return Mem(h, [](dnnl_memory_t p) { D().dnnl_memory_destroy(p); }); }

struct Attr {
  dnnl_primitive_attr_t h = nullptr;
  Attr() { check(D().dnnl_primitive_attr_create(&h), "attribute creation"); }
  ~Attr() { D().dnnl_primitive_attr_destroy(h); }
  Attr(const Attr&) = delete;
  Attr& operator=(const Attr&) = delete;
};
struct PostOps {
  dnnl_post_ops_t h = nullptr;
  PostOps() { check(D().dnnl_post_ops_create(&h), "post-op creation"); }
  ~PostOps() { D().dnnl_post_ops_destroy(h); }
  PostOps(const PostOps&) = delete;
  PostOps& operator=(const PostOps&) = delete;
};

size_t md_size(const Md& md) { return md ? D().dnnl_memory_desc_get_size(md.get()) : 0; }
bool md_equal(const Md& a, const Md& b) { return D().dnnl_memory_desc_equal(a.get(), b.get()) != 0; }
Md query_md(const Pd& pd, dnnl_query_t what) {
  dnnl_memory_desc_t clone = nullptr;
  check(D().dnnl_memory_desc_clone(&clone, D().dnnl_primitive_desc_query_md(pd.get(), what, 0)),
        "descriptor query");
  return own(clone);
}
std::string impl_name(const Pd& pd) {
  const char* name = nullptr;
  D().dnnl_primitive_desc_query(pd.get(), dnnl_query_impl_info_str, 0, &name);
  return name ? name : "unknown";
}

// ------------------------------------------------------------------------------------------
// Devices and engines

std::string device_label(size_t i) {
  const auto& list = fdnn_sycl::devices();
  return list[i].name + (list[i].gpu ? " (SYCL GPU)" : " (SYCL)");
}

int32_t num_devices() { return static_cast<int32_t>(fdnn_sycl::devices().size()); }

// Why this shim cannot run here, or NULL.
const char* unavailable_reason() {
  static const std::string reason = [] {
    const fdnn_sycl::Libraries& l = libraries();
    if (!l.usable()) return l.error;
    if (fdnn_sycl::devices().empty()) {
      // The plug-in's Python side knows what of the CPU runtime is missing (its preload).
      const char* note = std::getenv("FLUX_DNN_ONEDNN_SYCL_NOTE");
      return std::string(
                 "the SYCL runtime lists no device: no Intel GPU driver (Level Zero) and no "
                 "OpenCL CPU device (pip install 'flux-dnn-sycl[cpu]'; OCL_ICD_FILENAMES must "
                 "name its libintelocl.so before the SYCL runtime first lists devices: the "
                 "plug-in's start-up hook flux_dnn_sycl.pth sets it when Python starts, and "
                 "importing flux_dnn_sycl does, which is too late once dpctl/dpnp listed "
                 "devices; python -S skips the hook)") +
             (note && *note ? std::string(": ") + note : std::string());
    }
    return std::string();
  }();
  return reason.empty() ? nullptr : reason.c_str();
}

void require_usable() {
  if (const char* why = unavailable_reason()) fail(FDNN_ERROR_UNAVAILABLE, "onednn_sycl: %s", why);
}

void check_device_id(int32_t device_id) {
  require_usable();
  if (device_id < 0 || device_id >= num_devices())
    fail(FDNN_ERROR_INVALID_ARGUMENT, "device_id %d: the onednn_sycl shim sees %d SYCL device(s)",
         static_cast<int>(device_id), static_cast<int>(num_devices()));
}

struct EngineEntry {
  dnnl_engine_t engine;
  fdnn_sycl::SyclObject device, context;  // kept alive with the engine
};

// The engine of (device, context), made once and kept for the process.
dnnl_engine_t engine_for(const fdnn_sycl::SyclObject& device, const fdnn_sycl::SyclObject& context) {
  static std::mutex mutex;
  static auto* cache = new std::map<std::pair<const void*, const void*>, EngineEntry>;
  std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(device.id(), context.id());
  auto it = cache->find(key);
  if (it != cache->end()) return it->second.engine;
  dnnl_engine_t engine = nullptr;
  check(D().dnnl_sycl_interop_engine_create(&engine, &device, &context), "engine creation");
  cache->emplace(key, EngineEntry{engine, device, context});
  return engine;
}

dnnl_engine_t engine_of_device(int32_t device_id) {
  const fdnn_sycl::DeviceEntry& e = fdnn_sycl::devices()[static_cast<size_t>(device_id)];
  return engine_for(e.device, e.context);
}

dnnl_engine_t engine_of_queue(void* queue) {
  const fdnn_sycl::Sycl& s = libraries().sycl;
  fdnn_sycl::SyclObject device, context;
  s.queue_get_device(&device, queue);
  s.queue_get_context(&context, queue);
  return engine_for(device, context);
}

// ------------------------------------------------------------------------------------------
// The problem in oneDNN's terms

dnnl_data_type_t to_dnnl(FDNN_DLDataType t) {
  if (t.lanes != 1) return dnnl_data_type_undef;
  if (t.code == FDNN_DTYPE_FLOAT && t.bits == 32) return dnnl_f32;
  if (t.code == FDNN_DTYPE_FLOAT && t.bits == 16) return dnnl_f16;
  if (t.code == FDNN_DTYPE_FLOAT && t.bits == 64) return dnnl_f64;
  if (t.code == FDNN_DTYPE_BFLOAT && t.bits == 16) return dnnl_bf16;
  return dnnl_data_type_undef;
}

Md strided_md(int ndims, const int64_t* dims, dnnl_data_type_t dt, const int64_t* strides) {
  dnnl_memory_desc_t h = nullptr;
  check(D().dnnl_memory_desc_create_with_strides(&h, ndims, dims, dt, strides),
        "memory descriptor creation");
  return own(h);
}

Md tagged_md(int ndims, const int64_t* dims, dnnl_data_type_t dt, dnnl_format_tag_t tag) {
  dnnl_memory_desc_t h = nullptr;
  check(D().dnnl_memory_desc_create_with_tag(&h, ndims, dims, dt, tag), "memory descriptor creation");
  return own(h);
}

// One tensor's shape and strides, owned (the caller's descriptors live for Plan_Create only).
struct Tensor {
  std::vector<int64_t> shape, strides;
  bool present() const { return !shape.empty(); }
};

Tensor copy_tensor(const FDNN_DLTensor* t) {
  Tensor c;
  if (!fdnn_shim::has_tensor(t)) return c;
  c.shape.assign(t->shape, t->shape + t->ndim);
  c.strides.assign(t->strides, t->strides + t->ndim);
  return c;
}

// What a plan needs to make its primitives again, on another engine.
struct Problem {
  int32_t op = FDNN_CONV_FORWARD;
  int rank = 2;
  dnnl_data_type_t dt = dnnl_f32;
  Tensor x, w, y, bias;
  int64_t groups = 1;
  std::vector<int64_t> strides, dilates, pad_lo, pad_hi;
  float alpha = 1.f, beta = 0.f;
  int32_t activation = FDNN_ACTIVATION_NONE;
  float act_alpha = 0.f, act_beta = 0.f;
  bool reduced_precision = false;
};

Problem problem_of(const FDNN_Conv_Plan_Create_Args& a) {
  Problem p;
  p.op = a.op;
  p.rank = a.spatial_rank;
  p.dt = to_dnnl(a.x->dtype);
  p.x = copy_tensor(a.x);
  p.w = copy_tensor(a.w);
  p.y = copy_tensor(a.y);
  p.bias = copy_tensor(a.bias);
  p.groups = a.groups;
  for (int i = 0; i < a.spatial_rank; ++i) {
    p.strides.push_back(a.stride[i]);
    p.dilates.push_back(a.dilation[i] - 1);  // oneDNN counts the gaps
    p.pad_lo.push_back(a.padding_lo[i]);
    p.pad_hi.push_back(a.padding_hi[i]);
  }
  p.alpha = a.alpha;
  p.beta = a.beta;
  p.activation = a.activation;
  p.act_alpha = a.activation_alpha;
  p.act_beta = a.activation_beta;
  p.reduced_precision = (a.flags & FDNN_CONV_ALLOW_REDUCED_PRECISION) != 0 && p.dt == dnnl_f32;
  return p;
}

Md user_md(const Tensor& t, dnnl_data_type_t dt) {
  return strided_md(static_cast<int>(t.shape.size()), t.shape.data(), dt, t.strides.data());
}

// The caller's weights (K, C/g, *k) as oneDNN's grouped weights (g, K/g, C/g, *k).
Md weights_user_md(const Problem& p) {
  if (p.groups == 1) return user_md(p.w, p.dt);
  std::vector<int64_t> dims = p.w.shape, strides = p.w.strides;
  dims[0] /= p.groups;
  dims.insert(dims.begin(), p.groups);
  strides.insert(strides.begin(), strides[0] * dims[1]);
  return strided_md(static_cast<int>(dims.size()), dims.data(), p.dt, strides.data());
}

Md any_like(const Tensor& t, dnnl_data_type_t dt, int64_t groups = 1) {
  std::vector<int64_t> dims = t.shape;
  if (groups > 1) {
    dims[0] /= groups;
    dims.insert(dims.begin(), groups);
  }
  return tagged_md(static_cast<int>(dims.size()), dims.data(), dt, dnnl_format_tag_any);
}

// ------------------------------------------------------------------------------------------
// Algorithms: layout policies
enum Layouts : int64_t {
  kUserLayouts = 0,    // compute in the caller's layouts: no reorder
  kVendorLayouts = 1,  // oneDNN's preferred layouts (format any), reorders around
  kVendorWeights = 2,  // the caller's activation layouts, weights in oneDNN's preferred layout
  kBlocked16 = 3,      // activations of 16k channels in nC[d]hw16c, weights oneDNN's, reorders
};
constexpr int64_t kNumAlgos = 4;
const char* layouts_name(int64_t l) {
  return l == kUserLayouts     ? "user layouts"
         : l == kVendorWeights ? "vendor weights"
         : l == kBlocked16     ? "blocked 16c layouts"
                               : "vendor layouts";
}

// oneDNN's nC[d]hw16c tag for a tensor of `ndims` dims (3 to 5).
dnnl_format_tag_t blocked16_tag(size_t ndims) {
  return ndims == 3 ? dnnl_aBc16b : ndims == 4 ? dnnl_aBcd16b : dnnl_aBcde16b;
}

// One operand of the primitive, maybe staged through the workspace.
struct Operand {
  int arg = 0;   // DNNL_ARG_* of the convolution
  int slot = 0;  // 0 x, 1 w, 2 y, 3 bias: which caller pointer
  bool output = false;
  Md user, prim;
  bool staged = false;
  size_t offset = 0;  // of the staging buffer in the workspace
  Prim reorder;       // input: user -> staging; output: staging -> user (alpha, beta)
  bool scaled = false;  // the output reorder applies alpha as a source scale
  // A read tensor whose caller's strides overlap (a broadcast, a sliding window), which
  // oneDNN's descriptors refuse: gathered first into a compact copy at gather_offset in the
  // workspace by one reorder per slice (the dims peeled off to make the rest non-overlapping);
  // `user` then describes that copy.
  bool gathered = false;
  size_t gather_offset = 0;
  Prim gather;
  Md slice_src, slice_dst;  // one slice in the caller's strides and in the copy's
  size_t element_bytes = 0;
  std::vector<std::pair<int64_t, int64_t>> slices;  // (caller's, copy's) element offsets
};

// The primitives of a plan on one engine.
struct Built {
  dnnl_engine_t engine = nullptr;
  Prim conv;
  std::vector<Operand> operands;
  size_t scratchpad = 0;
  Md scratch_md;  // the scratchpad as bytes
  size_t workspace = 0;
  Mem alpha;  // one float32 alpha in the engine's memory, for scaled output reorders
  Mem packed_w;  // Conv_Plan_Pack_Weights: weights in the primitive's layout, plan-owned
  std::string name;
  bool fast = false;  // is_fast(name), or a kernel the shim picked on purpose (conv_pd)
};

dnnl_alg_kind_t eltwise_of(int32_t act) {
  switch (act) {
    case FDNN_ACTIVATION_RELU:
    case FDNN_ACTIVATION_LEAKY_RELU: return dnnl_eltwise_relu;
    case FDNN_ACTIVATION_CLIP: return dnnl_eltwise_clip;
    case FDNN_ACTIVATION_SIGMOID: return dnnl_eltwise_logistic;
    case FDNN_ACTIVATION_TANH: return dnnl_eltwise_tanh;
    case FDNN_ACTIVATION_GELU_TANH: return dnnl_eltwise_gelu_tanh;
    case FDNN_ACTIVATION_GELU_ERF: return dnnl_eltwise_gelu_erf;
    case FDNN_ACTIVATION_SILU: return dnnl_eltwise_swish;
    default: fail(FDNN_ERROR_INVALID_ARGUMENT, "unknown activation %d", static_cast<int>(act));
  }
}

void base_attr(const Problem& p, Attr& attr) {
  check(D().dnnl_primitive_attr_set_scratchpad_mode(attr.h, dnnl_scratchpad_mode_user), "attribute");
  if (p.reduced_precision) check(D().dnnl_primitive_attr_set_fpmath_mode(attr.h, dnnl_fpmath_mode_bf16), "attribute");
}

// The header's forward epilogue as post-ops: the activation, alpha (eltwise_linear), then beta
// (sum; only when the output is not staged: a staged output accumulates in its reorder).
void forward_post_ops(const Problem& p, bool output_staged, Attr& attr) {
  PostOps ops;
  if (p.activation != FDNN_ACTIVATION_NONE) {
    // relu's alpha is the negative slope, clip's are the bounds, swish's alpha the scale.
    // RELU keeps NaN (torch.relu(nan) is nan), which oneDNN's relu kernel of slope 0 does not
    // (its max(v, 0) returns 0 for NaN; measured on the CPU device): ReLU is oneDNN's relu of
    // slope 2^-149, the smallest float, whose kernel selects v > 0 ? v : slope * v, so NaN
    // stays NaN and a negative v gives -0 or a denormal of at most 2^-149 |v|.
    const float alpha = p.activation == FDNN_ACTIVATION_LEAKY_RELU || p.activation == FDNN_ACTIVATION_CLIP
                            ? p.act_alpha
                        : p.activation == FDNN_ACTIVATION_SILU ? 1.f
                        : p.activation == FDNN_ACTIVATION_RELU ? std::numeric_limits<float>::denorm_min()
                                                               : 0.f;
    const float beta = p.activation == FDNN_ACTIVATION_CLIP ? p.act_beta : 0.f;
    check(D().dnnl_post_ops_append_eltwise(ops.h, eltwise_of(p.activation), alpha, beta), "post-op");
  }
  if (p.alpha != 1.f) check(D().dnnl_post_ops_append_eltwise(ops.h, dnnl_eltwise_linear, p.alpha, 0.f), "post-op");
  if (p.beta != 0.f && !output_staged) check(D().dnnl_post_ops_append_sum(ops.h, p.beta, 0, dnnl_data_type_undef), "post-op");
  check(D().dnnl_primitive_attr_set_post_ops(attr.h, ops.h), "post-ops");
}

Pd forward_pd(dnnl_engine_t engine, const Problem& p, const Md& x, const Md& w, const Md& bias,
              const Md& y, const Attr& attr, dnnl_prop_kind_t kind) {
  dnnl_primitive_desc_t pd = nullptr;
  check(D().dnnl_convolution_forward_primitive_desc_create(
            &pd, engine, kind, dnnl_convolution_direct, x.get(), w.get(), bias ? bias.get() : nullptr,
            y.get(), p.strides.data(), p.dilates.data(), p.pad_lo.data(), p.pad_hi.data(), attr.h),
        "convolution descriptor creation");
  return own(pd);
}

bool is_fast(const std::string& impl);

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

// The primitive descriptor of the op with memory descriptors x, w, y (user or any).
// `picked` (if given) is set when the shim passed over oneDNN's first implementation.
Pd conv_pd(dnnl_engine_t engine, const Problem& p, const Md& x, const Md& w, const Md& y,
           const Md& bias, bool output_staged, bool* picked = nullptr) {
  Attr attr;
  base_attr(p, attr);
  if (picked) *picked = false;
  if (p.op == FDNN_CONV_FORWARD) {
    forward_post_ops(p, output_staged, attr);
    Pd pd = forward_pd(engine, p, x, w, bias, y, attr, dnnl_forward_inference);
    // A float32 NCHW convolution that oneDNN 3.9 describes as a matmul (a 1x1, stride 1, no
    // padding: jit_uni_ncsp_convolution:matmul, brgemm matmul per image) runs in its GEMM
    // kernel instead (gemm:jit, the one oneDNN 3.2 and so the CPU shim choose). Measured on
    // the SYCL CPU device (2 loaded CPUs), both in one process, interleaved, medians per call
    // with the queue wait: 1x1 256->64 @56, N=8 3.99 ms against 5.98 into a given output,
    // 7.5-7.9 against 8.4-10.8 with dpnp allocating it; N=1 1.14-1.24 against 1.28-1.40; on
    // ResNet-50's other 1x1 layers (64->64, 64->256 @56, 1024->256 @14, 512->2048 and
    // 2048->512 @7, N=1 and 8) within +-3% or better. Where oneDNN lists no gemm:jit for the
    // problem (post-ops it cannot fuse, ...) its first choice stays.
    if (p.dt == dnnl_f32 && contains(impl_name(pd), "ncsp_convolution:matmul")) {
      Pd alt = forward_pd(engine, p, x, w, bias, y, attr, dnnl_forward_inference);
      while (D().dnnl_primitive_desc_next_impl(alt.get()) == dnnl_success) {
        if (!contains(impl_name(alt), "gemm:jit")) continue;
        if (picked) *picked = true;
        return alt;
      }
    }
    return pd;
  }
  Attr hint_attr;
  base_attr(p, hint_attr);
  const Pd hint = forward_pd(engine, p, x, w, Md(), y, hint_attr, dnnl_forward_training);
  dnnl_primitive_desc_t pd = nullptr;
  if (p.op == FDNN_CONV_BACKWARD_DATA) {
    check(D().dnnl_convolution_backward_data_primitive_desc_create(
              &pd, engine, dnnl_convolution_direct, x.get(), w.get(), y.get(), p.strides.data(),
              p.dilates.data(), p.pad_lo.data(), p.pad_hi.data(), hint.get(), attr.h),
          "convolution descriptor creation");
  } else {
    check(D().dnnl_convolution_backward_weights_primitive_desc_create(
              &pd, engine, dnnl_convolution_direct, x.get(), w.get(), bias ? bias.get() : nullptr,
              y.get(), p.strides.data(), p.dilates.data(), p.pad_lo.data(), p.pad_hi.data(),
              hint.get(), attr.h),
          "convolution descriptor creation");
  }
  return own(pd);
}

Prim make_primitive(const Pd& pd) {
  dnnl_primitive_t prim = nullptr;
  check(D().dnnl_primitive_create(&prim, pd.get()), "primitive creation");
  return own(prim);
}

Prim make_reorder(dnnl_engine_t engine, const Md& from, const Md& to, bool scaled, float beta) {
  Attr attr;
  if (scaled) check(D().dnnl_primitive_attr_set_scales_mask(attr.h, DNNL_ARG_SRC, 0), "attribute");
  if (beta != 0.f) {
    PostOps ops;
    check(D().dnnl_post_ops_append_sum(ops.h, beta, 0, dnnl_data_type_undef), "post-op");
    check(D().dnnl_primitive_attr_set_post_ops(attr.h, ops.h), "post-ops");
  }
  dnnl_primitive_desc_t pd = nullptr;
  check(D().dnnl_reorder_primitive_desc_create(&pd, from.get(), engine, to.get(), engine, attr.h),
        "reorder creation");
  return make_primitive(own(pd));
}

size_t align64(size_t n) { return (n + 63) / 64 * 64; }

size_t element_size(dnnl_data_type_t dt) {
  return dt == dnnl_f64 ? 8 : dt == dnnl_f32 ? 4 : 2;
}

bool overlaps(const Tensor& t) {
  if (!t.present()) return false;
  FDNN_DLTensor d{};
  d.ndim = static_cast<int32_t>(t.shape.size());
  d.shape = const_cast<int64_t*>(t.shape.data());
  d.strides = const_cast<int64_t*>(t.strides.data());
  return fdnn_shim::overlapping_dim(d) >= 0;
}

std::vector<int64_t> compact_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size());
  int64_t step = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = step;
    step *= shape[i];
  }
  return strides;
}

// Most slices a gather may take (one reorder execution each): beyond it, UNSUPPORTED.
constexpr int64_t kMostGatherSlices = 4096;

// The gather of an overlapping read tensor `t` (see Operand::gathered) into a compact
// row-major copy: the dims to peel (greedily, by stride, every dim whose stride does not step
// past the dims kept inside it), one reorder of the remaining non-overlapping slice, and the
// element offsets of every slice in the caller's tensor and in the copy.
void plan_gather(dnnl_engine_t engine, const Tensor& t, dnnl_data_type_t dt, Operand& o) {
  const size_t n = t.shape.size();
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return t.strides[a] < t.strides[b]; });
  std::vector<bool> peeled(n, false);
  int64_t extent = 1, count = 1;
  for (size_t i : order) {
    if (t.shape[i] == 1) continue;
    if (t.strides[i] >= extent) {
      extent = t.strides[i] * (t.shape[i] - 1) + extent;
    } else {
      peeled[i] = true;
      count *= t.shape[i];
      if (count > kMostGatherSlices)
        fail(FDNN_ERROR_UNSUPPORTED,
             "onednn_sycl: a read tensor whose strides overlap is gathered by one oneDNN reorder "
             "per slice, and this one needs more than %lld slices; pass a contiguous copy",
             static_cast<long long>(kMostGatherSlices));
    }
  }
  const std::vector<int64_t> compact = compact_strides(t.shape);
  std::vector<int64_t> dims = t.shape, src_strides = t.strides, dst_strides = compact;
  for (size_t i = 0; i < n; ++i)
    if (peeled[i]) dims[i] = 1;
  const Md src = strided_md(static_cast<int>(n), dims.data(), dt, src_strides.data());
  const Md dst = strided_md(static_cast<int>(n), dims.data(), dt, dst_strides.data());
  dnnl_primitive_desc_t pd = nullptr;
  Attr attr;
  check(D().dnnl_reorder_primitive_desc_create(&pd, src.get(), engine, dst.get(), engine, attr.h),
        "gather reorder creation");
  o.gather = make_primitive(own(pd));
  o.slice_src = src;
  o.slice_dst = dst;
  o.element_bytes = element_size(dt);
  std::vector<int64_t> index(n, 0);
  for (int64_t k = 0; k < count; ++k) {
    int64_t from = 0, to = 0;
    for (size_t i = 0; i < n; ++i) {
      from += index[i] * t.strides[i];
      to += index[i] * compact[i];
    }
    o.slices.emplace_back(from, to);
    for (size_t i = n; i-- > 0;) {  // the next index over the peeled dims
      if (!peeled[i]) continue;
      if (++index[i] < t.shape[i]) break;
      index[i] = 0;
    }
  }
  o.gathered = true;
}

// The primitives of algorithm `algo` for `p` on `engine`.
std::shared_ptr<Built> build(dnnl_engine_t engine, const Problem& caller, int64_t algo) {
  auto b = std::make_shared<Built>();
  b->engine = engine;
  // Overlapping read tensors are seen through their compact copies (Operand::gathered).
  Problem p = caller;
  const Tensor* caller_tensors[4] = {&caller.x, &caller.w, &caller.y, &caller.bias};
  Tensor* seen[4] = {&p.x, &p.w, &p.y, &p.bias};
  bool gather[4] = {false, false, false, false};
  for (int i = 0; i < 4; ++i) {
    const bool written = (i == 0 && p.op == FDNN_CONV_BACKWARD_DATA) || (i == 1 && p.op == FDNN_CONV_BACKWARD_WEIGHT) ||
                         (i == 2 && p.op == FDNN_CONV_FORWARD) || (i == 3 && p.op == FDNN_CONV_BACKWARD_WEIGHT);
    if (!written && overlaps(*caller_tensors[i])) {
      gather[i] = true;
      seen[i]->strides = compact_strides(seen[i]->shape);
    }
  }
  const bool vendor = algo == kVendorLayouts;
  const bool vendor_w = algo != kUserLayouts;  // weights in oneDNN's layout
  const Md x_user = user_md(p.x, p.dt), y_user = user_md(p.y, p.dt), w_user = weights_user_md(p);
  Md bias_user, bias_prim;
  if (p.bias.present()) {
    bias_user = user_md(p.bias, p.dt);
    // Dense for the primitive whatever the caller's strides (a broadcast bias is staged).
    bias_prim = tagged_md(1, p.bias.shape.data(), p.dt, dnnl_a);
  }
  // Backward ops have no post-ops: alpha and beta go through a staged output's reorder.
  const bool backward_scaled = p.op != FDNN_CONV_FORWARD && (p.alpha != 1.f || p.beta != 0.f);
  // A 16-bit output that accumulates (beta) or that a reorder scales (alpha on the backward
  // ops) is computed into a float32 staging buffer, so that the reorder into the caller's
  // 16-bit output rounds once (in 16 bits the result would be rounded before alpha and beta
  // and again after). Where oneDNN has no such mixed primitive, the output stays 16-bit.
  const bool is16 = p.dt == dnnl_f16 || p.dt == dnnl_bf16;
  bool wide = is16 && (p.beta != 0.f || backward_scaled);
  auto md_of = [&](const Tensor& t, const Md& user, bool out, int64_t groups) {
    const dnnl_data_type_t dt = out && wide ? dnnl_f32 : p.dt;
    const bool weights = &t == &p.w;
    if (vendor || (weights && vendor_w)) return any_like(t, dt, groups);
    // kBlocked16: an activation of 16k channels in nC[d]hw16c (the layout oneDNN 3.2's JIT
    // kernels and jit:blk reorders take, as the CPU shim's algorithm 3), others as they are.
    if (algo == kBlocked16 && !weights && t.shape[1] % 16 == 0)
      return tagged_md(static_cast<int>(t.shape.size()), t.shape.data(), dt, blocked16_tag(t.shape.size()));
    if (dt == p.dt) return user;
    if (groups == 1) return user_md(t, dt);
    std::vector<int64_t> dims = t.shape, strides = t.strides;
    dims[0] /= groups;
    dims.insert(dims.begin(), groups);
    strides.insert(strides.begin(), strides[0] * dims[1]);
    return strided_md(static_cast<int>(dims.size()), dims.data(), dt, strides.data());
  };
  Md x, y, w, bias_for_pd;
  Pd pd;
  bool picked = false;
  for (;;) {
    x = md_of(p.x, x_user, p.op == FDNN_CONV_BACKWARD_DATA, 1);
    y = md_of(p.y, y_user, p.op == FDNN_CONV_FORWARD, 1);
    w = md_of(p.w, w_user, p.op == FDNN_CONV_BACKWARD_WEIGHT, p.groups);
    bias_for_pd = p.op == FDNN_CONV_BACKWARD_DATA ? Md()
                  : bias_prim && wide && p.op == FDNN_CONV_BACKWARD_WEIGHT
                      ? tagged_md(1, p.bias.shape.data(), dnnl_f32, dnnl_a)
                      : bias_prim;
    try {
      pd = conv_pd(engine, p, x, w, y, bias_for_pd, backward_scaled || wide, &picked);
      break;
    } catch (const DnnlError& e) {
      if (!wide || e.status != dnnl_unimplemented) throw;
      wide = false;
    }
  }
  const Md out_user = p.op == FDNN_CONV_FORWARD ? y_user : p.op == FDNN_CONV_BACKWARD_DATA ? x_user : w_user;
  const dnnl_query_t out_query = p.op == FDNN_CONV_FORWARD         ? dnnl_query_dst_md
                                 : p.op == FDNN_CONV_BACKWARD_DATA ? dnnl_query_diff_src_md
                                                                   : dnnl_query_diff_weights_md;
  // A forward output relaid out by a reorder cannot take the sum post-op (it would read the
  // staging buffer): beta moves to that reorder.
  bool forward_staged = p.op == FDNN_CONV_FORWARD && wide;
  if (p.op == FDNN_CONV_FORWARD && p.beta != 0.f && !wide && !md_equal(query_md(pd, out_query), out_user)) {
    forward_staged = true;
    pd = conv_pd(engine, p, x, w, y, bias_for_pd, true, &picked);
  }
  b->conv = make_primitive(pd);
  b->name = impl_name(pd);
  b->fast = picked || is_fast(b->name);
  size_t scratch = 0;
  {
    const Md s = query_md(pd, dnnl_query_scratchpad_md);
    scratch = md_size(s);
  }
  b->scratchpad = scratch;
  if (scratch > 0) {
    const int64_t bytes = static_cast<int64_t>(scratch);
    b->scratch_md = tagged_md(1, &bytes, dnnl_u8, dnnl_a);
  }
  auto add = [&](int arg, int slot, bool output, const Md& user, dnnl_query_t q) {
    Operand o;
    o.arg = arg;
    o.slot = slot;
    o.output = output;
    o.user = user;
    o.prim = query_md(pd, q);
    b->operands.push_back(std::move(o));
  };
  if (p.op == FDNN_CONV_FORWARD) {
    add(DNNL_ARG_SRC, 0, false, x_user, dnnl_query_src_md);
    add(DNNL_ARG_WEIGHTS, 1, false, w_user, dnnl_query_weights_md);
    add(DNNL_ARG_DST, 2, true, y_user, dnnl_query_dst_md);
    if (bias_prim) add(DNNL_ARG_BIAS, 3, false, bias_user, dnnl_query_weights_md);
    if (bias_prim) b->operands.back().prim = bias_prim;
  } else if (p.op == FDNN_CONV_BACKWARD_DATA) {
    add(DNNL_ARG_DIFF_DST, 2, false, y_user, dnnl_query_diff_dst_md);
    add(DNNL_ARG_WEIGHTS, 1, false, w_user, dnnl_query_weights_md);
    add(DNNL_ARG_DIFF_SRC, 0, true, x_user, dnnl_query_diff_src_md);
  } else {
    add(DNNL_ARG_SRC, 0, false, x_user, dnnl_query_src_md);
    add(DNNL_ARG_DIFF_DST, 2, false, y_user, dnnl_query_diff_dst_md);
    add(DNNL_ARG_DIFF_WEIGHTS, 1, true, w_user, dnnl_query_diff_weights_md);
    if (bias_prim) {
      add(DNNL_ARG_DIFF_BIAS, 3, true, bias_user, dnnl_query_diff_weights_md);
      b->operands.back().prim = bias_for_pd;
    }
  }
  // Gathered copies, then staging buffers, after the scratchpad.
  size_t offset = align64(scratch);
  for (Operand& o : b->operands) {
    if (!gather[o.slot]) continue;
    plan_gather(engine, *caller_tensors[o.slot], p.dt, o);
    o.gather_offset = offset;
    size_t elements = 1;
    for (int64_t d : seen[o.slot]->shape) elements *= static_cast<size_t>(d);
    offset += align64(elements * element_size(p.dt));
  }
  const bool outputs_accumulate = backward_scaled || forward_staged;
  for (Operand& o : b->operands) {
    const bool relayout = !md_equal(o.prim, o.user);
    o.staged = relayout || (o.output && outputs_accumulate);
    if (!o.staged) continue;
    o.offset = offset;
    offset += align64(md_size(o.prim));
    if (!o.output) {
      o.reorder = make_reorder(engine, o.user, o.prim, false, 0.f);
      continue;
    }
    o.scaled = p.op != FDNN_CONV_FORWARD && p.alpha != 1.f;
    o.reorder = make_reorder(engine, o.prim, o.user, o.scaled, p.beta);
  }
  b->workspace = offset;
  if (std::any_of(b->operands.begin(), b->operands.end(), [](const Operand& o) { return o.scaled; })) {
    // alpha as a 1-element float32 memory of the engine (oneDNN's runtime scales are memory),
    // allocated and written once by oneDNN (map/unmap: on a GPU a copy to the device).
    const int64_t one = 1;
    const Md md = tagged_md(1, &one, dnnl_f32, dnnl_a);
    dnnl_memory_t mem = nullptr;
    check(D().dnnl_sycl_interop_memory_create(&mem, md.get(), engine, dnnl_sycl_interop_usm,
                                              DNNL_MEMORY_ALLOCATE),
          "scale memory creation");
    b->alpha = own(mem);
    void* mapped = nullptr;
    check(D().dnnl_memory_map_data(mem, &mapped), "scale memory map");
    std::memcpy(mapped, &p.alpha, sizeof(float));
    check(D().dnnl_memory_unmap_data(mem, mapped), "scale memory unmap");
  }
  b->name += std::string(" (") + layouts_name(algo) + ")";
  return b;
}

// ------------------------------------------------------------------------------------------
// Execution
//
// Ordering and lifetimes (issue 28, deliverable 4). A call submits its primitives and returns
// once they are queued; it never waits on the host.
// - oneDNN's SYCL CPU submission retains the primitive and every dnnl_memory_t argument until
//   its host task has run (cpu/sycl/stream_submit_cpu_primitive.cpp: retain() before the
//   submission, release() in the thunk), so the memory objects of a call are released by the
//   shim at once. What the host task reads and oneDNN does not retain is the dnnl_stream_t
//   (the execution context points at it): the shim's streams live as long as the process
//   (QueueStream), one per (engine, caller's queue), never destroyed with work in flight.
// - In-order queue (torch XPU's streams, dpctl's "in_order"): the queue orders the primitives
//   after its earlier work, after each other and before its later work. Nothing else is done.
// - Out-of-order queue (dpctl's and dpnp's default): oneDNN does not order one primitive after
//   the previous one (its stream forgets the last event after each execution), so the shim
//   orders them with events (dnnl_sycl_interop_primitive_execute's dependencies and returned
//   event; Chain). A queue barrier comes first (ext_oneapi_submit_barrier(): every command
//   submitted to the queue before the call). Each input's staging (its gathers, one after the
//   other, then its reorder) is a branch depending on that barrier only; the convolution
//   depends on the end of every branch (on the barrier when nothing is staged); output
//   reorders follow the convolution one after the other. After the last the shim submits a
//   barrier waiting for every event of the call that nothing later in it depends on, and so
//   for all of its work (on an error too, for what was submitted). On such a queue SYCL orders nothing by itself: the caller's later work is
//   ordered after the call by depending on a barrier submitted after it (measured: a barrier
//   the caller submits then completes after the call's work; a dpnp kernel submitted with no
//   dependency did not wait for it). The plug-in's providers do so, through dpctl's order
//   manager (providers.py); Conv_Plan_Execute has no event to return (the ABI has no field).
// - The caller's pointers (tensors, workspace) must stay valid until the work has run, as
//   with a CUDA stream; the plug-in's Python providers keep the arrays alive (providers.py).

Mem usm_memory(const Md& md, dnnl_engine_t engine, void* ptr) {
  dnnl_memory_t m = nullptr;
  check(D().dnnl_sycl_interop_memory_create(&m, md.get(), engine, dnnl_sycl_interop_usm, ptr),
        "memory creation");
  return own(m);
}

// A oneDNN stream on one caller's queue, kept for the process (see above): oneDNN's host tasks
// read it after submission. One call's submissions at a time go through it (mutex).
struct QueueStream {
  dnnl_stream_t stream = nullptr;
  bool in_order = true;
  std::mutex mutex;
  ~QueueStream() {
    if (stream) D().dnnl_stream_destroy(stream);
  }
};

// The stream of (engine, queue), made on first use. Keyed by the queue's impl (a sycl::queue
// is one std::shared_ptr to it, sycl_lib.hpp), which the stream's own copy of the queue keeps
// alive, so a key is never reused by another queue. Never freed: at most kMostStreams queues
// (an array library uses one or a few per device); beyond that, a call gets a stream of its
// own (`temporary`), which it must wait for before that stream is destroyed with the handle.
constexpr size_t kMostStreams = 256;

struct StreamHandle {
  QueueStream* stream = nullptr;
  std::unique_ptr<QueueStream> temporary;  // beyond kMostStreams: the caller waits
  QueueStream* operator->() const { return stream; }
};

StreamHandle stream_for(dnnl_engine_t engine, void* queue) {
  static std::mutex mutex;
  static auto* cache = new std::map<std::pair<dnnl_engine_t, const void*>, QueueStream*>;
  const void* id = static_cast<const fdnn_sycl::SyclObject*>(queue)->id();
  std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(engine, id);
  StreamHandle h;
  auto it = cache->find(key);
  if (it != cache->end()) {
    h.stream = it->second;
    return h;
  }
  auto s = std::make_unique<QueueStream>();
  check(D().dnnl_sycl_interop_stream_create(&s->stream, engine, queue), "stream creation");
  s->in_order = libraries().sycl.queue_is_in_order(queue);
  h.stream = s.get();
  if (cache->size() < kMostStreams)
    cache->emplace(key, s.release());
  else
    h.temporary = std::move(s);
  return h;
}

// The primitives of one call on one stream (see above). On an in-order queue they run in
// submission order and the rest of this is idle. On an out-of-order queue each primitive
// depends on the events of `deps`: by default the previous primitive's (a serial chain after
// the leading barrier); branch() makes the next one depend on the leading barrier only (an
// independent branch: the input stagings of a call), join() on every event of the call that
// nothing submitted since depends on (the convolution, after every branch).
struct Chain {
  dnnl_stream_t stream;
  void* queue;
  bool in_order;
  fdnn_sycl::SyclObject start;               // out of order: the leading barrier, once submitted
  std::vector<fdnn_sycl::SyclObject> deps;   // what the next primitive depends on (empty: start)
  std::vector<fdnn_sycl::SyclObject> ends;   // the events no later one of the call depends on
  fdnn_sycl::SyclObject last;                // the event of the last primitive (or barrier)
  bool submitted = false;
  char code_location[64] = {};  // sycl::detail::code_location (file, function, line, column)

  Chain(dnnl_stream_t s, void* q, bool ordered) : stream(s), queue(q), in_order(ordered) {}

  // The next primitive starts a branch: after the queue's earlier work only.
  void branch() {
    if (!in_order) deps.clear();
  }
  // The next primitive waits for every branch (every end of the call so far).
  void join() {
    if (!in_order) deps = ends;
  }

  void exec(const Prim& prim, const dnnl_exec_arg_t* args, int nargs, const char* what) {
    if (!in_order && !submitted) {  // after everything submitted to the queue before
      libraries().sycl.queue_barrier(&start, queue, code_location);
      ends.assign(1, start);
      submitted = true;
    }
    if (!in_order && deps.empty()) deps.assign(1, start);
    fdnn_sycl::SyclObject event;
    check(D().dnnl_sycl_interop_primitive_execute(prim.get(), stream, nargs, args, in_order ? nullptr : &deps,
                                                  &event),
          what);
    submitted = true;
    last = event;
    if (in_order) return;
    // The events it depends on are no longer ends of the call; it is one.
    ends.erase(std::remove_if(ends.begin(), ends.end(),
                              [&](const fdnn_sycl::SyclObject& e) {
                                return std::any_of(deps.begin(), deps.end(),
                                                   [&](const fdnn_sycl::SyclObject& d) { return d.id() == e.id(); });
                              }),
               ends.end());
    ends.push_back(event);
    deps.assign(1, event);
  }

  // Out of order: the barrier that orders the queue's later work after the whole call (it
  // waits for every end, and so for every primitive submitted).
  void finish() {
    if (in_order || !submitted) return;
    fdnn_sycl::SyclObject barrier;
    libraries().sycl.queue_barrier_after(&barrier, queue, &ends, code_location);
    last = barrier;
    deps.clear();
    ends.clear();
    submitted = false;
  }

  // The host waits for the chain (plan creation's timing and packing only).
  void wait() {
    finish();
    if (last.impl) libraries().sycl.event_wait(&last);
  }
};

// Enqueues the gather of an overlapping read operand from the caller's `from` into the
// compact copy at `to` (Operand::gathered).
void gather_into(const Operand& o, dnnl_engine_t engine, Chain& chain, void* from, char* to) {
  const int64_t esize = static_cast<int64_t>(o.element_bytes);
  for (const auto& [a, b] : o.slices) {
    Mem src = usm_memory(o.slice_src, engine, static_cast<char*>(from) + a * esize);
    Mem dst = usm_memory(o.slice_dst, engine, to + b * esize);
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, src.get()}, {DNNL_ARG_TO, dst.get()}};
    chain.exec(o.gather, args, 2, "gather");
  }
}

// Runs a built plan on `chain`: inputs staged (each input a branch of the chain), the
// convolution after all of them, outputs written back.
// pointers: x, w, y, bias (USM); workspace: USM, >= b.workspace bytes. The memory objects are
// released on return: oneDNN holds them until its work has run.
void run(const Built& b, Chain& chain, void* const pointers[4], char* workspace) {
  const dnnl_engine_t engine = b.engine;
  std::vector<Mem> keep;  // until every primitive is submitted
  std::vector<dnnl_exec_arg_t> args;
  auto exec = [&](const Prim& prim, std::vector<dnnl_exec_arg_t> a) {
    chain.exec(prim, a.data(), static_cast<int>(a.size()), "execution");
  };
  for (const Operand& o : b.operands) {
    void* user_ptr = pointers[o.slot];
    if (o.arg == DNNL_ARG_WEIGHTS && b.packed_w) {
      args.push_back({o.arg, b.packed_w.get()});
      continue;
    }
    // An input's gathers and staging reorder: a branch of their own, in that order.
    if (!o.output) chain.branch();
    if (o.gathered) {  // slice by slice into the compact copy, which the rest then reads
      char* copy = workspace + o.gather_offset;
      gather_into(o, engine, chain, user_ptr, copy);
      user_ptr = copy;
    }
    Mem user = usm_memory(o.user, engine, user_ptr);
    keep.push_back(user);
    if (!o.staged) {
      args.push_back({o.arg, user.get()});
      continue;
    }
    Mem staged = usm_memory(o.prim, engine, workspace + o.offset);
    keep.push_back(staged);
    if (!o.output) exec(o.reorder, {{DNNL_ARG_FROM, user.get()}, {DNNL_ARG_TO, staged.get()}});
    args.push_back({o.arg, staged.get()});
  }
  if (b.scratchpad > 0) {
    Mem scratch = usm_memory(b.scratch_md, engine, workspace);
    keep.push_back(scratch);
    args.push_back({DNNL_ARG_SCRATCHPAD, scratch.get()});
  }
  chain.join();  // the convolution after every input's branch
  exec(b.conv, args);
  for (size_t i = 0; i < b.operands.size(); ++i) {
    const Operand& o = b.operands[i];
    if (!o.output || !o.staged) continue;
    dnnl_memory_t staged = nullptr, user = nullptr;
    for (const dnnl_exec_arg_t& a : args)
      if (a.arg == o.arg) staged = a.memory;
    Mem u = usm_memory(o.user, engine, pointers[o.slot]);
    keep.push_back(u);
    user = u.get();
    std::vector<dnnl_exec_arg_t> r = {{DNNL_ARG_FROM, staged}, {DNNL_ARG_TO, user}};
    if (o.scaled) r.push_back({DNNL_ARG_ATTR_SCALES | DNNL_ARG_SRC, b.alpha.get()});
    exec(o.reorder, r);
  }
}

struct Plan {
  int32_t op = FDNN_CONV_FORWARD;
  size_t element_size = 4;
  int64_t algo = 0;
  Problem problem;
  std::shared_ptr<Built> first;  // on the engine of plan creation
  size_t workspace_size = 0;
  std::string name;
  bool packed = false;
  // The same primitives on other engines (a queue of another device or context).
  mutable std::mutex mutex;
  mutable std::map<dnnl_engine_t, std::shared_ptr<Built>> others;

  Plan() = default;
  Plan(const Plan& o)
      : op(o.op), element_size(o.element_size), algo(o.algo), problem(o.problem), first(o.first),
        workspace_size(o.workspace_size), name(o.name), packed(o.packed) {}

  std::shared_ptr<Built> on(dnnl_engine_t engine) const {
    if (engine == first->engine) return first;
    if (packed)
      fail(FDNN_ERROR_INVALID_ARGUMENT,
           "onednn_sycl: a plan with packed weights runs on the device and context it was "
           "packed on; this queue is of another");
    std::lock_guard<std::mutex> lock(mutex);
    auto it = others.find(engine);
    if (it != others.end()) return it->second;
    auto b = build(engine, problem, algo);
    if (b->workspace > workspace_size)
      fail(FDNN_ERROR_INVALID_ARGUMENT,
           "onednn_sycl: on this queue's device the plan needs %zu bytes of workspace, more than "
           "the %zu it reported: make the plan with this queue as its stream",
           b->workspace, workspace_size);
    others.emplace(engine, b);
    return b;
  }
};

// FLUX_DNN_SYCL_BLOCKING=1 (read at each call, as CUDA_LAUNCH_BLOCKING is at start): execute
// waits on the host for its own work before it returns, for callers that read results on the
// host with no queue to wait on (the ABI suite and fuzzer on USM shared memory, whose
// host-visible-memory interface has no synchronisation step; flux_dnn_sycl.usm_memory sets
// it) and for debugging.
bool blocking() {
  const char* v = std::getenv("FLUX_DNN_SYCL_BLOCKING");
  return v != nullptr && v[0] != '\0' && v[0] != '0';
}

// Executes on the caller's queue after its earlier work (see Execution above) and returns
// once the work is queued.
void execute_on_queue(const Built& b, void* queue, void* const pointers[4], char* workspace) {
  const StreamHandle qs = stream_for(b.engine, queue);
  std::lock_guard<std::mutex> lock(qs->mutex);
  Chain chain(qs->stream, queue, qs->in_order);
  try {
    run(b, chain, pointers, workspace);
  } catch (...) {
    chain.finish();  // what was submitted stays ordered before the queue's later work
    if (qs.temporary) chain.wait();  // its stream is destroyed on return
    throw;
  }
  if (blocking() || qs.temporary)
    chain.wait();
  else
    chain.finish();
}

[[noreturn]] void fail_vendor(const DnnlError& e, const char* during, const std::string& problem) {
  const int32_t code = e.status == dnnl_unimplemented   ? FDNN_ERROR_UNSUPPORTED
                       : e.status == dnnl_out_of_memory ? FDNN_ERROR_OUT_OF_MEMORY
                                                        : FDNN_ERROR_VENDOR;
  fail(code, "oneDNN (SYCL) %s failed in %s: %s%s; %s", during, e.what, status_text(e.status),
       e.status == dnnl_unimplemented ? " (oneDNN has no implementation of it on this SYCL device)" : "",
       problem.c_str());
}

// ------------------------------------------------------------------------------------------
// Capabilities: probed per device and dtype on oneDNN itself

struct DeviceCaps {
  fdnn_shim::Capabilities op[4][FDNN_NUM_CONV_OPS];  // f32, f16, bf16, f64
  std::string detail[4][FDNN_NUM_CONV_OPS];
};

int dtype_index(dnnl_data_type_t dt) {
  return dt == dnnl_f32 ? 0 : dt == dnnl_f16 ? 1 : dt == dnnl_bf16 ? 2 : dt == dnnl_f64 ? 3 : -1;
}

// Whether oneDNN has a primitive for a small problem of `op` and `dt` on `engine`.
bool probe(dnnl_engine_t engine, int32_t op, dnnl_data_type_t dt) {
  Problem p;
  p.op = op;
  p.rank = 2;
  p.dt = dt;
  p.x = {{1, 4, 6, 6}, {144, 36, 6, 1}};
  p.w = {{4, 4, 3, 3}, {36, 9, 3, 1}};
  p.y = {{1, 4, 4, 4}, {64, 16, 4, 1}};
  p.strides = {1, 1};
  p.dilates = {0, 0};
  p.pad_lo = {0, 0};
  p.pad_hi = {0, 0};
  try {
    build(engine, p, kUserLayouts);
    return true;
  } catch (const DnnlError&) {
    return false;
  }
}

const DeviceCaps& device_caps(int32_t device_id) {
  static std::mutex mutex;
  static auto* cache = new std::map<int32_t, std::unique_ptr<DeviceCaps>>;
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = (*cache)[device_id];
  if (slot) return *slot;
  auto caps = std::make_unique<DeviceCaps>();
  const dnnl_engine_t engine = engine_of_device(device_id);
  const dnnl_data_type_t dts[4] = {dnnl_f32, dnnl_f16, dnnl_bf16, dnnl_f64};
  const char* names[4] = {"float32", "float16", "bfloat16", "float64"};
  for (int d = 0; d < 4; ++d) {
    for (int32_t op = 0; op < FDNN_NUM_CONV_OPS; ++op) {
      fdnn_shim::Capabilities& c = caps->op[d][op];
      if (!probe(engine, op, dts[d])) {
        caps->detail[d][op] = std::string("oneDNN (SYCL) has no ") + names[d] + " " +
                              fdnn_shim::op_name(op) + " convolution on " + device_label(static_cast<size_t>(device_id));
        continue;
      }
      c.support = FDNN_SUPPORT_NATIVE;
      c.spatial_ranks = fdnn_shim::kRanks1To3;
      c.activations = fdnn_shim::activations_of_op(op, fdnn_shim::kEveryActivation);
      c.features = FDNN_FEATURE_GROUPS | FDNN_FEATURE_DILATION | FDNN_FEATURE_ALPHA_BETA |
                   FDNN_FEATURE_ASYMMETRIC_PADDING | FDNN_FEATURE_BENCHMARK;
      if (op == FDNN_CONV_FORWARD) c.features |= FDNN_FEATURE_PACK_WEIGHTS;
      if (op == FDNN_CONV_BACKWARD_WEIGHT) c.features |= FDNN_FEATURE_BIAS_GRADIENT;
      // oneDNN's CPU kernels are deterministic; on a GPU some backward-weights kernels reduce
      // with atomics and oneDNN has no switch for it in 3.9: claim it on CPU devices only.
      if (!fdnn_sycl::devices()[static_cast<size_t>(device_id)].gpu) c.features |= FDNN_FEATURE_DETERMINISTIC;
      caps->detail[d][op] = std::string("oneDNN ") + names[d] + " kernels on " +
                            device_label(static_cast<size_t>(device_id));
    }
  }
  slot = std::move(caps);
  return *slot;
}

fdnn_shim::Capabilities capabilities(int32_t device_id, int32_t op, FDNN_DLDataType dtype) {
  const int d = dtype_index(to_dnnl(dtype));
  if (d < 0) return fdnn_shim::not_computed("oneDNN convolutions take float32, float16, bfloat16 and float64");
  const DeviceCaps& caps = device_caps(device_id);
  fdnn_shim::Capabilities c = caps.op[d][op];
  c.detail = caps.detail[d][op].c_str();
  return c;
}

FDNN_Error* conv_capabilities(FDNN_Conv_Capabilities_Args* args) {
  return fdnn_shim::conv_capabilities(args, [](int32_t device_id, int32_t op, FDNN_DLDataType dtype) {
    check_device_id(device_id);
    try {
      return capabilities(device_id, op, dtype);
    } catch (const DnnlError& e) {
      fail_vendor(e, "capability probe", "");
    }
  });
}

// ------------------------------------------------------------------------------------------
// Plan creation

void check_problem(const FDNN_Conv_Plan_Create_Args& a) {
  require_usable();
  fdnn_shim::check_conv_problem(a, FDNN_DEVICE_ONEAPI, num_devices());
  fdnn_shim::check_covered(a, capabilities(a.x->device.device_id, a.op, a.x->dtype), "the onednn_sycl shim");
  fdnn_shim::check_vendor_int_range(a, INT32_MAX, "oneDNN (SYCL)");
  fdnn_shim::check_compute_type_served(a, "the onednn_sycl shim");
  if (a.algo_policy == FDNN_ALGO_GIVEN && (a.algo_id < 0 || a.algo_id >= kNumAlgos))
    fdnn_shim::fail_unknown_algo(a, "the onednn_sycl shim", "its algorithms are 0 (user layouts), 1 (vendor layouts), 2 (vendor weights) and 3 (blocked 16c layouts)");
}

// A kernel of oneDNN's own, not its reference or gemm-based code, nor its ncsp convolution
// wrapper (jit_uni_ncsp_convolution:conv+...: plain NC[D]HW taken by transposing to
// channels-last and back inside the primitive; measured 2-3x the blocked path on the
// depthwise layer of the ResNet-50 sample). Its matmul form (a 1x1 as one batched matmul on
// NCHW, no transposes) is fast; in float32 conv_pd takes gemm:jit instead where it can.
bool is_fast(const std::string& impl) {
  return impl.find("ref") == std::string::npos && impl.find("gemm") == std::string::npos &&
         impl.find("ncsp_convolution:conv") == std::string::npos;
}

// Times a candidate on buffers oneDNN allocates on the engine, on the caller's queue.
// With the caller's allocator (FDNN_Device_Allocator, the array library's pool) the buffers
// come from it, in bytes as the tensors span, and go back to it before this returns; a
// refusal (NULL) gives up timing (the caller keeps the heuristic's choice): returns < 0.
// Without one, oneDNN allocates USM memory on the engine, zeroed.
struct Lent {
  const FDNN_Device_Allocator* allocator;
  void* queue;
  std::vector<void*> pointers;
  ~Lent() {
    for (void* ptr : pointers) allocator->release(allocator->context, ptr, queue);
  }
};

double time_built(const Built& b, const Problem& p, void* queue, const FDNN_Device_Allocator* allocator) {
  std::vector<Mem> buffers;
  void* pointers[4] = {nullptr, nullptr, nullptr, nullptr};
  const Tensor* tensors[4] = {&p.x, &p.w, &p.y, &p.bias};
  dnnl_engine_t engine = b.engine;
  Lent lent{allocator, queue, {}};
  auto allocate = [&](size_t bytes) -> void* {
    if (allocator != nullptr) {
      void* ptr = allocator->allocate(allocator->context, std::max<size_t>(bytes, 1), queue);
      if (ptr != nullptr) lent.pointers.push_back(ptr);
      return ptr;
    }
    const int64_t n = static_cast<int64_t>(std::max<size_t>(bytes, 64));
    dnnl_memory_t m = nullptr;
    check(D().dnnl_sycl_interop_memory_create(&m, tagged_md(1, &n, dnnl_u8, dnnl_a).get(), engine,
                                              dnnl_sycl_interop_usm, DNNL_MEMORY_ALLOCATE),
          "benchmark memory");
    buffers.push_back(own(m));
    void* mapped = nullptr;  // zeroed: no NaN or denormal slows a candidate
    check(D().dnnl_memory_map_data(m, &mapped), "benchmark memory map");
    std::memset(mapped, 0, static_cast<size_t>(n));
    check(D().dnnl_memory_unmap_data(m, mapped), "benchmark memory unmap");
    void* handle = nullptr;
    check(D().dnnl_memory_get_data_handle(m, &handle), "benchmark memory handle");
    return handle;
  };
  for (int i = 0; i < 4; ++i) {
    if (!tensors[i]->present()) continue;
    size_t span = 1;
    for (size_t d = 0; d < tensors[i]->shape.size(); ++d)
      span += static_cast<size_t>(tensors[i]->shape[d] - 1) * static_cast<size_t>(tensors[i]->strides[d]);
    pointers[i] = allocate(span * element_size(p.dt));
    if (pointers[i] == nullptr) return -1;
  }
  char* workspace = static_cast<char*>(allocate(b.workspace));
  if (workspace == nullptr && b.workspace > 0) return -1;
  using clock = std::chrono::steady_clock;
  const StreamHandle qs = stream_for(engine, queue);
  std::lock_guard<std::mutex> lock(qs->mutex);
  double best = 1e30;
  for (int r = 0; r < 4; ++r) {  // the first is a warm-up
    Chain chain(qs->stream, queue, qs->in_order);
    const auto t0 = clock::now();
    try {
      run(b, chain, pointers, workspace);
    } catch (...) {
      chain.wait();  // the buffers are released when this returns
      throw;
    }
    chain.wait();
    if (r == 0) continue;
    best = std::min(best, std::chrono::duration<double>(clock::now() - t0).count());
  }
  return best;
}

void create_plan(FDNN_Conv_Plan_Create_Args* args) {
  const FDNN_Conv_Plan_Create_Args& a = *args;
  check_problem(a);
  const std::string described = fdnn_shim::describe_problem(a);
  auto plan = std::make_unique<Plan>();
  plan->problem = problem_of(a);
  plan->op = a.op;
  plan->element_size = fdnn_shim::element_bytes(a.x->dtype);
  try {
    const dnnl_engine_t engine = a.stream != nullptr ? engine_of_queue(a.stream)
                                                     : engine_of_device(a.x->device.device_id);
    auto fits = [&](const std::shared_ptr<Built>& b) { return b->workspace <= a.workspace_limit; };
    std::shared_ptr<Built> chosen;
    int64_t algo = 0;
    if (a.algo_policy == FDNN_ALGO_GIVEN) {
      algo = a.algo_id;
      try {
        chosen = build(engine, plan->problem, algo);
      } catch (const DnnlError& e) {
        if (e.status != dnnl_unimplemented) throw;
        fdnn_shim::fail_algo_cannot_compute(a, "the onednn_sycl shim", "oneDNN has no implementation of its layouts here");
      }
    } else {
      // The heuristic, as the CPU shim's: the caller's layouts when oneDNN runs them in a fast
      // kernel; else its activation layouts with oneDNN's weights; else, for plain NC[D]HW
      // activations with 16k channels, nC[d]hw16c ones (oneDNN 3.9's preferred layouts on
      // AVX-512 are channels-last, whose reorders from and to NCHW are slow: jit:uni, 2-5x
      // the blocked jit:blk ones, measured on the ResNet-50 sample); else oneDNN's own
      // layouts. Each where it fits the workspace limit. The benchmark policy times them all.
      const bool benchmark = a.algo_policy == FDNN_ALGO_BENCHMARK && a.stream != nullptr;
      std::vector<std::pair<int64_t, std::shared_ptr<Built>>> built;
      auto attempt = [&](int64_t layouts) -> std::shared_ptr<Built> {
        try {
          auto b = build(engine, plan->problem, layouts);
          built.emplace_back(layouts, b);
          return b;
        } catch (const DnnlError& e) {
          if (e.status != dnnl_unimplemented) throw;
          return nullptr;
        }
      };
      auto good = [&](const std::shared_ptr<Built>& b) { return b && fits(b) && b->fast; };
      const Problem& pr = plan->problem;
      auto plain = [](const Tensor& t) { return t.strides == compact_strides(t.shape); };
      const bool blockable = plain(pr.x) && plain(pr.y) && (pr.x.shape[1] % 16 == 0 || pr.y.shape[1] % 16 == 0);
      for (int64_t layouts : {kUserLayouts, kVendorWeights, kBlocked16, kVendorLayouts}) {
        if (layouts == kBlocked16 && !blockable) continue;
        const auto b = attempt(layouts);
        if (!benchmark && good(b)) {
          chosen = b;
          break;
        }
      }
      if (!chosen) {
        std::vector<std::pair<int64_t, std::shared_ptr<Built>>> candidates;
        for (auto& c : built)
          if (fits(c.second)) candidates.push_back(c);
        size_t most = 0;
        for (auto& c : candidates) most = std::max(most, c.second->workspace);
        if (benchmark && candidates.size() > 1 && fdnn_shim::benchmark_fits(a, most)) {
          const auto* allocator = reinterpret_cast<const FDNN_Device_Allocator*>(fdnn_shim::find_extension(
              a.extension_start, FDNN_EXTENSION_DEVICE_ALLOCATOR, FDNN_Device_Allocator_STRUCT_SIZE, "Conv_Plan_Create"));
          double best = -1;
          for (auto& c : candidates) {
            const double t = time_built(*c.second, pr, a.stream, allocator);
            if (t < 0) {  // the allocator refused: the heuristic's choice below
              best = -1;
              chosen.reset();
              break;
            }
            if (best < 0 || t < best) {
              best = t;
              chosen = c.second;
            }
          }
        }
        if (!chosen)  // the first fast candidate, else oneDNN's own layouts, else any
          for (auto& c : candidates)
            if (c.second->fast) {
              chosen = c.second;
              break;
            }
        if (!chosen)
          for (auto& c : candidates)
            if (c.first == kVendorLayouts) chosen = c.second;
        if (!chosen && !candidates.empty()) chosen = candidates.front().second;
        if (!chosen && !built.empty()) chosen = built.front().second;  // refused below: the limit
      }
      if (!chosen) throw DnnlError{dnnl_unimplemented, "convolution descriptor creation"};
      for (auto& c : built)
        if (c.second == chosen) algo = c.first;
    }
    if (chosen->workspace > a.workspace_limit)
      fail(FDNN_ERROR_UNSUPPORTED,
           "the onednn_sycl shim needs at least %zu bytes of workspace, the limit "
           "(workspace_limit) is %zu: %s",
           chosen->workspace, a.workspace_limit, described.c_str());
    plan->algo = algo;
    plan->first = chosen;
    plan->workspace_size = chosen->workspace;
    plan->name = chosen->name;
  } catch (const DnnlError& e) {
    fail_vendor(e, "plan creation", described);
  }
  Plan* owned = plan.release();
  args->plan = reinterpret_cast<FDNN_Plan*>(owned);
  args->workspace_size = owned->workspace_size;
  args->chosen_algo_id = owned->algo;
  args->algo_name = owned->name.c_str();
}

FDNN_Error* plan_create(FDNN_Conv_Plan_Create_Args* args) {
  return fdnn_shim::guarded([&] {
    fdnn_shim::check_struct_size(args, FDNN_Conv_Plan_Create_Args_STRUCT_SIZE, "Conv_Plan_Create");
    create_plan(args);
  });
}

FDNN_Error* plan_execute(FDNN_Conv_Plan_Execute_Args* args) {
  return fdnn_shim::guarded([&] {
    fdnn_shim::check_struct_size(args, FDNN_Conv_Plan_Execute_Args_STRUCT_SIZE, "Conv_Plan_Execute");
    const Plan& plan = fdnn_shim::plan_of<Plan>(args->plan, "Conv_Plan_Execute");
    fdnn_shim::NeededPointers needed;
    needed.x = needed.y = true;
    needed.w = !plan.packed;
    needed.bias = plan.problem.bias.present();
    fdnn_shim::check_execute_args(*args, plan.element_size, plan.workspace_size, needed);
    if (args->stream == nullptr)
      fail(FDNN_ERROR_INVALID_ARGUMENT,
           "Conv_Plan_Execute: stream is NULL; the onednn_sycl shim runs on the caller's "
           "sycl::queue* (it has no queue of its own)");
    void* const pointers[4] = {args->x, args->w, args->y, args->bias};
    try {
      const std::shared_ptr<Built> b = plan.on(engine_of_queue(args->stream));
      execute_on_queue(*b, args->stream, pointers, static_cast<char*>(args->workspace));
    } catch (const DnnlError& e) {
      fail(FDNN_ERROR_VENDOR, "oneDNN (SYCL) execution of %s failed in %s: %s", plan.name.c_str(),
           e.what, status_text(e.status));
    }
  });
}

// A copy of a forward plan whose weights are a plan-owned oneDNN memory in the primitive's
// layout, filled once on the caller's queue.
FDNN_Error* plan_pack_weights(FDNN_Conv_Plan_Pack_Weights_Args* args) {
  return fdnn_shim::guarded([&] {
    fdnn_shim::check_struct_size(args, FDNN_Conv_Plan_Pack_Weights_Args_STRUCT_SIZE, "Conv_Plan_Pack_Weights");
    const Plan& source = fdnn_shim::plan_of<Plan>(args->plan, "Conv_Plan_Pack_Weights");
    fdnn_shim::check_pack_args(*args, source.op, source.element_size);
    if (args->stream == nullptr)
      fail(FDNN_ERROR_INVALID_ARGUMENT,
           "Conv_Plan_Pack_Weights: stream is NULL; the onednn_sycl shim copies on the caller's "
           "sycl::queue*");
    auto packed = std::make_unique<Plan>(source);
    try {
      const dnnl_engine_t engine = engine_of_queue(args->stream);
      auto built = std::make_shared<Built>(*source.on(engine));
      for (Operand& o : built->operands) {
        if (o.arg != DNNL_ARG_WEIGHTS) continue;
        dnnl_memory_t mem = nullptr;
        check(D().dnnl_sycl_interop_memory_create(&mem, o.prim.get(), engine, dnnl_sycl_interop_usm,
                                                  DNNL_MEMORY_ALLOCATE),
              "packed weights allocation");
        built->packed_w = own(mem);
        // Filled on the caller's queue after its earlier work; the host waits for it (once
        // per packing), so the packed plan is ready whatever queue runs it later.
        const StreamHandle qs = stream_for(engine, args->stream);
        std::lock_guard<std::mutex> lock(qs->mutex);
        Chain chain(qs->stream, args->stream, qs->in_order);
        std::vector<Mem> keep;
        void* w = const_cast<void*>(args->w);
        try {
          if (o.gathered) {  // weights with overlapping strides: their compact copy first
            dnnl_memory_t compact = nullptr;
            check(D().dnnl_sycl_interop_memory_create(&compact, o.user.get(), engine, dnnl_sycl_interop_usm,
                                                      DNNL_MEMORY_ALLOCATE),
                  "gather buffer allocation");
            keep.push_back(own(compact));
            void* handle = nullptr;
            check(D().dnnl_memory_get_data_handle(compact, &handle), "gather buffer");
            gather_into(o, engine, chain, w, static_cast<char*>(handle));
            w = handle;
          }
          Mem user = usm_memory(o.user, engine, w);
          Prim copy = make_reorder(engine, o.user, o.prim, false, 0.f);
          dnnl_exec_arg_t r[2] = {{DNNL_ARG_FROM, user.get()}, {DNNL_ARG_TO, mem}};
          chain.exec(copy, r, 2, "weight packing");
        } catch (...) {
          chain.wait();
          throw;
        }
        chain.wait();
        o.staged = false;
        o.gathered = false;
      }
      packed->first = built;
      packed->packed = true;
      packed->others.clear();
    } catch (const DnnlError& e) {
      fail(FDNN_ERROR_VENDOR, "oneDNN (SYCL) weight packing for %s failed in %s: %s",
           source.name.c_str(), e.what, status_text(e.status));
    }
    packed->name += " [packed weights]";
    args->workspace_size = packed->workspace_size;
    args->packed_plan = reinterpret_cast<FDNN_Plan*>(packed.release());
  });
}

void plan_destroy(FDNN_Plan_Destroy_Args* args) {
  if (args != nullptr) delete reinterpret_cast<Plan*>(args->plan);
}

// ------------------------------------------------------------------------------------------
// Shim and device information

const std::string& runtime_version() {
  static const std::string text = [] {
    if (!libraries().usable()) return std::string();
    const dnnl_version_t* v = D().dnnl_version();
    return std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
  }();
  return text;
}

FDNN_Error* shim_info(FDNN_Shim_Info_Args* args) {
  return fdnn_shim::guarded([&] {
    fdnn_shim::check_struct_size(args, FDNN_Shim_Info_Args_STRUCT_SIZE, "Shim_Info");
    static const std::string built = std::to_string(DNNL_VERSION_MAJOR) + "." +
                                     std::to_string(DNNL_VERSION_MINOR) + "." +
                                     std::to_string(DNNL_VERSION_PATCH);
    const char* why = unavailable_reason();
    args->shim_name = "onednn_sycl";
    args->vendor_name = "oneDNN (SYCL)";
    args->vendor_version_built = built.c_str();
    args->vendor_version_runtime = runtime_version().c_str();
    args->shim_version = FLUX_DNN_VERSION_STRING;
    args->device_type = FDNN_DEVICE_ONEAPI;
    args->num_devices = why ? 0 : num_devices();
    args->priority = FDNN_PRIORITY_VENDOR;
    args->unavailable_reason = why;
  });
}

FDNN_Error* device_describe(FDNN_Device_Describe_Args* args) {
  return fdnn_shim::guarded([&] {
    fdnn_shim::check_struct_size(args, FDNN_Device_Describe_Args_STRUCT_SIZE, "Device_Describe");
    check_device_id(args->device_id);
    static std::mutex mutex;
    static auto* names = new std::map<int32_t, std::string>;
    std::lock_guard<std::mutex> lock(mutex);
    auto& name = (*names)[args->device_id];
    if (name.empty()) name = device_label(static_cast<size_t>(args->device_id)) + ", oneDNN " + runtime_version();
    args->default_flags = 0;
    args->name = name.c_str();
  });
}

const FDNN_Api kApi = {
    FDNN_Api_STRUCT_SIZE,
    FDNN_ABI_MAJOR,
    FDNN_ABI_MINOR,
    nullptr,  // extension_start
    fdnn_shim::error_destroy,
    fdnn_shim::error_describe,
    shim_info,
    device_describe,
    conv_capabilities,
    plan_create,
    plan_execute,
    plan_destroy,
    plan_pack_weights,
};

}  // namespace

extern "C" FDNN_EXPORT const FDNN_Api* fdnn_get_api(void) { return &kApi; }
