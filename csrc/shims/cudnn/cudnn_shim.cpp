// The cuDNN shim: flux_dnn's ABI (flux_dnn.h) over cuDNN 9's graph API on NVIDIA GPUs.
//
// A plan holds a finalized cuDNN execution plan for one convolution (with bias and
// activation fused into the graph when cuDNN can), chosen once at plan time (heuristic,
// benchmark or given id); executing it binds this call's pointers in a variant pack and
// launches on the caller's stream. What the graph does not take (bias, activation, beta
// around an unfused convolution; the bias gradient of backward-weight) our own kernels do
// (epilogue.cu). See README.md for the choices.
#include <cudnn_version.h>

#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "conv_graph.hpp"
#include "cuda_env.hpp"
#include "cudnn_lib.hpp"
#include "engines.hpp"
#include "epilogue.hpp"
#include "handle_pool.hpp"
#include "problem.hpp"
#include "shim_common.hpp"
#include "workspace.hpp"

using fdnn_shim::fail;
using fdnn_shim::Failure;
using namespace fdnn_cudnn;

struct FDNN_Plan {
  ConvProblem problem;
  ConvGraph graph;
  KernelCache kernel_cache;  // of `graph`: other threads' plans compile nothing again
  Selected selected;
  // The caller's workspace: [cuDNN's, then (once the convolution is done) the bias
  // gradient's partial sums | conv result, when the epilogue needs y_old | w in x's memory
  // order, when the caller's w is in another].
  size_t bias_grad_scratch = 0;  // bytes of partial sums at offset 0
  size_t scratch_offset = 0;
  size_t w_stage_offset = 0;
  size_t workspace_size = 0;
  EpilogueParams epilogue;
  StridedCopy w_to_stage, stage_to_w;
  // One cuDNN execution plan per handle (so per thread): cuDNN plans must not be shared
  // between threads. Built on first use from the chosen engine configuration.
  mutable std::mutex plans_mutex;
  mutable std::map<cudnnHandle_t, fdnn_cudnn::DescPtr> plan_by_handle;
};

