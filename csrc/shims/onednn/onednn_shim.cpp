// The oneDNN shim: flux_dnn's ABI on oneDNN's CPU convolution primitives.
//
// A plan is one oneDNN convolution primitive (forward, backward-data or backward-weights)
// created once, plus the reorders between the caller's strided layouts and the layouts the
// primitive computes in, when those differ. Everything a call needs beyond the caller's
// arrays -- oneDNN's scratchpad (user scratchpad mode) and the staging buffers of the
// reorders -- lives in the caller's workspace, so a plan holds no mutable state, runs on
// several threads at once, and no call allocates. A small float32 forward problem is
// computed without a primitive, as im2col + dnnl_sgemm (im2col_gemm.hpp), on the same terms.
#include <oneapi/dnnl/dnnl.hpp>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstring>
#include <unordered_map>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "convert16.hpp"
#include "im2col_gemm.hpp"
#include "shim_common.hpp"

using dnnl::memory;
using fdnn_shim::fail;

namespace {

// ------------------------------------------------------------------------------------------
// Engine, version, errors

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

const char* isa_name(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx2_vnni_2: return "avx2_vnni_2";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_fp16: return "avx512_core_fp16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    case dnnl::cpu_isa::avx512_core_amx_fp16: return "avx512_core_amx_fp16";
    default: return "generic";
  }
}

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

const std::string& runtime_version() {
  static const std::string text = [] {
    const dnnl_version_t* v = dnnl_version();
    return std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
           std::to_string(v->patch);
  }();
  return text;
}

const std::string& device_name() {
  static const std::string text =
      std::string("x86-64 CPU, oneDNN ISA ") + isa_name(dnnl::get_effective_cpu_isa());
  return text;
}

memory::data_type to_dnnl(FDNN_DLDataType t) {
  if (t.lanes == 1 && t.code == FDNN_DTYPE_FLOAT && t.bits == 32) return memory::data_type::f32;
  if (t.lanes == 1 && t.code == FDNN_DTYPE_FLOAT && t.bits == 16) return memory::data_type::f16;
  if (t.lanes == 1 && t.code == FDNN_DTYPE_BFLOAT && t.bits == 16) return memory::data_type::bf16;
  return memory::data_type::undef;
}

bool is_16bit(memory::data_type dt) {
  return dt == memory::data_type::f16 || dt == memory::data_type::bf16;
}

// Turns a dnnl::error into an FDNN failure with oneDNN's status and the conv parameters.
[[noreturn]] void fail_vendor(const dnnl::error& e, const FDNN_Conv_Plan_Create_Args& a,
                              const char* during) {
  int32_t code = FDNN_ERROR_VENDOR;
  std::string hint;
  if (e.status == dnnl_unimplemented) {
    code = FDNN_ERROR_UNSUPPORTED;
    const memory::data_type dt = to_dnnl(a.x->dtype);
    const char* needs = dt == memory::data_type::bf16   ? "; bfloat16 needs avx512_core or newer"
                        : dt == memory::data_type::f16 ? "; float16 needs avx512_core_fp16"
                                                       : "";
    hint = std::string(" (oneDNN has no implementation of this convolution for ") +
           fdnn_shim::dtype_name(a.x->dtype) + " on this CPU, whose instruction set is " +
           isa_name(dnnl::get_effective_cpu_isa()) + needs + ")";
  } else if (e.status == dnnl_out_of_memory) {
    code = FDNN_ERROR_OUT_OF_MEMORY;
  }
  fail(code, "oneDNN %s failed: %s (%s)%s; %s", during, status_text(e.status), e.what(),
       hint.c_str(), fdnn_shim::describe_problem(a).c_str());
}

// ------------------------------------------------------------------------------------------
// Problem checks (what the ABI promises callers we verify; a bad problem never reaches oneDNN)

fdnn_shim::Capabilities capabilities(int32_t op, FDNN_DLDataType dtype);

// The shared rules (fdnn_shim::check_conv_problem), what this shim reports it computes
// (fdnn_shim::check_covered), then what only oneDNN asks.
void check_problem(const FDNN_Conv_Plan_Create_Args& a) {
  fdnn_shim::check_conv_problem(a, FDNN_DEVICE_CPU, /*num_devices=*/1);
  fdnn_shim::check_covered(a, capabilities(a.op, a.x->dtype), "the oneDNN shim");
  // oneDNN's kernels set up in int (products of dims included: a SIGFPE or a hang beyond it),
  // so no tensor's element count or span, and no spatial parameter, may exceed INT32_MAX.
  fdnn_shim::check_vendor_int_range(a, INT32_MAX, "oneDNN");
  fdnn_shim::check_compute_type_served(a, "the oneDNN shim");
  if (a.algo_policy == FDNN_ALGO_GIVEN && (a.algo_id < 0 || a.algo_id > fdnn_onednn::kIm2colGemmAlgo))
    fdnn_shim::fail_unknown_algo(a, "the oneDNN shim", "its algorithms are 0 to 8");
}

// ------------------------------------------------------------------------------------------
// Memory descriptors

memory::dims dims_of(const FDNN_DLTensor* t) { return memory::dims(t->shape, t->shape + t->ndim); }

// Whether the caller's strides make elements overlap (a read tensor: a broadcast, a sliding
// window). oneDNN's memory descriptors refuse such strides ("could not construct a memory
// descriptor using strides"), so the shim gathers the tensor into a compact copy in the
// workspace first (Operand::gathered) and oneDNN sees that copy.
bool overlaps(const FDNN_DLTensor* t) { return fdnn_shim::overlapping_dim(*t) >= 0; }

// The strides oneDNN sees of a caller's tensor: its own, or the compact row-major ones of its
// gathered copy.
memory::dims strides_of(const FDNN_DLTensor* t) {
  if (!overlaps(t)) return memory::dims(t->strides, t->strides + t->ndim);
  memory::dims compact(static_cast<size_t>(t->ndim));
  int64_t step = 1;
  for (int i = t->ndim - 1; i >= 0; --i) {
    compact[static_cast<size_t>(i)] = step;
    step *= t->shape[i];
  }
  return compact;
}

// The caller's weights (K, C/g, *k) seen as oneDNN's grouped weights (g, K/g, C/g, *k).
memory::desc weights_md(const FDNN_DLTensor* w, int64_t groups, memory::data_type dt) {
  memory::dims dims = dims_of(w), strides = strides_of(w);
  if (groups == 1) return memory::desc(dims, dt, strides);
  dims[0] /= groups;
  dims.insert(dims.begin(), groups);
  strides.insert(strides.begin(), strides[0] * dims[1]);
  return memory::desc(dims, dt, strides);
}

memory::desc any_like(const memory::desc& md) {
  return memory::desc(md.get_dims(), md.get_data_type(), memory::format_tag::any);
}

// Layout policies, the algorithms of this shim (FDNN algo ids).
enum Layouts : int64_t {
  kUserLayouts = 0,    // compute in the caller's layouts: no reorder at all
  kVendorWeights = 1,  // caller's activation layouts, weights in oneDNN's preferred layout
  kVendorLayouts = 2,  // all in oneDNN's preferred (blocked) layouts, reorders around
  kBlocked16 = 3,      // activations in oneDNN's nC[d]hw16c blocked layout, reorders around
};
// An algorithm id is a layout policy, plus kConverted when a 16-bit problem is computed in
// float32: its operands are converted by the reorders that stage them in the workspace, and
// the result is rounded once, by the reorder that writes it (after bias, the activation,
// alpha and beta, which the float32 primitive and that reorder apply).
constexpr int64_t kConverted = 4;

const char* layouts_name(int64_t l) {
  return l == kUserLayouts     ? "user layouts"
         : l == kVendorWeights ? "vendor weights"
         : l == kBlocked16     ? "blocked 16c layouts"
                               : "vendor layouts";
}

// ------------------------------------------------------------------------------------------
// The plan

