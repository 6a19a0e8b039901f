// The cuDNN shim: flux_dnn's ABI (flux_dnn.h) over cuDNN 9's graph API on NVIDIA GPUs.
//
// A plan holds a finalized cuDNN execution plan for one convolution (with bias and
// activation fused into the graph when cuDNN can), chosen once at plan time (heuristic,
// benchmark or given id); executing it binds this call's pointers in a variant pack and
// launches on the caller's stream. What the graph does not take (bias, activation, beta
// around an unfused convolution; the bias gradient of backward-weight; operands cuDNN
// refuses as they are, copied compactly through the workspace, x zero-padded where the
// padding differs before and after) our own kernels do (epilogue.cu). See README.md for the
// choices.
#include <cudnn_version.h>

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
  ConvProblem problem;  // as given, or staged (stage_for_fallback) when cuDNN refused that
  ConvGraph graph;
  Selected selected;
  WorkspaceLayout layout;  // of the caller's workspace (workspace.hpp)
  EpilogueParams epilogue;
  // Of the staged operands, in the graph's x, w, y roles: into the workspace before the
  // convolution (what it reads), out of it after (what it writes).
  StridedCopy copy_in[kRoles], copy_out[kRoles];
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

constexpr Role kEveryRole[] = {Role::kX, Role::kW, Role::kY};

// Where beta (out = ... + beta * out_old) is applied: cuDNN's own scaling; our epilogue, after
// the activation; or the copy-out of a staged output (cuDNN and the epilogue then write the
// compact copy with beta 0).
enum class BetaBy { kConv, kEpilogue, kCopyOut };

BetaBy beta_by(const ConvProblem& p) {
  if (p.output().staged) return BetaBy::kCopyOut;
  if (p.has_epilogue() && p.activation != FDNN_ACTIVATION_NONE) return BetaBy::kEpilogue;
  return BetaBy::kConv;
}

ElementType element_type(cudnnDataType_t t) {
  switch (t) {
    case CUDNN_DATA_HALF: return ElementType::kHalf;
    case CUDNN_DATA_BFLOAT16: return ElementType::kBFloat16;
    case CUDNN_DATA_DOUBLE: return ElementType::kDouble;
    default: return ElementType::kFloat;
  }
}

StridedTensor strided(const LogicalTensor& t) {
  StridedTensor s;
  s.ndim = static_cast<int>(t.shape.size());
  for (int d = 0; d < s.ndim; ++d) {
    s.shape[d] = t.shape[static_cast<size_t>(d)];
    s.strides[d] = t.strides[static_cast<size_t>(d)];
  }
  return s;
}

// Where alpha of y = alpha * act(conv + bias) + beta * y is applied: in cuDNN's convolution
// scale when nothing non-linear follows (alpha * conv, the epilogue adding alpha * bias:
// no extra pass); after the activation, in our epilogue, when one follows (the convolution
// then runs with scale 1). The fused graph takes alpha 1 only (can_fuse_epilogue).
bool alpha_in_conv(const ConvProblem& p) { return p.activation == FDNN_ACTIVATION_NONE; }

// The forward epilogue runs on y as the convolution wrote it (the compact copy of a staged
// y); the bias gradient reads the caller's dy.
EpilogueParams epilogue_params(const ConvProblem& p) {
  EpilogueParams e;
  bool forward = p.op == FDNN_CONV_FORWARD;
  e.type = element_type(p.dtype);
  e.y = strided(forward ? p.y.seen() : p.y.user);
  e.bias_stride = p.bias_stride;
  e.alpha = p.alpha;
  e.alpha_in_conv = alpha_in_conv(p);
  e.beta = !forward || beta_by(p) == BetaBy::kEpilogue ? p.beta : 0.0;
  e.activation = p.activation;
  e.activation_alpha = p.activation_alpha;
  e.activation_beta = p.activation_beta;
  return e;
}

// dst's element i is src's at i - lead (zero outside src), blended with beta.
StridedCopy copy_between(const LogicalTensor& src, const LogicalTensor& dst,
                         const std::vector<int64_t>& lead, bool negate_lead, double beta,
                         ElementType type) {
  StridedCopy c;
  c.type = type;
  c.src = strided(src);
  c.dst = strided(dst);
  for (size_t d = 0; d < lead.size(); ++d) c.lead[d] = negate_lead ? -lead[d] : lead[d];
  c.beta = beta;
  return c;
}