namespace {


#define FDNN_STR2(x) #x
#define FDNN_STR(x) FDNN_STR2(x)
constexpr const char* kBuiltVersion =
    FDNN_STR(CUDNN_MAJOR) "." FDNN_STR(CUDNN_MINOR) "." FDNN_STR(CUDNN_PATCHLEVEL);

struct ShimState {
  std::string runtime_version;  // "" when cuDNN is missing
  std::string why_not;          // "" when usable
  int num_devices = 0;
};

const ShimState& shim_state() {
  static const ShimState state = [] {
    ShimState s;
    std::string why;
    if (const CudnnLib* lib = load_cudnn(&why)) {
      s.runtime_version = cudnn_version_text(lib->GetVersion());
    } else {
      s.why_not = why;
      return s;
    }
    const CudaDevices& devices = cuda_devices();
    s.why_not = devices.why_not;
    s.num_devices = devices.count;
    return s;
  }();
  return state;
}

void require_usable() {
  const ShimState& s = shim_state();
  if (!s.why_not.empty()) fail(FDNN_ERROR_UNAVAILABLE, "cudnn: %s", s.why_not.c_str());
}

void require_device(int device) {
  require_usable();
  const ShimState& s = shim_state();
  if (device < 0 || device >= s.num_devices)
    fail(FDNN_ERROR_INVALID_ARGUMENT, "cudnn: no CUDA device %d (this process sees %d)",
         device, s.num_devices);
}

// Re-throws a failure with the conv parameters appended, unless the message has them.
template <class Body>
void with_problem(const std::string& description, Body&& body) {
  try {
    body();
  } catch (const Failure& f) {
    std::string message = f.what();
    if (message.find(description) != std::string::npos) throw;
    throw Failure(f.code(), message + " [" + description + "]");
  }
}

bool beta_in_conv(const ConvProblem& p) {
  return !p.has_epilogue() || p.activation == FDNN_ACTIVATION_NONE;
}

ElementType element_type(cudnnDataType_t t) {
  switch (t) {
    case CUDNN_DATA_HALF: return ElementType::kHalf;
    case CUDNN_DATA_BFLOAT16: return ElementType::kBFloat16;
    case CUDNN_DATA_DOUBLE: return ElementType::kDouble;
    default: return ElementType::kFloat;
  }
}

EpilogueParams epilogue_params(const ConvProblem& p) {
  EpilogueParams e;
  e.type = element_type(p.dtype);
  e.y.ndim = static_cast<int>(p.y_logical.shape.size());
  for (int d = 0; d < e.y.ndim; ++d) {
    e.y.shape[d] = p.y_logical.shape[static_cast<size_t>(d)];
    e.y.strides[d] = p.y_logical.strides[static_cast<size_t>(d)];
  }
  e.bias_stride = p.bias_stride;
  e.alpha = p.alpha;
  e.beta = beta_in_conv(p) && p.op == FDNN_CONV_FORWARD ? 0.0 : p.beta;
  e.activation = p.activation;
  e.activation_alpha = p.activation_alpha;
  e.activation_beta = p.activation_beta;
  return e;
}

size_t compact_bytes(const LogicalTensor& t, size_t element_size) {
  size_t n = element_size;
  for (int64_t d : t.shape) n *= static_cast<size_t>(d);
  return n;
}

StridedCopy copy_between(const LogicalTensor& from, const LogicalTensor& to,
                         size_t element_size) {
  StridedCopy c;
  c.element_size = static_cast<int>(element_size);
  c.src.ndim = static_cast<int>(from.shape.size());
  for (size_t d = 0; d < from.shape.size(); ++d) {
    c.src.shape[d] = from.shape[d];
    c.src.strides[d] = from.strides[d];
    c.dst_strides[d] = to.strides[d];
  }
  return c;
}

// With an activation in the epilogue, the convolution applies alpha only and beta belongs
// to the epilogue (after the activation); otherwise cuDNN applies both (a bias alone is
// then added in place: y = alpha * conv + beta * y_old, then + alpha * bias).
ConvScales conv_scales(const ConvProblem& p) {
  if (beta_in_conv(p)) return {p.alpha, p.beta};
  return {p.alpha, 0.0};
}

// Bytes of the caller's workspace the shim itself uses besides cuDNN's (workspace.hpp).
ExtraWorkspace extra_workspace(const ConvProblem& p) {
  ExtraWorkspace e;
  if (p.needs_conv_scratch()) e.conv_result = round_up(p.y_logical.span_bytes, kWorkspaceAlign);
  if (p.stage_w) e.w_staged = round_up(compact_bytes(p.w_logical, p.element_size), kWorkspaceAlign);
  return e;
}

// Where the shim's own scratch does not fit the limit (the core's no-workspace fallback is
// a limit of 0): w goes to cuDNN in its own memory order instead of a staged copy; the
// conv result an activation with beta != 0 needs has no substitute.
void fit_extra_workspace(ConvProblem* p, size_t limit) {
  if (extra_workspace(*p).total() <= limit) return;
  if (p->stage_w) use_w_unstaged(p);
  ExtraWorkspace extra = extra_workspace(*p);
  if (extra.total() > limit)
    fail(FDNN_ERROR_UNSUPPORTED, "cudnn: needs %zu bytes of workspace for the conv result "
         "that the activation with beta != 0 reads before y is overwritten, over the limit "
         "of %zu", extra.total(), limit);
}

// Everything a graph is built from (read_problem's translation of the arguments is a
// function of them): the key of its kernel cache. The description names the op, every
// tensor's shape, strides and dtype and the convolution parameters.
std::string graph_key(const ConvProblem& p, bool fused) {
  char more[256];
  std::snprintf(more, sizeof more, "|dev%d fused%d stage%d act%d %.17g %.17g %.9g %.9g align%lld "
                "compute%d", p.device, fused ? 1 : 0, p.stage_w ? 1 : 0,
                static_cast<int>(p.activation), p.alpha, p.beta,
                static_cast<double>(p.activation_alpha), static_cast<double>(p.activation_beta),
                static_cast<long long>(p.alignment), static_cast<int>(p.compute));
  return p.description + more;
}

// Bias and activation inside cuDNN's graph, when cuDNN has an engine for that under the
// caller's flags; false (and nothing chosen) otherwise, and the epilogue kernel runs after
// an unfused convolution. A given id says which of the two it came from.
bool try_fused_graph(FDNN_Plan* plan, const EngineRequest& request, cudnnHandle_t handle) {
  const ConvProblem& p = plan->problem;
  bool given = request.policy == FDNN_ALGO_GIVEN;
  if (!can_fuse_epilogue(p) || (given && !algo_id_is_fused(request.given_id))) return false;
  try {
    ConvGraph fused = build_fused_graph(p, handle);
    KernelCache cache = shared_kernel_cache(fused, graph_key(p, true));
    plan->selected = select_engine(p, fused, request, cache, handle);
    plan->graph = std::move(fused);
    plan->kernel_cache = std::move(cache);
    return true;
  } catch (const Failure&) {
    if (given) throw;  // the id named a fused engine that is not there
    return false;
  }
}

void choose_unfused(FDNN_Plan* plan, const EngineRequest& request, cudnnHandle_t handle) {
  const ConvProblem& p = plan->problem;
  EngineRequest timed = request;
  if (p.has_epilogue()) {  // benchmark: time our epilogue with the conv, as execute runs it
    EpilogueParams e = epilogue_params(p);
    timed.after_each = [e](const Operands& o, cudaStream_t stream) {
      return launch_bias_activation(e, o.y, o.y, o.bias, stream);
    };
  }
  ConvGraph graph = build_conv_graph(p, conv_scales(p), handle);
  KernelCache cache = shared_kernel_cache(graph, graph_key(p, false));
  plan->selected = select_engine(p, graph, timed, cache, handle);
  plan->graph = std::move(graph);
  plan->kernel_cache = std::move(cache);
}

// Benchmark with a fusable epilogue: the fused graph and conv + our epilogue are both timed
// and the faster kept (cuDNN's fused engines are not always the faster).
void choose_timed_against_unfused(FDNN_Plan* plan, const EngineRequest& request,
                                  cudnnHandle_t handle) {
  Selected fused = plan->selected;
  ConvGraph fused_graph = std::move(plan->graph);
  KernelCache fused_cache = std::move(plan->kernel_cache);
  try {
    choose_unfused(plan, request, handle);
  } catch (const Failure&) {
    plan->selected.benchmark_ms = -1.f;
  }
  bool unfused_faster = plan->selected.benchmark_ms >= 0.f &&
                        (fused.benchmark_ms < 0.f ||
                         plan->selected.benchmark_ms < fused.benchmark_ms);
  if (unfused_faster) return;
  plan->selected = std::move(fused);
  plan->graph = std::move(fused_graph);
  plan->kernel_cache = std::move(fused_cache);
}

void choose_engine(FDNN_Plan* plan, const FDNN_Conv_Plan_Create_Args& args) {
  ConvProblem& p = plan->problem;
  size_t limit = args.workspace_limit;
  fit_extra_workspace(&p, limit);
  DeviceGuard guard(p.device);
  EngineRequest request;
  request.policy = args.algo_policy;
  request.given_id = args.algo_id;
  request.workspace_budget = shared_budget(limit, extra_workspace(p));
  request.stream = static_cast<cudaStream_t>(args.stream);
  request.allocator = reinterpret_cast<const FDNN_Device_Allocator*>(fdnn_shim::find_extension(
      args.extension_start, FDNN_EXTENSION_DEVICE_ALLOCATOR, FDNN_Device_Allocator_STRUCT_SIZE,
      "Conv_Plan_Create"));
  cudnnHandle_t handle = thread_handle(p.device, request.stream);
  if (try_fused_graph(plan, request, handle)) {
    if (request.policy == FDNN_ALGO_BENCHMARK)
      choose_timed_against_unfused(plan, request, handle);
  } else {
    choose_unfused(plan, request, handle);
  }
  plan->plan_by_handle[handle] = plan->selected.plan;
}

// The caller's workspace (workspace.hpp); the bias-gradient partials overlap cuDNN's part:
// the convolution is done by the time they are written.
void lay_out_workspace(FDNN_Plan* plan, size_t limit) {
  const ConvProblem& p = plan->problem;
  bool bias_gradient = p.op == FDNN_CONV_BACKWARD_WEIGHT && p.has_bias;
  WorkspaceLayout l =
      lay_out(limit, plan->selected.workspace,
              bias_gradient ? bias_gradient_scratch_bytes(plan->epilogue) : 0, extra_workspace(p));
  if (l.total > limit)
    fail(FDNN_ERROR_INTERNAL, "cudnn: laid out %zu bytes of workspace, over the limit of %zu",
         l.total, limit);
  plan->bias_grad_scratch = l.bias_grad;
  plan->scratch_offset = l.scratch_offset;
  plan->w_stage_offset = l.w_stage_offset;
  plan->workspace_size = l.total;
  if (p.stage_w) {
    plan->w_to_stage = copy_between(p.w_logical, p.w_staged, p.element_size);
    plan->stage_to_w = copy_between(p.w_staged, p.w_logical, p.element_size);
  }
}

fdnn_shim::Capabilities capabilities(int device, int32_t op, FDNN_DLDataType dtype);

void create_plan(FDNN_Conv_Plan_Create_Args* args) {
  fdnn_shim::check_struct_size(args, FDNN_Conv_Plan_Create_Args_STRUCT_SIZE,
                               "Conv_Plan_Create");
  require_usable();  // "no driver" before any complaint about the arguments
  const FDNN_Conv_Plan_Create_Args& a = *args;
  fdnn_shim::check_conv_problem(a, FDNN_DEVICE_CUDA);  // before anything divides by a stride
  require_device(a.x->device.device_id);
  fdnn_shim::check_covered(a, capabilities(a.x->device.device_id, a.op, a.x->dtype), "cudnn");
  auto plan = std::make_unique<FDNN_Plan>();
  plan->problem = read_problem(a);
  with_problem(plan->problem.description, [&] {
    choose_engine(plan.get(), *args);
    plan->epilogue = epilogue_params(plan->problem);
    lay_out_workspace(plan.get(), args->workspace_limit);
  });
  args->workspace_size = plan->workspace_size;
  args->chosen_algo_id = plan->selected.algo_id;
  args->algo_name = plan->selected.name.c_str();
  args->plan = plan.release();
}

void check_alignment(const FDNN_Plan& plan, const void* ptr, const char* name) {
  if (reinterpret_cast<uintptr_t>(ptr) % static_cast<uintptr_t>(plan.problem.alignment) != 0)
    fail(FDNN_ERROR_INVALID_ARGUMENT, "cudnn: %s at %p is not %lld-byte aligned as the plan "
         "assumed (plan with the real data pointers to allow less)", name, ptr,
         static_cast<long long>(plan.problem.alignment));
}

// The header's rules (shared), then the alignment this plan assumed of the data.
void check_execute_args(const FDNN_Conv_Plan_Execute_Args& a) {
  const FDNN_Plan& plan = *a.plan;
  fdnn_shim::check_execute_args(a, plan.problem.element_size, plan.workspace_size,
                                {true, true, true, plan.problem.has_bias});
  check_alignment(plan, a.x, "x");
  check_alignment(plan, a.w, "w");
  check_alignment(plan, a.y, "y");
  if (plan.graph.binds_bias) check_alignment(plan, a.bias, "bias");
}

void run_epilogue(const FDNN_Plan& plan, const FDNN_Conv_Plan_Execute_Args& a,
                  void* conv_out, cudaStream_t stream) {
  const ConvProblem& p = plan.problem;
  if (p.has_epilogue() && !plan.graph.fused)
    check_cuda(launch_bias_activation(plan.epilogue, a.y, conv_out,
                                      p.has_bias ? a.bias : nullptr, stream),
               "launch of the bias/activation kernel");
  if (p.op == FDNN_CONV_BACKWARD_WEIGHT && p.has_bias)
    check_cuda(launch_bias_gradient(plan.epilogue, a.y, a.bias, a.workspace,
                                    plan.bias_grad_scratch, stream),
               "launch of the bias-gradient kernel");
}

// The w cuDNN sees: the caller's, or its copy in x's memory order. A dw output is copied
// in only when beta accumulates into it.
void* stage_w_in(const FDNN_Plan& plan, void* w, char* workspace, cudaStream_t stream) {
  const ConvProblem& p = plan.problem;
  if (!p.stage_w) return w;
  void* staged = workspace + plan.w_stage_offset;
  if (p.op != FDNN_CONV_BACKWARD_WEIGHT || p.beta != 0.0)
    check_cuda(launch_strided_copy(plan.w_to_stage, w, staged, stream),
               "launch of the w staging copy");
  return staged;
}

void stage_w_out(const FDNN_Plan& plan, void* staged, void* w, cudaStream_t stream) {
  if (!plan.problem.stage_w || plan.problem.op != FDNN_CONV_BACKWARD_WEIGHT) return;
  check_cuda(launch_strided_copy(plan.stage_to_w, staged, w, stream),
             "launch of the dw copy-out");
}

// This thread's execution plan. Made outside the lock: finalizing may compile kernels
// (about a second without the kernel cache), and other threads must not wait for that.
// Only this thread makes the plan of its own handle, so no two threads build the same one.
const Desc& execution_plan(const FDNN_Plan& plan, cudnnHandle_t handle) {
  {
    std::lock_guard<std::mutex> lock(plan.plans_mutex);
    auto found = plan.plan_by_handle.find(handle);
    if (found != plan.plan_by_handle.end()) return *found->second;
  }
  DescPtr made = plan_for_handle(*plan.selected.config, plan.selected.runtime_compiled,
                                 plan.kernel_cache, handle);
  if (static_cast<size_t>(made->get_int64(CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE)) >
      plan.selected.workspace)
    fail(FDNN_ERROR_INTERNAL, "cudnn: the engine wants more workspace on this thread "
         "than when planned");
  std::lock_guard<std::mutex> lock(plan.plans_mutex);
  DescPtr& slot = plan.plan_by_handle[handle];
  if (!slot) slot = std::move(made);
  return *slot;
}

void execute_plan(FDNN_Conv_Plan_Execute_Args* args) {
  fdnn_shim::check_struct_size(args, FDNN_Conv_Plan_Execute_Args_STRUCT_SIZE,
                               "Conv_Plan_Execute");
  const FDNN_Plan& plan = fdnn_shim::plan_of<FDNN_Plan>(args->plan, "Conv_Plan_Execute");
  with_problem(plan.problem.description, [&] {
    check_execute_args(*args);
    DeviceGuard guard(plan.problem.device);
    cudaStream_t stream = static_cast<cudaStream_t>(args->stream);
    cudnnHandle_t handle = thread_handle(plan.problem.device, stream);
    char* workspace = static_cast<char*>(args->workspace);
    void* conv_out = args->y;
    if (plan.problem.needs_conv_scratch()) conv_out = workspace + plan.scratch_offset;
    void* w = stage_w_in(plan, args->w, workspace, stream);
    Operands operands{args->x, w, conv_out, plan.graph.binds_bias ? args->bias : nullptr,
                      args->workspace};
    cudnnStatus_t status = run_plan(handle, execution_plan(plan, handle), operands);
    if (status != CUDNN_STATUS_SUCCESS) fail_cudnn(status, "cudnnBackendExecute");
    stage_w_out(plan, w, args->w, stream);
    run_epilogue(plan, *args, conv_out, stream);
  });
}

// ---- the table ---------------------------------------------------------------------------

void Error_Destroy(FDNN_Error_Destroy_Args* args) { fdnn_shim::error_destroy(args); }

void Error_Describe(FDNN_Error_Describe_Args* args) { fdnn_shim::error_describe(args); }

FDNN_Error* Shim_Info(FDNN_Shim_Info_Args* args) {
  return fdnn_shim::guarded([&] {
    fdnn_shim::check_struct_size(args, FDNN_Shim_Info_Args_STRUCT_SIZE, "Shim_Info");
    const ShimState& s = shim_state();
    args->shim_name = "cudnn";
    args->vendor_name = "cuDNN";
    args->vendor_version_built = kBuiltVersion;
    args->vendor_version_runtime = s.runtime_version.c_str();
    args->shim_version = FLUX_DNN_VERSION_STRING;
    args->device_type = FDNN_DEVICE_CUDA;
    args->num_devices = s.num_devices;
    args->priority = FDNN_PRIORITY_VENDOR;
    args->unavailable_reason = s.why_not.empty() ? nullptr : s.why_not.c_str();
  });
}

FDNN_Error* Device_Describe(FDNN_Device_Describe_Args* args) {
  return fdnn_shim::guarded([&] {
    fdnn_shim::check_struct_size(args, FDNN_Device_Describe_Args_STRUCT_SIZE,
                                 "Device_Describe");
    require_device(args->device_id);
    // TF32 for float32 unless the caller says otherwise: PyTorch's default for convolutions
    // (torch.backends.cudnn.allow_tf32 is True).
    args->default_flags = FDNN_CONV_ALLOW_REDUCED_PRECISION;
    args->name = cuda_devices().names[static_cast<size_t>(args->device_id)].c_str();
  });
}

// cuDNN's graph API has convolution kernels of every floating dtype of the ABI; bfloat16
// engines exist from compute capability 8.0 (Ampere) on, and so does TF32, the reduced
// precision of float32. 16-bit inputs may use engines that accumulate in 16 bits
// (reduced-precision reduction) when the caller allows. Every rank (1-D as a unit height),
// activation (fused in cuDNN's graph or in our epilogue kernel) and feature below is served
// on every device; packing is not (cuDNN reads w as it is: Conv_Plan_Pack_Weights is NULL).
fdnn_shim::Capabilities capabilities(int device, int32_t op, FDNN_DLDataType t) {
  const int cc = cuda_devices().compute_capability[static_cast<size_t>(device)];
  const bool ampere = cc >= 80;
  const bool f16 = t.lanes == 1 && t.code == FDNN_DTYPE_FLOAT && t.bits == 16;
  const bool f32 = t.lanes == 1 && t.code == FDNN_DTYPE_FLOAT && t.bits == 32;
  const bool f64 = t.lanes == 1 && t.code == FDNN_DTYPE_FLOAT && t.bits == 64;
  const bool bf16 = t.lanes == 1 && t.code == FDNN_DTYPE_BFLOAT && t.bits == 16;
  if (bf16 && !ampere)
    return fdnn_shim::not_computed(
        "cuDNN has bfloat16 convolutions from compute capability 8.0 on; this GPU is older");
  if (!(f16 || f32 || f64 || bf16))
    return fdnn_shim::not_computed("cuDNN convolutions take float16, bfloat16, float32 and float64");
  fdnn_shim::Capabilities c;
  c.support = FDNN_SUPPORT_NATIVE;
  c.detail = "cuDNN kernels";
  c.spatial_ranks = fdnn_shim::kRanks1To3;
  c.activations = fdnn_shim::activations_of_op(op, fdnn_shim::kEveryActivation);
  c.features = FDNN_FEATURE_GROUPS | FDNN_FEATURE_DILATION | FDNN_FEATURE_ALPHA_BETA |
               FDNN_FEATURE_ASYMMETRIC_PADDING | FDNN_FEATURE_DETERMINISTIC |
               FDNN_FEATURE_BENCHMARK;
  if (op == FDNN_CONV_BACKWARD_WEIGHT) c.features |= FDNN_FEATURE_BIAS_GRADIENT;  // our kernel
  if (f16 || bf16 || (f32 && ampere)) c.features |= FDNN_FEATURE_REDUCED_PRECISION;
  return c;
}

FDNN_Error* Conv_Capabilities(FDNN_Conv_Capabilities_Args* args) {
  return fdnn_shim::conv_capabilities(args, [](int32_t device_id, int32_t op, FDNN_DLDataType t) {
    require_device(device_id);
    return capabilities(device_id, op, t);
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
  FDNN_Plan* plan = args->plan;
  int current = -1;
  // At process exit the CUDA runtime may already be torn down; freeing cuDNN's objects then
  // can crash, so the plan is left to the process's end (as PyTorch leaks its handles).
  if (cudaGetDevice(&current) != cudaSuccess) return;
  try {
    DeviceGuard guard(plan->problem.device);  // cuDNN frees device resources of the plan
    delete plan;
  } catch (...) {
    // The device cannot be made current: leave the plan rather than crash.
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
    // cuDNN reads w as it is (a copy in x's memory order only when it differs), so there is
    // nothing to pack once; callers execute plans as they are.
    nullptr,
};

}  // namespace

extern "C" FDNN_EXPORT const FDNN_Api* fdnn_get_api(void) { return &kApi; }