// One operand of the primitive. When the primitive's layout differs from the caller's, or
// the output needs alpha/beta applied by a reorder, it is staged through the workspace.
struct Operand {
  int arg = 0;       // DNNL_ARG_* of the convolution primitive
  int slot = 0;      // 0 x, 1 w, 2 y, 3 bias: which caller pointer
  bool output = false;
  memory::desc user_md, prim_md;
  bool staged = false;
  size_t offset = 0;         // of the staging buffer in the workspace
  dnnl::primitive reorder;   // input: user -> staging; output: staging -> user
  bool reorder_scaled = false;  // the reorder applies alpha through a source scale
  // Weights packed into the plan (Conv_Plan_Pack_Weights): used instead of the caller's.
  std::shared_ptr<void> packed;
  // A dense 16-bit operand of a plan computed in float32: this shim widens it into (input) or
  // narrows it from (output: alpha, beta, one rounding) a float32 copy in the caller's strides
  // at `wide_offset` in the workspace, with F16C where the CPU has it; oneDNN 3.2 converts
  // through its generic reorder on CPUs without AVX512-FP16, 50 to 200 times slower. The
  // primitive, or the staging reorder when the layouts differ, then uses the copy.
  bool widened = false;
  fdnn_shim::Half16 half_type = fdnn_shim::Half16::kFloat16;
  memory::desc wide_md;  // float32, the caller's strides
  size_t wide_offset = 0;
  size_t elements = 0;
  float narrow_alpha = 1.f;  // alpha the narrowing applies (backward ops: forward has it fused)
  // A read operand whose caller's strides overlap (see overlaps): copied element by element
  // into a compact row-major buffer at `gather_offset` in the workspace before anything
  // reads it; everything after (widening, staging reorder, the primitive) reads that copy.
  bool gathered = false;
  size_t gather_offset = 0;
  std::vector<int64_t> caller_shape, caller_strides;  // the caller's layout, for the gather
  size_t element_bytes = 0;
};

uint64_t next_plan_id() {
  static std::atomic<uint64_t> last{0};
  return ++last;
}

struct Plan {
  uint64_t id = next_plan_id();  // never reused: keys the per-thread bound arguments
  int32_t op = FDNN_CONV_FORWARD;
  size_t element_size = 4;       // of the caller's dtype: execute checks pointer alignment
  int threads = 0;               // OpenMP team size for creation and execution; 0: all
  dnnl::primitive conv;
  std::vector<Operand> operands;
  size_t scratchpad_size = 0;
  size_t workspace_size = 0;
  float alpha = 1.f;
  float beta = 0.f;
  int64_t algo_id = 0;
  std::string name;
  // The small-problem path (im2col + dnnl_sgemm, algo id 8): set instead of `conv` and
  // `operands`; shared by a plan and its packed copy until packing replaces it.
  std::shared_ptr<const fdnn_onednn::Im2colGemm> gemm;
};

// The problem in oneDNN's terms, shared by every layout policy. `dt` is the dtype the
// primitive computes in: the caller's, or float32 for a converted 16-bit problem, whose
// operands are then staged (converted) through the workspace by the operands' reorders.
struct Problem {
  const FDNN_Conv_Plan_Create_Args* args;
  memory::data_type dt;
  memory::desc x, w, y, bias;                      // the caller's layouts, in dt
  memory::desc x_user, w_user, y_user, bias_user;  // the caller's layouts and dtype
  memory::dims strides, dilates, pad_lo, pad_hi;
  size_t scratchpad_limit = SIZE_MAX;  // bytes the primitive's scratchpad may take, if it can
};

Problem describe(const FDNN_Conv_Plan_Create_Args& a, bool convert) {
  Problem p;
  p.args = &a;
  const memory::data_type user_dt = to_dnnl(a.x->dtype);
  p.dt = convert ? memory::data_type::f32 : user_dt;
  const bool bias = fdnn_shim::has_tensor(a.bias);
  for (const auto& [md, dt] : {std::pair{&p.x, p.dt}, std::pair{&p.x_user, user_dt}})
    *md = memory::desc(dims_of(a.x), dt, strides_of(a.x));
  for (const auto& [md, dt] : {std::pair{&p.y, p.dt}, std::pair{&p.y_user, user_dt}})
    *md = memory::desc(dims_of(a.y), dt, strides_of(a.y));
  p.w = weights_md(a.w, a.groups, p.dt);
  p.w_user = weights_md(a.w, a.groups, user_dt);
  if (bias) {
    // Dense for the primitive whatever the caller's strides: oneDNN's kernels read K biases
    // in a row, so a broadcast (stride 0) bias is staged dense, not read past its buffer.
    p.bias = memory::desc(dims_of(a.bias), p.dt, memory::format_tag::a);
    p.bias_user = memory::desc(dims_of(a.bias), user_dt, strides_of(a.bias));
  }
  for (int i = 0; i < a.spatial_rank; ++i) {
    p.strides.push_back(a.stride[i]);
    p.dilates.push_back(a.dilation[i] - 1);  // oneDNN counts the gaps
    p.pad_lo.push_back(a.padding_lo[i]);
    p.pad_hi.push_back(a.padding_hi[i]);
  }
  return p;
}

dnnl::algorithm eltwise_of(int32_t act) {
  switch (act) {
    case FDNN_ACTIVATION_RELU:
    case FDNN_ACTIVATION_LEAKY_RELU: return dnnl::algorithm::eltwise_relu;
    case FDNN_ACTIVATION_CLIP: return dnnl::algorithm::eltwise_clip;
    case FDNN_ACTIVATION_SIGMOID: return dnnl::algorithm::eltwise_logistic;
    case FDNN_ACTIVATION_TANH: return dnnl::algorithm::eltwise_tanh;
    case FDNN_ACTIVATION_GELU_TANH: return dnnl::algorithm::eltwise_gelu_tanh;
    case FDNN_ACTIVATION_GELU_ERF: return dnnl::algorithm::eltwise_gelu_erf;
    case FDNN_ACTIVATION_SILU: return dnnl::algorithm::eltwise_swish;
    default: fail(FDNN_ERROR_INVALID_ARGUMENT, "unknown activation %d", static_cast<int>(act));
  }
}

// The header's forward epilogue, y = alpha * act(conv + bias) + beta * y, as post-ops after
// the primitive's bias: the activation, then alpha (eltwise_linear), then beta accumulation
// (the latter only when the output is not staged; a staged output accumulates in its reorder).
dnnl::post_ops forward_post_ops(const FDNN_Conv_Plan_Create_Args& a, bool output_staged) {
  dnnl::post_ops ops;
  if (a.activation != FDNN_ACTIVATION_NONE) {
    // oneDNN's eltwise parameters: relu's alpha is the negative slope, clip's are the bounds,
    // swish's alpha is the sigmoid's scale (1 for SiLU).
    float alpha = a.activation == FDNN_ACTIVATION_LEAKY_RELU || a.activation == FDNN_ACTIVATION_CLIP
                      ? a.activation_alpha
                  : a.activation == FDNN_ACTIVATION_SILU ? 1.f : 0.f;
    float beta = a.activation == FDNN_ACTIVATION_CLIP ? a.activation_beta : 0.f;
    ops.append_eltwise(eltwise_of(a.activation), alpha, beta);
  }
  if (a.alpha != 1.f) ops.append_eltwise(dnnl::algorithm::eltwise_linear, a.alpha, 0.f);
  if (a.beta != 0.f && !output_staged) ops.append_sum(a.beta);
  return ops;
}

dnnl::primitive_attr base_attr(const FDNN_Conv_Plan_Create_Args& a) {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  // Reduced precision lets oneDNN compute fp32 convolutions in bf16 (AMX, AVX512-BF16).
  if ((a.flags & FDNN_CONV_ALLOW_REDUCED_PRECISION) && to_dnnl(a.x->dtype) == memory::data_type::f32)
    attr.set_fpmath_mode(dnnl::fpmath_mode::bf16);
  return attr;
}

dnnl::convolution_forward::primitive_desc forward_pd(const Problem& p, const memory::desc& x,
                                                     const memory::desc& w,
                                                     const memory::desc& y,
                                                     const dnnl::primitive_attr& attr,
                                                     dnnl::prop_kind kind) {
  const memory::desc no_bias;
  const bool bias = p.args->op == FDNN_CONV_FORWARD && !p.bias.is_zero();
  return dnnl::convolution_forward::primitive_desc(
      cpu_engine(), kind, dnnl::algorithm::convolution_direct, x, w, bias ? p.bias : no_bias, y,
      p.strides, p.dilates, p.pad_lo, p.pad_hi, attr);
}

// oneDNN 3.2's backward-weights JIT kernels for 1x1 convolutions ("jit_1x1:avx2",
// "jit_1x1:avx512_core", the bf16 one) copy a strided source into a unit-stride per-thread
// buffer ("rtus") whose rows they address in the ISA's channel block (8 channels on AVX2, 16
// on AVX-512) while the buffer holds rows of the real channel count when the source is plain
// channels-last: with fewer input channels per group than the block they write past their
// scratchpad -- wrong weights, then heap corruption ("double free or corruption" at exit).
// oneDNN issue 6035, open upstream. Checked on AVX2 through guard pages behind the
// workspace (1-D and 2-D, 1 and 2 threads): 2 to 7 channels crash or are wrong, 8 to 32 are
// right, as are blocked sources (algo 2, 3) and stride 1 (no rtus); the AVX-512 bound, 16, is
// the upstream report's. Whether a backward-weights primitive descriptor chose that kernel
// for that case:
bool hits_onednn_issue_6035(const FDNN_Conv_Plan_Create_Args& a,
                            const dnnl::convolution_backward_weights::primitive_desc& pd) {
  const std::string impl = pd.impl_info_str();
  if (impl.find("jit") == std::string::npos || impl.find("1x1") == std::string::npos)
    return false;
  bool strided = false;
  for (int i = 0; i < a.spatial_rank; ++i) strided = strided || a.stride[i] > 1;
  if (!strided) return false;  // no rtus buffer
  if (pd.src_desc().get_inner_nblks() != 0) return false;  // blocked source: addressed right
  const bool block8 =
      impl.find("avx2") != std::string::npos || impl.find("sse41") != std::string::npos;
  return a.x->shape[1] / a.groups < (block8 ? 8 : 16);
}