// Scaling inside the cuDNN operation: alpha where alpha_in_conv (the epilogue adds alpha *
// bias after it), else 1 (the epilogue scales the activated value); beta only where cuDNN
// applies it.
ConvScales conv_scales(const ConvProblem& p) {
  return {alpha_in_conv(p) ? p.alpha : 1.0, beta_by(p) == BetaBy::kConv ? p.beta : 0.0};
}

// Bytes of the caller's workspace the shim itself uses besides cuDNN's (workspace.hpp).
ExtraWorkspace extra_workspace(const ConvProblem& p) {
  ExtraWorkspace e;
  if (p.needs_conv_scratch()) e.conv_result = round_up(p.y.user.span_bytes, kWorkspaceAlign);
  for (Role r : kEveryRole) {
    const Operand& o = p.operand(r);
    if (o.staged) e.staged[static_cast<int>(r)] = round_up(o.compact.span_bytes, kWorkspaceAlign);
  }
  return e;
}

// Where the shim's own scratch does not fit the limit (the core's no-workspace fallback is
// a limit of 0): w goes to cuDNN in its own memory order instead of a staged copy. The conv
// result an activation with beta != 0 needs, and the copies cuDNN cannot do without, have no
// substitute.
void fit_extra_workspace(ConvProblem* p, size_t limit) {
  if (extra_workspace(*p).total() <= limit) return;
  if (p->w.staged) use_w_unstaged(p);
  ExtraWorkspace extra = extra_workspace(*p);
  if (extra.total() <= limit) return;
  std::string parts = staging_text(*p);
  if (extra.conv_result > 0)
    parts = "the conv result that the activation with beta != 0 reads before y is "
            "overwritten" + (parts.empty() ? "" : "; copies of " + parts);
  else
    parts = "copies of " + parts;
  fail(FDNN_ERROR_UNSUPPORTED, "cudnn: needs %zu bytes of workspace for %s, over the limit "
       "of %zu", extra.total(), parts.c_str(), limit);
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
    plan->selected = select_engine(p, fused, request, handle);
    plan->graph = std::move(fused);
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
  plan->selected = select_engine(p, graph, timed, handle);
  plan->graph = std::move(graph);
}

// Benchmark with a fusable epilogue: the fused graph and conv + our epilogue are both timed
// and the faster kept (cuDNN's fused engines are not always the faster).
void choose_timed_against_unfused(FDNN_Plan* plan, const EngineRequest& request,
                                  cudnnHandle_t handle) {
  Selected fused = plan->selected;
  ConvGraph fused_graph = std::move(plan->graph);
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
}

// Chooses an engine for `p` (the problem as given, or staged), within the workspace limit.
void plan_problem(FDNN_Plan* plan, ConvProblem p, EngineRequest request, size_t limit,
                  cudnnHandle_t handle) {
  fit_extra_workspace(&p, limit);
  request.workspace_budget = shared_budget(limit, extra_workspace(p));
  plan->problem = std::move(p);
  if (try_fused_graph(plan, request, handle)) {
    if (request.policy == FDNN_ALGO_BENCHMARK)
      choose_timed_against_unfused(plan, request, handle);
  } else {
    choose_unfused(plan, request, handle);
  }
  if (!plan->problem.fallback) return;
  plan->selected.algo_id |= kAlgoIdStaged;
  plan->selected.name += " + in the workspace: " + staging_text(plan->problem);
}

// The problem as given first; only when cuDNN refuses it (no engine, or a graph it does not
// take), the staged problem: copies cost time and workspace, and cuDNN serves most strides
// and asymmetric paddings itself. Straight to the staged one when cuDNN cannot be given the
// operands as they are, or when a given id came from it.
void choose_engine(FDNN_Plan* plan, const FDNN_Conv_Plan_Create_Args& args) {
  const ConvProblem given = plan->problem;
  ConvProblem staged = given;
  bool can_stage = stage_for_fallback(&staged);
  DeviceGuard guard(given.device);
  EngineRequest request;
  request.policy = args.algo_policy;
  request.given_id = args.algo_id;
  request.stream = static_cast<cudaStream_t>(args.stream);
  request.allocator = reinterpret_cast<const FDNN_Device_Allocator*>(fdnn_shim::find_extension(
      args.extension_start, FDNN_EXTENSION_DEVICE_ALLOCATOR, FDNN_Device_Allocator_STRUCT_SIZE,
      "Conv_Plan_Create"));
  size_t limit = args.workspace_limit;
  cudnnHandle_t handle = thread_handle(given.device, request.stream);
  bool given_id = request.policy == FDNN_ALGO_GIVEN;
  if (!cudnn_can_take(given) || (given_id && algo_id_is_staged(request.given_id))) {
    plan_problem(plan, staged, request, limit, handle);
  } else {
    try {
      plan_problem(plan, given, request, limit, handle);
    } catch (const Failure& refused) {
      if (refused.code() != FDNN_ERROR_UNSUPPORTED || !can_stage || given_id) throw;
      try {
        plan_problem(plan, staged, request, limit, handle);
      } catch (const Failure& too) {
        throw Failure(too.code(), std::string(too.what()) + " (with copies in the workspace; "
                                  "as given: " + refused.what() + ")");
      }
    }
  }
  plan->plan_by_handle[handle] = plan->selected.plan;
}