// Whether some output element of spatial dim i reads padding only (every tap of its window
// falls outside the input): lo or hi at least the dilated kernel's extent, or a dilation that
// steps over an input shorter than it.
bool padding_only_output(const FDNN_Conv_Plan_Create_Args& a, int i) {
  const int64_t n = a.x->shape[2 + i], k = a.w->shape[2 + i], out = a.y->shape[2 + i];
  for (int64_t j = 0; j < out; ++j) {
    bool reads_input = false;
    for (int64_t t = 0; t < k && !reads_input; ++t) {
      const int64_t at = j * a.stride[i] - a.padding_lo[i] + t * a.dilation[i];
      reads_input = at >= 0 && at < n;
    }
    if (!reads_input) return true;
  }
  return false;
}

// oneDNN 3.2's AMX brgemm convolution ("brg_conv_fwd:avx512_core_amx", bfloat16 on CPUs with
// AMX) crashes (SIGSEGV in brgemm_convolution_fwd_t::add_po_kernels, at primitive creation)
// for some 3-D problems whose output has elements that read padding only, e.g. x 2x1x2, w
// 3x2x2, stride and dilation (1, 2, 1), padding lo (1, 1, 2) hi (2, 1, 0): found by the ABI
// fuzzer (seed 1, case 820) on a Xeon with AMX; ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 avoids it.
// The kernels that post-process padding-only output are where it fails, so such problems
// skip AMX brgemm implementations, whatever the rank and op (a cheap precaution: these
// problems are rare and small).
bool hits_amx_padding_crash(const FDNN_Conv_Plan_Create_Args& a, const std::string& impl) {
  if (impl.find("amx") == std::string::npos || impl.find("brg") == std::string::npos) return false;
  for (int i = 0; i < a.spatial_rank; ++i)
    if (padding_only_output(a, i)) return true;
  return false;
}

// Whether this shim may run the implementation a primitive descriptor points at.
bool runnable(const FDNN_Conv_Plan_Create_Args& a, const dnnl::primitive_desc& pd) {
  return !hits_amx_padding_crash(a, pd.impl_info_str());
}
bool runnable(const FDNN_Conv_Plan_Create_Args& a,
              const dnnl::convolution_backward_weights::primitive_desc& pd) {
  return !hits_amx_padding_crash(a, pd.impl_info_str()) && !hits_onednn_issue_6035(a, pd);
}

// The implementation to run, walking oneDNN's list from its first choice (`make` makes the
// descriptor there): the first this shim may run whose scratchpad fits p.scratchpad_limit
// (with no limit, oneDNN's first choice); when none fits, the one with the smallest
// scratchpad, whose plan create_plan then replaces or refuses. Every layout policy, algo id
// and benchmark candidate comes through here.
template <class Pd, class MakePd>
Pd choose_implementation(const Problem& p, MakePd make) {
  const FDNN_Conv_Plan_Create_Args& a = *p.args;
  Pd pd = make();
  int index = 0, smallest = -1;
  size_t smallest_size = SIZE_MAX;
  do {
    if (runnable(a, pd)) {
      const size_t size = pd.scratchpad_desc().get_size();
      if (size <= p.scratchpad_limit) return pd;
      if (smallest < 0 || size < smallest_size) {
        smallest = index;
        smallest_size = size;
      }
    }
    ++index;
  } while (pd.next_impl());
  if (smallest < 0)
    throw dnnl::error(dnnl_unimplemented,
                      "oneDNN's only implementations here are ones this shim avoids (jit_1x1 "
                      "of oneDNN issue 6035, or AMX brgemm with padding-only outputs)");
  pd = make();
  for (int i = 0; i < smallest; ++i) pd.next_impl();
  return pd;
}

// Makes the primitive and its operands for one layout policy; `output_staged` says whether the written operand goes through the workspace.
void build_primitive(const Problem& p, Layouts layouts, bool output_staged, Plan& plan) {
  const FDNN_Conv_Plan_Create_Args& a = *p.args;
  const bool vendor_act = layouts == kVendorLayouts;
  const bool vendor_w = layouts != kUserLayouts;
  memory::desc x = vendor_act ? any_like(p.x) : p.x;
  memory::desc w = vendor_w ? any_like(p.w) : p.w;
  memory::desc y = vendor_act ? any_like(p.y) : p.y;
  if (layouts == kBlocked16) {
    const int nd = p.x.get_ndims();
    const memory::format_tag tag = nd == 3   ? memory::format_tag::nCw16c
                                   : nd == 4 ? memory::format_tag::nChw16c
                                             : memory::format_tag::nCdhw16c;
    x = memory::desc(p.x.get_dims(), p.dt, tag);
    y = memory::desc(p.y.get_dims(), p.dt, tag);
  }
  dnnl::primitive_attr attr = base_attr(a);
  plan.operands.clear();
  auto add = [&](int arg, int slot, bool output, const memory::desc& user,
                 const memory::desc& prim) {
    Operand o;
    o.arg = arg;
    o.slot = slot;
    o.output = output;
    o.user_md = user;
    o.prim_md = prim;
    plan.operands.push_back(o);
  };
  if (a.op == FDNN_CONV_FORWARD) {
    attr.set_post_ops(forward_post_ops(a, output_staged));
    auto pd = choose_implementation<dnnl::convolution_forward::primitive_desc>(
        p, [&] { return forward_pd(p, x, w, y, attr, dnnl::prop_kind::forward_inference); });
    plan.conv = dnnl::convolution_forward(pd);
    plan.scratchpad_size = pd.scratchpad_desc().get_size();
    plan.name = pd.impl_info_str();
    add(DNNL_ARG_SRC, 0, false, p.x_user, pd.src_desc());
    add(DNNL_ARG_WEIGHTS, 1, false, p.w_user, pd.weights_desc());
    add(DNNL_ARG_DST, 2, true, p.y_user, pd.dst_desc());
    if (!p.bias.is_zero()) add(DNNL_ARG_BIAS, 3, false, p.bias_user, p.bias);
  } else if (a.op == FDNN_CONV_BACKWARD_DATA) {
    auto hint = forward_pd(p, x, w, y, base_attr(a), dnnl::prop_kind::forward_training);
    auto pd = choose_implementation<dnnl::convolution_backward_data::primitive_desc>(p, [&] {
      return dnnl::convolution_backward_data::primitive_desc(
          cpu_engine(), dnnl::algorithm::convolution_direct, x, w, y, p.strides, p.dilates,
          p.pad_lo, p.pad_hi, hint, attr);
    });
    plan.conv = dnnl::convolution_backward_data(pd);
    plan.scratchpad_size = pd.scratchpad_desc().get_size();
    plan.name = pd.impl_info_str();
    add(DNNL_ARG_DIFF_DST, 2, false, p.y_user, pd.diff_dst_desc());
    add(DNNL_ARG_WEIGHTS, 1, false, p.w_user, pd.weights_desc());
    add(DNNL_ARG_DIFF_SRC, 0, true, p.x_user, pd.diff_src_desc());
  } else {
    auto hint = forward_pd(p, x, w, y, base_attr(a), dnnl::prop_kind::forward_training);
    const memory::desc bias = p.bias;  // plain; zero desc when absent
    // Never the jit_1x1 kernel where it corrupts memory (runnable): oneDNN's next one for the
    // same layouts instead, a direct JIT kernel, gemm or ref.
    auto pd = choose_implementation<dnnl::convolution_backward_weights::primitive_desc>(p, [&] {
      return dnnl::convolution_backward_weights::primitive_desc(
          cpu_engine(), dnnl::algorithm::convolution_direct, x, w, bias, y, p.strides, p.dilates,
          p.pad_lo, p.pad_hi, hint, attr);
    });
    plan.conv = dnnl::convolution_backward_weights(pd);
    plan.scratchpad_size = pd.scratchpad_desc().get_size();
    plan.name = pd.impl_info_str();
    add(DNNL_ARG_SRC, 0, false, p.x_user, pd.src_desc());
    add(DNNL_ARG_DIFF_DST, 2, false, p.y_user, pd.diff_dst_desc());
    add(DNNL_ARG_DIFF_WEIGHTS, 1, true, p.w_user, pd.diff_weights_desc());
    if (!bias.is_zero()) add(DNNL_ARG_DIFF_BIAS, 3, true, p.bias_user, pd.diff_bias_desc());
  }
}

size_t align64(size_t n) { return (n + 63) / 64 * 64; }

// The number of elements of a tensor whose elements fill one block of memory without gaps, in
// any dimension order (plain, channels-last, ...), else 0.
size_t dense_elements(const FDNN_DLTensor* t) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of the dims that matter
  size_t n = 1;
  for (int i = 0; i < t->ndim; ++i) {
    n *= static_cast<size_t>(t->shape[i]);
    if (t->shape[i] != 1) dims.emplace_back(t->strides[i], t->shape[i]);
  }
  std::sort(dims.begin(), dims.end());
  int64_t step = 1;
  for (const auto& [stride, size] : dims) {
    if (stride != step) return 0;
    step *= size;
  }
  return n;
}

// Makes `o` a widened operand (see Operand) when it is a dense 16-bit operand of a float32
// primitive; returns the workspace offset after its float32 copy.
size_t widen_operand(const FDNN_Conv_Plan_Create_Args& a, Operand& o, size_t offset) {
  const FDNN_DLTensor* tensors[4] = {a.x, a.w, a.y, a.bias};
  const memory::data_type user_dt = o.user_md.get_data_type();
  if (!is_16bit(user_dt) || o.prim_md.get_data_type() != memory::data_type::f32) return offset;
  o.elements = dense_elements(tensors[o.slot]);
  if (o.elements == 0) return offset;  // gaps: oneDNN's reorder converts it, slowly but right
  o.widened = true;
  o.half_type = user_dt == memory::data_type::f16 ? fdnn_shim::Half16::kFloat16
                                                  : fdnn_shim::Half16::kBFloat16;
  o.wide_md = memory::desc(o.user_md.get_dims(), memory::data_type::f32, o.user_md.get_strides());
  o.wide_offset = offset;
  o.narrow_alpha = o.output && a.op != FDNN_CONV_FORWARD ? a.alpha : 1.f;
  return offset + align64(o.elements * sizeof(float));
}

// Makes `o` a gathered operand (see Operand) when the caller's strides overlap; returns the
// workspace offset after its compact copy.
size_t gather_operand(const FDNN_Conv_Plan_Create_Args& a, Operand& o, size_t offset) {
  const FDNN_DLTensor* tensors[4] = {a.x, a.w, a.y, a.bias};
  const FDNN_DLTensor* t = tensors[o.slot];
  if (o.output || !overlaps(t)) return offset;  // (written tensors never overlap: the header)
  o.gathered = true;
  o.gather_offset = offset;
  o.caller_shape.assign(t->shape, t->shape + t->ndim);
  o.caller_strides.assign(t->strides, t->strides + t->ndim);
  o.element_bytes = fdnn_shim::element_bytes(t->dtype);
  size_t elements = 1;
  for (int64_t d : o.caller_shape) elements *= static_cast<size_t>(d);
  return offset + align64(elements * o.element_bytes);
}

// Creates the reorders and places the staging buffers after the scratchpad.
void stage_operands(const FDNN_Conv_Plan_Create_Args& a, bool outputs_accumulate, Plan& plan) {
  size_t offset = align64(plan.scratchpad_size);
  for (Operand& o : plan.operands) {
    offset = gather_operand(a, o, offset);
    offset = widen_operand(a, o, offset);
    if (o.widened) {  // alpha and beta are the narrowing's; a reorder only relays out
      o.staged = o.prim_md != o.wide_md;
      if (!o.staged) continue;
      o.offset = offset;
      offset += align64(o.prim_md.get_size());
      o.reorder = o.output ? dnnl::reorder(dnnl::reorder::primitive_desc(cpu_engine(), o.prim_md,
                                                                         cpu_engine(), o.wide_md))
                           : dnnl::reorder(dnnl::reorder::primitive_desc(cpu_engine(), o.wide_md,
                                                                         cpu_engine(), o.prim_md));
      continue;
    }
    const bool relayout = o.prim_md != o.user_md;
    o.staged = relayout || (o.output && outputs_accumulate);
    if (!o.staged) continue;
    o.offset = offset;
    offset += align64(o.prim_md.get_size());
    if (!o.output) {
      o.reorder = dnnl::reorder(dnnl::reorder::primitive_desc(cpu_engine(), o.user_md,
                                                              cpu_engine(), o.prim_md));
      continue;
    }
    // Output: staging -> caller, applying what the primitive could not: alpha for the
    // backward ops (forward has it in its post-ops) and beta accumulation.
    dnnl::primitive_attr attr;
    o.reorder_scaled = a.op != FDNN_CONV_FORWARD && a.alpha != 1.f;
    if (o.reorder_scaled) attr.set_scales_mask(DNNL_ARG_SRC, 0);
    if (a.beta != 0.f) {
      dnnl::post_ops ops;
      ops.append_sum(a.beta);
      attr.set_post_ops(ops);
    }
    o.reorder = dnnl::reorder(dnnl::reorder::primitive_desc(cpu_engine(), o.prim_md,
                                                            cpu_engine(), o.user_md, attr));
  }
  plan.workspace_size = offset;
}

// Whether a layout policy computes this problem in a fast (JIT) kernel in the caller's
// activation layout. oneDNN's plain-layout fallbacks are "gemm" (im2col) and "ref".
bool is_fast_kernel(const std::string& impl) {
  return impl.find("ref") == std::string::npos && impl.find("gemm") == std::string::npos;
}

// The plan of algorithm `algo`, its primitive's scratchpad within scratchpad_limit where an
// implementation allows (the caller's workspace_limit unless said otherwise).
Plan make_plan(const FDNN_Conv_Plan_Create_Args& a, int64_t algo, size_t scratchpad_limit) {
  const Layouts layouts = static_cast<Layouts>(algo % kConverted);
  const bool convert = algo >= kConverted && to_dnnl(a.x->dtype) != memory::data_type::f32;
  Problem p = describe(a, convert);
  p.scratchpad_limit = scratchpad_limit;
  // Backward ops have no post-ops in oneDNN: alpha and beta go through a staged output.
  const bool outputs_accumulate =
      a.op == FDNN_CONV_FORWARD ? false : (a.beta != 0.f || a.alpha != 1.f);
  Plan plan;
  plan.alpha = a.alpha;
  plan.beta = a.beta;
  plan.algo_id = algo;
  build_primitive(p, layouts, outputs_accumulate, plan);
  // A forward output relaid out by a reorder cannot take the conv's sum post-op (it would
  // read the staging buffer): rebuild with beta moved to the reorder.
  bool forward_staged = a.op == FDNN_CONV_FORWARD && plan.operands[2].prim_md != p.y_user;
  if (forward_staged && a.beta != 0.f) build_primitive(p, layouts, true, plan);
  stage_operands(a, outputs_accumulate || (forward_staged && a.beta != 0.f), plan);
  plan.name += std::string(" (") + layouts_name(layouts) +
               (convert ? ", computed in float32 with one rounding)" : ")");
  return plan;
}

Plan make_plan(const FDNN_Conv_Plan_Create_Args& a, int64_t algo) {
  return make_plan(a, algo, a.workspace_limit);
}

// The plan in the caller's own layouts (of base 0, or kConverted) that needs the least
// workspace within workspace_limit. Its staging buffers (converted operands, a scaled backward
// output) are the same whichever implementation runs, so its scratchpad gets what the limit
// leaves them; where no implementation fits there, the plan needs the least this shim can do.
Plan lean_plan(const FDNN_Conv_Plan_Create_Args& a, int64_t base) {
  const Plan any = make_plan(a, base + kUserLayouts, SIZE_MAX);
  const size_t staging = any.workspace_size - align64(any.scratchpad_size);
  const size_t room = a.workspace_limit > staging ? (a.workspace_limit - staging) / 64 * 64 : 0;
  return make_plan(a, base + kUserLayouts, room);
}

// Problems this small finish sooner on the calling thread than an OpenMP team takes to fork
// and join (and far sooner than a team that waits for a descheduled thread on a busy machine).
// oneDNN sizes its work split by omp_get_max_threads() at creation and at execution.
constexpr double kSerialMacs = 1 << 17;

double macs_of(const FDNN_Conv_Plan_Create_Args& a) {
  double macs = static_cast<double>(a.y->shape[0]) * a.y->shape[1] * a.w->shape[1];
  for (int i = 0; i < a.spatial_rank; ++i) macs *= a.y->shape[2 + i] * a.w->shape[2 + i];
  return macs;
}