// The caller's workspace (workspace.hpp); the bias-gradient partials overlap cuDNN's part:
// the convolution is done by the time they are written.
void lay_out_workspace(FDNN_Plan* plan, size_t limit) {
  const ConvProblem& p = plan->problem;
  bool bias_gradient = p.op == FDNN_CONV_BACKWARD_WEIGHT && p.has_bias;
  plan->layout =
      lay_out(limit, plan->selected.workspace,
              bias_gradient ? bias_gradient_scratch_bytes(plan->epilogue) : 0, extra_workspace(p));
  if (plan->layout.total > limit)
    fail(FDNN_ERROR_INTERNAL, "cudnn: laid out %zu bytes of workspace, over the limit of %zu",
         plan->layout.total, limit);
  ElementType type = element_type(p.dtype);
  double out_beta = beta_by(p) == BetaBy::kCopyOut ? p.beta : 0.0;
  for (Role r : kEveryRole) {
    const Operand& o = p.operand(r);
    if (!o.staged) continue;
    int i = static_cast<int>(r);
    if (r == p.output_role())  // cropped out of the padded copy where it is one
      plan->copy_out[i] = copy_between(o.compact, o.user, o.lead, true, out_beta, type);
    else
      plan->copy_in[i] = copy_between(o.user, o.compact, o.lead, false, 0.0, type);
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
  args->workspace_size = plan->layout.total;
  args->chosen_algo_id = plan->selected.algo_id;
  args->algo_name = plan->selected.name.c_str();
  args->plan = plan.release();
}

void check_alignment(const void* ptr, int64_t alignment, const char* name) {
  if (reinterpret_cast<uintptr_t>(ptr) % static_cast<uintptr_t>(alignment) != 0)
    fail(FDNN_ERROR_INVALID_ARGUMENT, "cudnn: %s at %p is not %lld-byte aligned as the plan "
         "assumed (plan with the real data pointers to allow less)", name, ptr,
         static_cast<long long>(alignment));
}

// The header's rules (shared), then the alignment this plan assumed of each pointer cuDNN
// reads or writes in place (a staged operand is read or written by our copy, which needs
// only the element alignment the shared check makes).
void check_execute_args(const FDNN_Conv_Plan_Execute_Args& a) {
  const FDNN_Plan& plan = *a.plan;
  const ConvProblem& p = plan.problem;
  fdnn_shim::check_execute_args(a, p.element_size, plan.layout.total,
                                {true, true, true, p.has_bias});
  const struct {
    const Operand& operand;
    const void* pointer;
    const char* name;
  } operands[] = {{p.x, a.x, "x"}, {p.w, a.w, "w"}, {p.y, a.y, "y"}};
  for (const auto& o : operands)
    if (!o.operand.staged) check_alignment(o.pointer, o.operand.user_alignment, o.name);
  if (plan.graph.binds_bias) check_alignment(a.bias, p.bias.alignment, "bias");
}

// The caller's x, w, y and, for each staged one, its copy in the workspace.
struct Pointers {
  void* user[kRoles];
  void* seen[kRoles];  // what the convolution reads or writes
};

// Copies the staged operands the convolution reads into the workspace.
Pointers stage_in(const FDNN_Plan& plan, const FDNN_Conv_Plan_Execute_Args& a,
                  cudaStream_t stream) {
  const ConvProblem& p = plan.problem;
  Pointers ptr{{a.x, a.w, a.y}, {a.x, a.w, a.y}};
  for (Role r : kEveryRole) {
    int i = static_cast<int>(r);
    if (!p.operand(r).staged) continue;
    ptr.seen[i] = static_cast<char*>(a.workspace) + plan.layout.stage_offset[i];
    if (r != p.output_role())
      check_cuda(launch_strided_copy(plan.copy_in[i], ptr.user[i], ptr.seen[i], stream),
                 "launch of a copy into the workspace");
  }
  return ptr;
}

// Copies a staged output out of the workspace into the caller's, applying beta.
void stage_out(const FDNN_Plan& plan, const Pointers& ptr, cudaStream_t stream) {
  Role r = plan.problem.output_role();
  int i = static_cast<int>(r);
  if (!plan.problem.operand(r).staged) return;
  check_cuda(launch_strided_copy(plan.copy_out[i], ptr.seen[i], ptr.user[i], stream),
             "launch of the copy out of the workspace");
}

// The forward epilogue on y as the convolution wrote it (`y`: the caller's or its staged
// copy), before any copy-out.
void run_epilogue(const FDNN_Plan& plan, const FDNN_Conv_Plan_Execute_Args& a, void* y,
                  void* conv_out, cudaStream_t stream) {
  const ConvProblem& p = plan.problem;
  if (!p.has_epilogue() || plan.graph.fused) return;
  check_cuda(launch_bias_activation(plan.epilogue, y, conv_out, p.has_bias ? a.bias : nullptr,
                                    stream),
             "launch of the bias/activation kernel");
}

// db from the caller's dy; its partials overlap cuDNN's workspace, done with by now.
void run_bias_gradient(const FDNN_Plan& plan, const FDNN_Conv_Plan_Execute_Args& a,
                       cudaStream_t stream) {
  const ConvProblem& p = plan.problem;
  if (p.op != FDNN_CONV_BACKWARD_WEIGHT || !p.has_bias) return;
  check_cuda(launch_bias_gradient(plan.epilogue, a.y, a.bias, a.workspace,
                                  plan.layout.bias_grad, stream),
             "launch of the bias-gradient kernel");
}

// This thread's execution plan. Made outside the lock: finalizing may compile kernels
// (about a second for a runtime-compiled engine), and other threads must not wait for that.
// Only this thread makes the plan of its own handle, so no two threads build the same one.
const Desc& execution_plan(const FDNN_Plan& plan, cudnnHandle_t handle) {
  {
    std::lock_guard<std::mutex> lock(plan.plans_mutex);
    auto found = plan.plan_by_handle.find(handle);
    if (found != plan.plan_by_handle.end()) return *found->second;
  }
  DescPtr made = plan_for_handle(*plan.selected.config, handle);
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
  const ConvProblem& p = plan.problem;
  with_problem(p.description, [&] {
    check_execute_args(*args);
    DeviceGuard guard(p.device);
    cudaStream_t stream = static_cast<cudaStream_t>(args->stream);
    cudnnHandle_t handle = thread_handle(p.device, stream);
    Pointers ptr = stage_in(plan, *args, stream);
    void* y = ptr.seen[static_cast<int>(Role::kY)];
    void* conv_out = p.needs_conv_scratch()
                         ? static_cast<char*>(args->workspace) + plan.layout.scratch_offset
                         : y;
    Operands operands{ptr.seen[0], ptr.seen[1], conv_out,
                      plan.graph.binds_bias ? args->bias : nullptr, args->workspace};
    cudnnStatus_t status = run_plan(handle, execution_plan(plan, handle), operands);
    if (status != CUDNN_STATUS_SUCCESS) fail_cudnn(status, "cudnnBackendExecute");
    run_epilogue(plan, *args, y, conv_out, stream);
    stage_out(plan, ptr, stream);
    run_bias_gradient(plan, *args, stream);
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
  // ASYMMETRIC_PADDING (by cuDNN itself): forward and backward-data try the graph API's
  // pre/post paddings first, a padded copy only where cuDNN has no engine for them
  // (stage_for_fallback); backward-weight always runs on a padded copy (cudnn_can_take: its
  // engines computed asymmetric padding wrongly on the GPU check), so it does not claim it.
  c.features = FDNN_FEATURE_GROUPS | FDNN_FEATURE_DILATION | FDNN_FEATURE_ALPHA_BETA |
               FDNN_FEATURE_DETERMINISTIC | FDNN_FEATURE_BENCHMARK;
  if (op != FDNN_CONV_BACKWARD_WEIGHT) c.features |= FDNN_FEATURE_ASYMMETRIC_PADDING;
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