// Sets the calling thread's OpenMP team size for oneDNN for a scope (an OpenMP ICV is per
// thread, so other threads are not affected).
class TeamSize {
 public:
  explicit TeamSize(int threads) : saved_(omp_get_max_threads()), active_(threads > 0 && threads < saved_) {
    if (active_) omp_set_num_threads(threads);
  }
  ~TeamSize() {
    if (active_) omp_set_num_threads(saved_);
  }
  TeamSize(const TeamSize&) = delete;
  TeamSize& operator=(const TeamSize&) = delete;

 private:
  int saved_;
  bool active_;
};

// Whether an array is plain row-major NC[D]HW (strides of size-1 dims do not matter).
bool is_plain(const FDNN_DLTensor* t) {
  int64_t step = 1;
  for (int i = t->ndim - 1; i >= 0; --i) {
    if (t->shape[i] != 1 && t->strides[i] != step) return false;
    step *= t->shape[i];
  }
  return true;
}

// A 1x1 convolution with unit stride, no padding and one group, on plain NC[D]HW arrays, is
// one matrix product per image: oneDNN's gemm implementation runs it without im2col and
// without reorders, where a blocked kernel needs x and y reordered on every call.
bool is_plain_pointwise(const FDNN_Conv_Plan_Create_Args& a) {
  if (a.groups != 1 || !is_plain(a.x) || !is_plain(a.y)) return false;
  for (int i = 0; i < a.spatial_rank; ++i)
    if (a.w->shape[2 + i] != 1 || a.stride[i] != 1 || a.padding_lo[i] != 0 || a.padding_hi[i] != 0)
      return false;
  return true;
}

// Backward-data into a plain NC[D]HW gradient of few channels (a network's stem: C = 3):
// the JIT kernels vectorise over C in blocks of 16 and waste most lanes; gemm + col2im is 3x
// faster here (N=16 7x7/2 stem: 55 ms against 154 ms fp32, 76 against 252 ms bf16).
bool is_narrow_backward_data(const FDNN_Conv_Plan_Create_Args& a) {
  return a.op == FDNN_CONV_BACKWARD_DATA && a.groups == 1 && a.x->shape[1] < 16 && is_plain(a.x) &&
         is_plain(a.y);
}

Plan try_plan(const FDNN_Conv_Plan_Create_Args& a, int64_t algo, bool need_fast, bool& ok) {
  ok = false;
  try {
    Plan plan = make_plan(a, algo);
    ok = !need_fast || is_fast_kernel(plan.name);
    return plan;
  } catch (const dnnl::error& e) {
    if (e.status != dnnl_unimplemented) throw;
  }
  return Plan{};
}

// Heuristic:
// - plain 1x1 (pointwise) convolutions, and backward-data into a plain gradient of fewer
//   than 16 channels: the caller's layouts (oneDNN's gemm implementation);
// - otherwise the caller's own activation layouts when oneDNN has a JIT kernel for them
//   (channels-last), with weights in oneDNN's layout;
// - plain NC[D]HW with channels in multiples of 16: nChw16c activations (the layout PyTorch's
//   oneDNN path computes NCHW convolutions in), when a JIT kernel takes it;
// - else oneDNN's preferred layouts with reorders around the primitive.
// `base` is 0, or kConverted for a 16-bit problem computed in float32.
Plan heuristic_plan(const FDNN_Conv_Plan_Create_Args& a, int64_t base) {
  bool ok = false;
  if (is_plain_pointwise(a) || is_narrow_backward_data(a)) {
    Plan plan = try_plan(a, base + kUserLayouts, false, ok);
    if (ok && plan.name.find("gemm") != std::string::npos) return plan;
  }
  for (Layouts l : {kUserLayouts, kVendorWeights}) {
    Plan plan = try_plan(a, base + l, true, ok);
    if (ok) return plan;
  }
  if (is_plain(a.x) && a.x->shape[1] % 16 == 0 && a.y->shape[1] % 16 == 0) {
    Plan plan = try_plan(a, base + kBlocked16, true, ok);
    if (ok) return plan;
  }
  return make_plan(a, base + kVendorLayouts);
}

// ------------------------------------------------------------------------------------------
// 16-bit dtypes on CPUs without their instruction set

// Whether oneDNN has a real (JIT or gemm) kernel, not only its reference implementation, for
// one op in dtype dt on this CPU (as capped by ONEDNN_MAX_CPU_ISA), probed on a typical
// problem in oneDNN's preferred layouts.
bool probe_native(memory::data_type dt, int32_t op) {
  const memory::dims x{2, 32, 12, 12}, w{32, 32, 3, 3}, y{2, 32, 12, 12}, one{1, 1}, zero{0, 0};
  auto md = [&](const memory::dims& d) { return memory::desc(d, dt, memory::format_tag::any); };
  auto real = [](const std::string& impl) { return impl.find("ref") == std::string::npos; };
  try {
    const auto kind = op == FDNN_CONV_FORWARD ? dnnl::prop_kind::forward_inference
                                              : dnnl::prop_kind::forward_training;
    dnnl::convolution_forward::primitive_desc fwd(cpu_engine(), kind,
                                                  dnnl::algorithm::convolution_direct, md(x),
                                                  md(w), md(y), one, zero, one, one);
    if (op == FDNN_CONV_FORWARD) return real(fwd.impl_info_str());
    if (op == FDNN_CONV_BACKWARD_DATA)
      return real(dnnl::convolution_backward_data::primitive_desc(
                      cpu_engine(), dnnl::algorithm::convolution_direct, md(x), md(w), md(y),
                      one, zero, one, one, fwd)
                      .impl_info_str());
    return real(dnnl::convolution_backward_weights::primitive_desc(
                    cpu_engine(), dnnl::algorithm::convolution_direct, md(x), md(w), md(y), one,
                    zero, one, one, fwd)
                    .impl_info_str());
  } catch (const dnnl::error&) {
    return false;
  }
}

// Per dtype, whether each op runs natively; probed once (a few primitive descriptors).
struct NativeOps {
  bool op[3];
  bool all() const { return op[0] && op[1] && op[2]; }
};

const NativeOps& native_ops(memory::data_type dt) {
  static const NativeOps f16{{probe_native(memory::data_type::f16, FDNN_CONV_FORWARD),
                              probe_native(memory::data_type::f16, FDNN_CONV_BACKWARD_DATA),
                              probe_native(memory::data_type::f16, FDNN_CONV_BACKWARD_WEIGHT)}};
  static const NativeOps bf16{{probe_native(memory::data_type::bf16, FDNN_CONV_FORWARD),
                               probe_native(memory::data_type::bf16, FDNN_CONV_BACKWARD_DATA),
                               probe_native(memory::data_type::bf16, FDNN_CONV_BACKWARD_WEIGHT)}};
  static const NativeOps f32{{true, true, true}};
  return dt == memory::data_type::f16 ? f16 : dt == memory::data_type::bf16 ? bf16 : f32;
}


// Whether a native 16-bit plan rounds its result once, as the header promises. oneDNN 3.2's
// native float16/bfloat16 kernels round the convolution to the 16-bit type before a sum
// post-op adds beta * y, and a staged backward output is rounded before its reorder applies
// alpha and beta: twice rounded (tests/conformance/test_numerics.py's
// test_results_are_rounded_once, on AVX512-FP16 and AVX512-BF16 CPUs). Such problems are
// computed in float32 and rounded once.
bool native_rounds_once(const FDNN_Conv_Plan_Create_Args& a) {
  if (a.beta != 0.f) return false;
  return a.op == FDNN_CONV_FORWARD || a.alpha == 1.f;
}

// Whether a 16-bit problem runs on oneDNN's own 16-bit kernels (else computed in float32).
bool runs_native(const FDNN_Conv_Plan_Create_Args& a, memory::data_type dt) {
  return native_ops(dt).op[a.op] && native_rounds_once(a);
}

// The heuristic plan, natively where oneDNN has a real kernel for this dtype and op that
// rounds once, else (and when a native attempt finds only the reference implementation or
// none for this shape) computed in float32.
Plan heuristic_or_converted(const FDNN_Conv_Plan_Create_Args& a) {
  const memory::data_type dt = to_dnnl(a.x->dtype);
  if (!is_16bit(dt)) return heuristic_plan(a, 0);
  if (runs_native(a, dt)) {
    try {
      Plan plan = heuristic_plan(a, 0);
      if (plan.name.find("ref") == std::string::npos) return plan;
    } catch (const dnnl::error& e) {
      if (e.status != dnnl_unimplemented) throw;
    }
  }
  return heuristic_plan(a, kConverted);
}

// ------------------------------------------------------------------------------------------
// Execution

thread_local dnnl::stream* tls_stream = nullptr;
dnnl::stream& cpu_stream() {
  if (tls_stream == nullptr) tls_stream = new dnnl::stream(cpu_engine());
  return *tls_stream;
}

// One thread's oneDNN memory objects for one plan. Creating a memory object allocates, so
// they are made once per (thread, plan); a call only points them at its data.
// The C API's argument arrays are made once too: dnnl::primitive::execute would rebuild one
// from the map (a malloc) on every call.
struct BoundArgs {
  struct Staged {
    memory user, staging;
    std::unordered_map<int, memory> reorder;
    std::vector<dnnl_exec_arg_t> reorder_c;
  };
  std::unordered_map<int, memory> conv;
  std::vector<dnnl_exec_arg_t> conv_c;
  std::vector<Staged> staged;  // by operand index; used where the operand is staged
  memory scratchpad;
};

std::vector<dnnl_exec_arg_t> c_args(const std::unordered_map<int, memory>& args) {
  std::vector<dnnl_exec_arg_t> c;
  for (const auto& [arg, mem] : args) c.push_back({arg, mem.get()});
  return c;
}

void run_primitive(const dnnl::primitive& p, dnnl::stream& s, const std::vector<dnnl_exec_arg_t>& args) {
  dnnl::error::wrap_c_api(
      dnnl_primitive_execute(p.get(), s.get(), static_cast<int>(args.size()), args.data()),
      "could not execute a primitive");
}

// A one-float scale for a reorder, in memory of its own. Never a pointer into the Plan: the
// bound arguments outlive the Plan object they were made from when a plan is moved after its
// first run -- a benchmark candidate is timed (bound) and then moved into the caller's plan,
// and a scale pointing at the candidate's alpha then read freed stack memory (issue 23).
memory scale_memory(float value) {
  memory scale(memory::desc({1}, memory::data_type::f32, memory::format_tag::a), cpu_engine());
  *static_cast<float*>(scale.get_data_handle()) = value;
  return scale;
}

BoundArgs bind(const Plan& plan) {
  const dnnl::engine& eng = cpu_engine();
  BoundArgs b;
  if (plan.scratchpad_size > 0) {
    b.scratchpad = memory(memory::desc({static_cast<memory::dim>(plan.scratchpad_size)},
                                       memory::data_type::u8, memory::format_tag::a),
                          eng, DNNL_MEMORY_NONE);
    b.conv[DNNL_ARG_SCRATCHPAD] = b.scratchpad;
  }
  b.staged.resize(plan.operands.size());
  for (size_t i = 0; i < plan.operands.size(); ++i) {
    const Operand& o = plan.operands[i];
    // What the primitive or its reorder reads or writes on the caller's side.
    const memory::desc& outer = o.widened ? o.wide_md : o.user_md;
    if (o.packed) {
      b.conv[o.arg] = memory(o.prim_md, eng, o.packed.get());
    } else if (!o.staged) {
      b.conv[o.arg] = memory(outer, eng, DNNL_MEMORY_NONE);
    } else {
      BoundArgs::Staged& st = b.staged[i];
      st.user = memory(outer, eng, DNNL_MEMORY_NONE);
      st.staging = memory(o.prim_md, eng, DNNL_MEMORY_NONE);
      b.conv[o.arg] = st.staging;
      st.reorder = {{DNNL_ARG_FROM, o.output ? st.staging : st.user},
                    {DNNL_ARG_TO, o.output ? st.user : st.staging}};
      if (o.reorder_scaled) st.reorder[DNNL_ARG_ATTR_SCALES | DNNL_ARG_SRC] = scale_memory(plan.alpha);
      st.reorder_c = c_args(st.reorder);
    }
  }
  b.conv_c = c_args(b.conv);
  return b;
}

BoundArgs& bound_args(const Plan& plan) {
  thread_local std::unordered_map<uint64_t, BoundArgs> bound;
  auto it = bound.find(plan.id);
  if (it != bound.end()) return it->second;
  if (bound.size() >= 1024) bound.clear();  // plans come and go; ids are never reused
  return bound.emplace(plan.id, bind(plan)).first->second;
}

// Converts a widened operand in chunks over the OpenMP team (the caller's TeamSize).
constexpr size_t kConvertChunk = size_t{1} << 15;

void widen(const Operand& o, const void* user, float* wide) {
  const auto* src = static_cast<const uint16_t*>(user);
  const int64_t chunks = static_cast<int64_t>((o.elements + kConvertChunk - 1) / kConvertChunk);
#pragma omp parallel for if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const size_t begin = static_cast<size_t>(c) * kConvertChunk;
    const size_t n = std::min(kConvertChunk, o.elements - begin);
    fdnn_shim::widen16(o.half_type, src + begin, wide + begin, n);
  }
}

void narrow(const Operand& o, const float* wide, void* user, float beta) {
  auto* dst = static_cast<uint16_t*>(user);
  const int64_t chunks = static_cast<int64_t>((o.elements + kConvertChunk - 1) / kConvertChunk);
#pragma omp parallel for if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const size_t begin = static_cast<size_t>(c) * kConvertChunk;
    const size_t n = std::min(kConvertChunk, o.elements - begin);
    fdnn_shim::narrow16(o.half_type, wide + begin, dst + begin, n, o.narrow_alpha, beta);
  }
}

// The gathered copy of an operand (see Operand::gathered): the caller's elements in row-major
// order, each read through the caller's strides, over the OpenMP team for large tensors.
template <class E>
void gather_as(const Operand& o, const E* from, E* to) {
  constexpr int kDims = FDNN_MAX_SPATIAL_DIMS + 2;
  int64_t shape[kDims], strides[kDims];
  const int lead = kDims - static_cast<int>(o.caller_shape.size());
  for (int i = 0; i < kDims; ++i) {  // leading dims of 1 up to kDims
    shape[i] = i < lead ? 1 : o.caller_shape[static_cast<size_t>(i - lead)];
    strides[i] = i < lead ? 0 : o.caller_strides[static_cast<size_t>(i - lead)];
  }
  const int64_t inner = shape[1] * shape[2] * shape[3] * shape[4];
#pragma omp parallel for if (shape[0] * inner > static_cast<int64_t>(kConvertChunk))
  for (int64_t i0 = 0; i0 < shape[0]; ++i0) {
    E* out = to + i0 * inner;
    for (int64_t i1 = 0; i1 < shape[1]; ++i1)
      for (int64_t i2 = 0; i2 < shape[2]; ++i2)
        for (int64_t i3 = 0; i3 < shape[3]; ++i3) {
          const E* row = from + i0 * strides[0] + i1 * strides[1] + i2 * strides[2] + i3 * strides[3];
          for (int64_t i4 = 0; i4 < shape[4]; ++i4) *out++ = row[i4 * strides[4]];
        }
  }
}

void gather(const Operand& o, const void* from, void* to) {
  if (o.element_bytes == 2)
    gather_as(o, static_cast<const uint16_t*>(from), static_cast<uint16_t*>(to));
  else
    gather_as(o, static_cast<const uint32_t*>(from), static_cast<uint32_t*>(to));
}

void execute_plan(const Plan& plan, void* const pointers[4], char* workspace) {
  TeamSize team(plan.threads);
  if (plan.gemm) {
    fdnn_onednn::run_im2col_gemm(*plan.gemm, pointers, workspace);
    return;
  }
  dnnl::stream& s = cpu_stream();
  BoundArgs& b = bound_args(plan);
  if (plan.scratchpad_size > 0) b.scratchpad.set_data_handle(workspace);
  for (size_t i = 0; i < plan.operands.size(); ++i) {
    const Operand& o = plan.operands[i];
    if (o.packed) continue;
    if (pointers[o.slot] == nullptr)
      fail(FDNN_ERROR_INVALID_ARGUMENT, "a data pointer the plan needs is NULL");
    void* caller = pointers[o.slot];
    if (o.gathered) {
      gather(o, caller, workspace + o.gather_offset);
      caller = workspace + o.gather_offset;
    }
    void* outer = o.widened ? workspace + o.wide_offset : caller;
    if (o.widened && !o.output) widen(o, caller, static_cast<float*>(outer));
    if (!o.staged) {
      b.conv[o.arg].set_data_handle(outer);
      continue;
    }
    BoundArgs::Staged& st = b.staged[i];
    st.user.set_data_handle(outer);
    st.staging.set_data_handle(workspace + o.offset);
    if (!o.output) run_primitive(o.reorder, s, st.reorder_c);
  }
  run_primitive(plan.conv, s, b.conv_c);
  for (size_t i = 0; i < plan.operands.size(); ++i)
    if (plan.operands[i].staged && plan.operands[i].output)
      run_primitive(plan.operands[i].reorder, s, b.staged[i].reorder_c);
  s.wait();
  for (const Operand& o : plan.operands)
    if (o.widened && o.output)
      narrow(o, reinterpret_cast<const float*>(workspace + o.wide_offset), pointers[o.slot],
             plan.beta);
}

// ------------------------------------------------------------------------------------------
// The ABI table

void check_device_id(int32_t device_id) {
  if (device_id != 0)
    fail(FDNN_ERROR_INVALID_ARGUMENT, "device_id %d: the oneDNN shim has one device (0)",
         static_cast<int>(device_id));
}

FDNN_Error* shim_info(FDNN_Shim_Info_Args* args) {
  return fdnn_shim::guarded([&] {
    fdnn_shim::check_struct_size(args, FDNN_Shim_Info_Args_STRUCT_SIZE, "Shim_Info");
    static const std::string built = std::to_string(DNNL_VERSION_MAJOR) + "." +
                                     std::to_string(DNNL_VERSION_MINOR) + "." +
                                     std::to_string(DNNL_VERSION_PATCH);
    args->shim_name = "onednn";
    args->vendor_name = "oneDNN";
    args->vendor_version_built = built.c_str();
    args->vendor_version_runtime = runtime_version().c_str();
    args->shim_version = FLUX_DNN_VERSION_STRING;
    args->device_type = FDNN_DEVICE_CPU;
    args->num_devices = 1;
    args->priority = FDNN_PRIORITY_VENDOR;
    args->unavailable_reason = nullptr;
  });
}

FDNN_Error* device_describe(FDNN_Device_Describe_Args* args) {
  return fdnn_shim::guarded([&] {
    fdnn_shim::check_struct_size(args, FDNN_Device_Describe_Args_STRUCT_SIZE, "Device_Describe");
    check_device_id(args->device_id);
    args->default_flags = 0;  // float32 stays float32 unless the caller allows bf16 math
    args->name = device_name().c_str();
  });
}

double time_plan(const Plan& plan, const FDNN_Conv_Plan_Create_Args& a);
void create_plan(FDNN_Conv_Plan_Create_Args* args);

FDNN_Error* plan_create(FDNN_Conv_Plan_Create_Args* args) {
  return fdnn_shim::guarded([&] {
    fdnn_shim::check_struct_size(args, FDNN_Conv_Plan_Create_Args_STRUCT_SIZE, "Conv_Plan_Create");
    fdnn_shim::on_fork_safe_thread([&] { create_plan(args); });
  });
}

// ------------------------------------------------------------------------------------------
// The small-problem path (im2col_gemm.hpp)

// Below this many multiply-adds the heuristic computes a float32 forward convolution as
// im2col + dnnl_sgemm on the calling thread: there a primitive's fixed per-call cost (its
// execution context, argument maps and descriptor queries: ~2 us) outweighs the arithmetic.
// Measured (benchmarks/bench_small.py, 2-core AMD EPYC, AVX2, one thread; every problem
// below kSerialMacs runs on one thread either way): 3x3 NCHW, the path wins at 9216 MACs
// (1x4x8x8, 4 channels), and at 4 channels up to 147k MACs, but loses from 36864 MACs with 8
// or more channels (oneDNN's brgconv kernels), so the bound sits between those two.
constexpr double kSmallProblemMacs = 1 << 14;

Plan im2col_gemm_plan(const FDNN_Conv_Plan_Create_Args& a) {
  Plan plan;
  plan.gemm = fdnn_onednn::make_im2col_gemm(a);
  plan.workspace_size = plan.gemm->workspace_size;
  plan.alpha = a.alpha;
  plan.beta = a.beta;
  plan.algo_id = fdnn_onednn::kIm2colGemmAlgo;
  plan.name = fdnn_onednn::small_plan_name(*plan.gemm);
  return plan;
}

// Whether the heuristic takes the small-problem path: a problem it computes exactly as the
// primitive would (float32, forward, an activation it applies), small enough, whose
// workspace fits the limit.
bool takes_small_path(const FDNN_Conv_Plan_Create_Args& a) {
  return a.algo_policy == FDNN_ALGO_HEURISTIC && fdnn_onednn::im2col_gemm_refusal(a) == nullptr &&
         macs_of(a) < kSmallProblemMacs;
}

// The given algorithm id 8: the small-problem path at any size, where it can compute it.
Plan given_im2col_gemm_plan(const FDNN_Conv_Plan_Create_Args& a) {
  if (const char* why = fdnn_onednn::im2col_gemm_refusal(a)) {
    const std::string text = std::string(fdnn_onednn::kIm2colGemmName) + ": " + why;
    fdnn_shim::fail_algo_cannot_compute(a, "the oneDNN shim", text.c_str());
  }
  return im2col_gemm_plan(a);
}

// The given algorithm 0 to 7 (layouts, converted or not); UNSUPPORTED where oneDNN has no
// implementation of those layouts for this problem.
Plan given_layouts_plan(const FDNN_Conv_Plan_Create_Args& a) {
  try {
    return make_plan(a, a.algo_id);
  } catch (const dnnl::error& e) {
    if (e.status != dnnl_unimplemented) throw;
    fdnn_shim::fail_algo_cannot_compute(a, "the oneDNN shim",
                                        "oneDNN has no implementation of its layouts here");
  }
}

// The plan of the policy: the given algorithm, the fastest candidate within workspace_limit,
// or the heuristic's.
Plan policy_plan(const FDNN_Conv_Plan_Create_Args& a) {
  if (a.algo_policy == FDNN_ALGO_GIVEN)
    return a.algo_id == fdnn_onednn::kIm2colGemmAlgo ? given_im2col_gemm_plan(a)
                                                     : given_layouts_plan(a);
  if (takes_small_path(a)) {
    Plan plan = im2col_gemm_plan(a);
    if (plan.workspace_size <= a.workspace_limit) return plan;
  }
  if (a.algo_policy == FDNN_ALGO_BENCHMARK) {
    double best = 0;
    Plan plan;
    const memory::data_type dt = to_dnnl(a.x->dtype);
    const int64_t base = is_16bit(dt) && !runs_native(a, dt) ? kConverted : 0;
    for (Layouts l : {kUserLayouts, kVendorWeights, kVendorLayouts, kBlocked16}) {
      try {
        Plan candidate = make_plan(a, base + l);
        if (candidate.workspace_size > a.workspace_limit) continue;
        if (!fdnn_shim::benchmark_fits(a, candidate.workspace_size)) continue;
        double t = time_plan(candidate, a);
        if (plan.name.empty() || t < best) {
          best = t;
          plan = std::move(candidate);
        }
      } catch (const dnnl::error& e) {
        if (e.status != dnnl_unimplemented) throw;
      }
    }
    if (!plan.name.empty()) return plan;
  }
  return heuristic_or_converted(a);
}

// A plan within workspace_limit, as the header asks: the policy's, else the leanest in the
// caller's own layouts (staging buffers are what costs beyond the scratchpad; a converted plan
// stages every operand regardless), which may replace a given algorithm; else the problem is
// refused as UNSUPPORTED, naming the least it needs, so that a caller may pass it on.
Plan plan_within_limit(const FDNN_Conv_Plan_Create_Args& a) {
  Plan plan = policy_plan(a);
  if (plan.workspace_size <= a.workspace_limit) return plan;
  if (plan.gemm) plan = heuristic_or_converted(a);  // a given 8 beyond the limit
  if (plan.workspace_size <= a.workspace_limit) return plan;
  try {
    Plan lean = lean_plan(a, plan.algo_id / kConverted * kConverted);
    if (lean.workspace_size <= plan.workspace_size) plan = std::move(lean);
  } catch (const dnnl::error&) {
    // no plan in the caller's layouts: the policy's is the least found
  }
  if (plan.workspace_size > a.workspace_limit)
    fail(FDNN_ERROR_UNSUPPORTED,
         "the oneDNN shim needs at least %zu bytes of workspace, the limit (workspace_limit) is "
         "%zu: %s",
         plan.workspace_size, a.workspace_limit, fdnn_shim::describe_problem(a).c_str());
  return plan;
}

void create_plan(FDNN_Conv_Plan_Create_Args* args) {
  const FDNN_Conv_Plan_Create_Args& a = *args;
  check_problem(a);
  const int threads = macs_of(a) < kSerialMacs ? 1 : 0;
  TeamSize team(threads);
  Plan plan;
  try {
    plan = plan_within_limit(a);
  } catch (const dnnl::error& e) {
    fail_vendor(e, a, "primitive creation");
  }
  fdnn_shim::check_workspace_within_limit(plan.workspace_size, a, "the oneDNN shim");
  plan.threads = threads;
  plan.op = a.op;
  plan.element_size = fdnn_shim::element_bytes(a.x->dtype);
  auto* owned = new Plan(std::move(plan));
  args->plan = reinterpret_cast<FDNN_Plan*>(owned);
  args->workspace_size = owned->workspace_size;
  args->chosen_algo_id = owned->algo_id;
  args->algo_name = owned->name.c_str();
}

// Times a candidate on zero-filled buffers of the problem's sizes (benchmark policy).
double time_plan(const Plan& plan, const FDNN_Conv_Plan_Create_Args& a) {
  std::vector<std::vector<char>> buffers;  // sizes checked by fdnn_shim::benchmark_fits
  void* pointers[4];
  const FDNN_DLTensor* tensors[4] = {a.x, a.w, a.y, a.bias};
  for (int i = 0; i < 4; ++i) {
    buffers.emplace_back(std::max<size_t>(fdnn_shim::span_bytes(tensors[i]), 64), 0);
    pointers[i] = buffers.back().data();
  }
  std::vector<char> workspace(std::max<size_t>(plan.workspace_size, 64));
  using clock = std::chrono::steady_clock;
  execute_plan(plan, pointers, workspace.data());  // warm up
  double best = 1e30;
  for (int run = 0; run < 3; ++run) {
    auto t0 = clock::now();
    execute_plan(plan, pointers, workspace.data());
    best = std::min(best, std::chrono::duration<double>(clock::now() - t0).count());
  }
  return best;
}

FDNN_Error* plan_execute(FDNN_Conv_Plan_Execute_Args* args) {
  return fdnn_shim::guarded([&] {
    fdnn_shim::check_struct_size(args, FDNN_Conv_Plan_Execute_Args_STRUCT_SIZE, "Conv_Plan_Execute");
    const Plan& plan = fdnn_shim::plan_of<Plan>(args->plan, "Conv_Plan_Execute");
    fdnn_shim::check_execute_args(*args, plan.element_size, plan.workspace_size);
    void* const pointers[4] = {args->x, args->w, args->y, args->bias};
    fdnn_shim::on_fork_safe_thread([&] {
      try {
        execute_plan(plan, pointers, static_cast<char*>(args->workspace));
      } catch (const dnnl::error& e) {
        fail(FDNN_ERROR_VENDOR, "oneDNN execution of %s failed: %s (%s)", plan.name.c_str(),
             status_text(e.status), e.what());
      }
    });
  });
}

// A copy of the plan whose weights operand reads a plan-owned buffer, filled once in the
// primitive's layout (through the plan's own reorder when the layouts differ).
FDNN_Error* plan_pack_weights(FDNN_Conv_Plan_Pack_Weights_Args* args) {
  return fdnn_shim::guarded([&] {
    fdnn_shim::check_struct_size(args, FDNN_Conv_Plan_Pack_Weights_Args_STRUCT_SIZE,
                                 "Conv_Plan_Pack_Weights");
    const Plan& source = fdnn_shim::plan_of<Plan>(args->plan, "Conv_Plan_Pack_Weights");
    fdnn_shim::check_pack_args(*args, source.op, source.element_size);
    auto packed = std::make_unique<Plan>(source);
    packed->id = next_plan_id();
    if (source.gemm) {  // the small-problem path: a dense K x R copy its sgemm reads
      packed->gemm = fdnn_onednn::pack_im2col_gemm(*source.gemm, args->w);
      packed->workspace_size = packed->gemm->workspace_size;
    }
    for (Operand& o : packed->operands) {
      if (o.arg != DNNL_ARG_WEIGHTS) continue;
      const size_t bytes = align64(o.prim_md.get_size());
      void* buffer = std::aligned_alloc(64, bytes);
      if (buffer == nullptr) throw std::bad_alloc();
      o.packed = std::shared_ptr<void>(buffer, std::free);
      std::vector<char> compact;  // the gathered copy of weights whose strides overlap
      void* w = const_cast<void*>(args->w);
      if (o.gathered) {
        compact.resize(o.user_md.get_size());
        gather(o, w, compact.data());
        w = compact.data();
      }
      memory user(o.user_md, cpu_engine(), w);
      memory mine(o.prim_md, cpu_engine(), buffer);
      try {
        fdnn_shim::on_fork_safe_thread([&] {
          dnnl::reorder(user, mine).execute(cpu_stream(), user, mine);
          cpu_stream().wait();
        });
      } catch (const dnnl::error& e) {
        fail(FDNN_ERROR_VENDOR, "oneDNN weight packing for %s failed: %s (%s)", source.name.c_str(),
             status_text(e.status), e.what());
      }
      o.staged = false;
      o.widened = false;
      o.gathered = false;
    }
    packed->name += " [packed weights]";
    args->workspace_size = packed->workspace_size;
    args->packed_plan = reinterpret_cast<FDNN_Plan*>(packed.release());
  });
}

void plan_destroy(FDNN_Plan_Destroy_Args* args) {
  if (args != nullptr) delete reinterpret_cast<Plan*>(args->plan);
}

// Whether FDNN_CONV_ALLOW_REDUCED_PRECISION changes float32 math here: oneDNN's fpmath mode
// bf16 computes float32 convolutions in bfloat16 only on CPUs with bfloat16 arithmetic
// (avx512_core_bf16 and later; the ISA values are bit sets, each containing the ones below).
bool bf16_math() {
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto bf16 = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
  return (isa & bf16) == bf16;
}

// The capabilities of one dtype oneDNN takes, per op, found once per dtype (the 16-bit
// probes create a few primitive descriptors). float32 natively; float16 and bfloat16 natively
// for the ops oneDNN has real kernels of on this CPU, else computed in float32.
struct DtypeCapabilities {
  std::string detail[FDNN_NUM_CONV_OPS];
  fdnn_shim::Capabilities op[FDNN_NUM_CONV_OPS];  // detail: set from `detail` when read
};

DtypeCapabilities find_capabilities(memory::data_type dt) {
  DtypeCapabilities d;
  const char* isa = isa_name(dnnl::get_effective_cpu_isa());
  const char* name = dt == memory::data_type::f16 ? "float16" : "bfloat16";
  for (int32_t op = 0; op < FDNN_NUM_CONV_OPS; ++op) {
    const bool native = native_ops(dt).op[op];
    if (is_16bit(dt))
      d.detail[op] = native ? std::string("oneDNN kernels for instruction set ") + isa +
                                  (op == FDNN_CONV_FORWARD ? "; with beta" : "; with alpha or beta") +
                                  " computed in float32 with one rounding"
                            : std::string("computed in float32 with one rounding (") +
                                  fdnn_shim::op_name(op) + "): oneDNN has no " + name +
                                  " kernel for instruction set " + isa;
    fdnn_shim::Capabilities& c = d.op[op];
    c.support = native ? FDNN_SUPPORT_NATIVE : FDNN_SUPPORT_CONVERTED;
    c.spatial_ranks = fdnn_shim::kRanks1To3;
    // Every activation is a oneDNN eltwise post-op (forward_post_ops).
    c.activations = fdnn_shim::activations_of_op(op, fdnn_shim::kEveryActivation);
    // Groups, dilation and per-side padding are oneDNN's own parameters; alpha/beta are
    // post-ops or the output reorder's scale and sum; CPU results are deterministic.
    c.features = FDNN_FEATURE_GROUPS | FDNN_FEATURE_DILATION | FDNN_FEATURE_ALPHA_BETA |
                 FDNN_FEATURE_ASYMMETRIC_PADDING | FDNN_FEATURE_DETERMINISTIC |
                 FDNN_FEATURE_BENCHMARK;
    if (op == FDNN_CONV_FORWARD) c.features |= FDNN_FEATURE_PACK_WEIGHTS;
    if (op == FDNN_CONV_BACKWARD_WEIGHT) c.features |= FDNN_FEATURE_BIAS_GRADIENT;  // diff_bias
    if (dt == memory::data_type::f32 && bf16_math())
      c.features |= FDNN_FEATURE_REDUCED_PRECISION;
  }
  return d;
}

fdnn_shim::Capabilities capabilities(int32_t op, FDNN_DLDataType dtype) {
  const memory::data_type dt = to_dnnl(dtype);
  if (dt == memory::data_type::undef)
    return fdnn_shim::not_computed(dtype.lanes == 1 && dtype.code == FDNN_DTYPE_FLOAT &&
                                           dtype.bits == 64
                                       ? "oneDNN has no float64 convolution"
                                       : "oneDNN convolutions take float32, float16 and bfloat16");
  static const DtypeCapabilities f32 = find_capabilities(memory::data_type::f32);
  const DtypeCapabilities* d = &f32;
  if (dt == memory::data_type::f16) {
    static const DtypeCapabilities f16 = find_capabilities(dt);
    d = &f16;
  } else if (dt == memory::data_type::bf16) {
    static const DtypeCapabilities bf16 = find_capabilities(dt);
    d = &bf16;
  }
  fdnn_shim::Capabilities c = d->op[op];
  c.detail = d->detail[op].c_str();
  return c;
}

FDNN_Error* conv_capabilities(FDNN_Conv_Capabilities_Args* args) {
  return fdnn_shim::conv_capabilities(args, [](int32_t device_id, int32_t op, FDNN_DLDataType dtype) {
    check_device_id(device_id);
    return capabilities(op, dtype);
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
