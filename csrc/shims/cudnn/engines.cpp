#include "engines.hpp"

#include <algorithm>
#include <memory>
#include <set>

#include "cuda_env.hpp"

namespace fdnn_cudnn {
namespace {

using fdnn_shim::fail;

struct Candidate {
  DescPtr cfg;
  DescPtr engine;
  std::vector<DescPtr> knobs;
  int64_t global_index = -1;
  std::vector<cudnnBackendNumericalNote_t> notes;
  bool runtime_compiled = false;  // finalizing compiles kernels (NVRTC): about a second
  std::string label;  // "engine 12 {2=3,14=4}": global index and knob type=value
};

bool has_note(const Candidate& c, cudnnBackendNumericalNote_t note) {
  return std::find(c.notes.begin(), c.notes.end(), note) != c.notes.end();
}

// Engine configs as cuDNN's heuristic `mode` ranks them.
std::vector<DescPtr> heuristic_configs(const ConvGraph& g, cudnnBackendHeurMode_t mode) {
  Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, *g.graph);
  heur.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  if (heur.try_finalize() != CUDNN_STATUS_SUCCESS) return {};  // no engine in this mode
  int64_t count = heur.get(CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                           nullptr);
  std::vector<DescPtr> configs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < count; ++i) {
    configs.push_back(make_desc(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
    raw.push_back(configs.back()->get());
  }
  if (count > 0)
    count = heur.get(CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count,
                     raw.data());
  configs.resize(static_cast<size_t>(count));
  return configs;
}

void read_knobs(Candidate* c) {
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int i = 0; i < CUDNN_KNOB_TYPE_COUNTS; ++i) {
    c->knobs.push_back(make_desc(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR));
    raw.push_back(c->knobs.back()->get());
  }
  int64_t n = c->cfg->get(CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                          static_cast<int64_t>(raw.size()), raw.data());
  c->knobs.resize(static_cast<size_t>(n));
  std::string text;
  for (const DescPtr& k : c->knobs) {
    cudnnBackendKnobType_t type{};
    k->get(CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &type);
    int64_t value = k->get_int64(CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE);
    text += (text.empty() ? "" : ",") + std::to_string(static_cast<int>(type)) + "=" +
            std::to_string(value);
  }
  c->label = "engine " + std::to_string(c->global_index) + " {" + text + "}";
}

Candidate describe_config(DescPtr cfg) {
  Candidate c;
  c.cfg = std::move(cfg);
  c.engine = make_desc(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  cudnnBackendDescriptor_t raw_engine = c.engine->get();
  c.cfg->get(CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &raw_engine);
  c.global_index = c.engine->get_int64(CUDNN_ATTR_ENGINE_GLOBAL_INDEX);
  cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  int64_t n = c.engine->get(CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                            CUDNN_NUMERICAL_NOTE_TYPE_COUNT, notes);
  c.notes.assign(notes, notes + n);
  cudnnBackendBehaviorNote_t behavior[CUDNN_BEHAVIOR_NOTE_TYPE_COUNT];
  int64_t nb = c.engine->get(CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                             CUDNN_BEHAVIOR_NOTE_TYPE_COUNT, behavior);
  for (int64_t i = 0; i < nb; ++i)
    c.runtime_compiled |= behavior[i] == CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION;
  read_knobs(&c);
  return c;
}

// cuDNN's ranked list (mode A), then its fallback engines, without repeats. Deterministic
// for one cuDNN version, device and graph, which makes positions usable as ids.
std::vector<Candidate> engine_candidates(const ConvGraph& g) {
  std::vector<Candidate> all;
  std::set<std::string> seen;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    for (DescPtr& cfg : heuristic_configs(g, mode)) {
      Candidate c = describe_config(std::move(cfg));
      if (seen.insert(c.label).second) all.push_back(std::move(c));
    }
  }
  return all;
}

// Why this engine is not used for `p` (the caller's flags, or an engine known to compute
// such a problem wrongly); empty when it may be.
std::string excluded_by_flags(const Candidate& c, const ConvProblem& p) {
  // Measured on cuDNN 9.19 (H200, GPU check of 2026-12-04): the runtime-compiled fusion
  // engines (engines 7 and 52, knob 24=29) accepted channels-first conv + bias/activation
  // graphs and left outputs unwritten or wrong (1-D, 1x1 and 3x3 outputs, float32 and
  // float16), where channels-last graphs were right; cuDNN documents its runtime fusion for
  // NHWC tensors. So runtime-compiled engines serve channels-last problems only.
  if (c.runtime_compiled && !p.x.channels_last) return "runtime-compiled (channels-last only)";
  // Engines that convert inputs to a narrower type lose more than any flag allows (PyTorch
  // never uses them either).
  if (has_note(c, CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS)) return "down-converting inputs";
  if (p.deterministic() && has_note(c, CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC))
    return "nondeterministic";
  if (p.reduced_precision_allowed()) return {};
  if (has_note(c, CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION))
    return "reduced-precision reduction";
  // For float32 data, tensor cores mean TF32 math.
  if (p.dtype == CUDNN_DATA_FLOAT && has_note(c, CUDNN_NUMERICAL_NOTE_TENSOR_CORE))
    return "TF32 (reduced precision not allowed)";
  return {};
}

std::string notes_text(const Candidate& c) {
  std::string t;
  if (has_note(c, CUDNN_NUMERICAL_NOTE_TENSOR_CORE)) t += " tensor-core";
  if (has_note(c, CUDNN_NUMERICAL_NOTE_WINOGRAD)) t += " winograd";
  if (has_note(c, CUDNN_NUMERICAL_NOTE_FFT)) t += " fft";
  if (has_note(c, CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC)) t += " nondeterministic";
  return t;
}

struct Built {
  DescPtr plan;
  size_t workspace = 0;
  size_t index = 0;
};

// A finalized execution plan of `config` on `handle`, once: a refusal is the candidate's.
cudnnStatus_t finalize_plan(const Desc& config, cudnnHandle_t handle, DescPtr* out) {
  DescPtr plan = make_desc(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
  plan->set_handle(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, handle);
  plan->set_desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config);
  cudnnStatus_t status = plan->try_finalize();
  if (status == CUDNN_STATUS_SUCCESS) *out = std::move(plan);
  return status;
}

// Finalizes an execution plan for a candidate; on refusal returns nothing and says why.
bool build_plan(const Candidate& c, cudnnHandle_t handle, size_t budget, Built* out,
                std::string* why_not) {
  DescPtr plan;
  cudnnStatus_t status = finalize_plan(*c.cfg, handle, &plan);
  if (status != CUDNN_STATUS_SUCCESS) {
    *why_not = c.label + ": " + cudnn_status_text(status);
    return false;
  }
  int64_t ws = plan->get_int64(CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE);
  if (static_cast<uint64_t>(ws) > budget) {
    *why_not = c.label + " needs " + std::to_string(ws) + " bytes of workspace, over the "
               "limit of " + std::to_string(budget);
    return false;
  }
  out->plan = std::move(plan);
  out->workspace = static_cast<size_t>(ws);
  return true;
}

Selected to_selected(const std::vector<Candidate>& all, const Built& b, const char* how,
                     bool fused) {
  const Candidate& c = all[b.index];
  Selected s;
  s.config = c.cfg;
  s.plan = b.plan;
  s.keep = {c.cfg, c.engine};
  s.keep.insert(s.keep.end(), c.knobs.begin(), c.knobs.end());
  s.workspace = b.workspace;
  s.algo_id = (static_cast<int64_t>(fused) << 40) | (c.global_index << 16) |
              static_cast<int64_t>(b.index);
  s.name = std::string("cudnn ") + (fused ? "fused conv+bias+act " : "") + c.label +
           notes_text(c) + " (" + how + ")";
  return s;
}

[[noreturn]] void no_engine(const ConvProblem& p, size_t n, const std::string& last) {
  fail(FDNN_ERROR_UNSUPPORTED,
       "cudnn: no cuDNN engine runs this convolution under the given flags and workspace "
       "limit (%zu candidates; last refusal: %s) [%s]",
       n, last.empty() ? "none offered" : last.c_str(), p.description.c_str());
}

// The plans that pass the flags and the budget, in cuDNN's order, at most `limit`, of which
// at most `compiled_limit` need kernels compiled at run time (each costs about a second).
std::vector<Built> usable_plans(const std::vector<Candidate>& all, const ConvProblem& p,
                                const EngineRequest& r, cudnnHandle_t handle, size_t limit,
                                size_t compiled_limit,
                                std::string* last_refusal) {
  std::vector<Built> plans;
  size_t compiled = 0;
  for (size_t i = 0; i < all.size() && plans.size() < limit; ++i) {
    std::string why = excluded_by_flags(all[i], p);
    if (!why.empty()) {
      *last_refusal = all[i].label + " is " + why;
      continue;
    }
    if (all[i].runtime_compiled && compiled++ >= compiled_limit) continue;
    Built b;
    b.index = i;
    if (build_plan(all[i], handle, r.workspace_budget, &b, last_refusal))
      plans.push_back(b);
  }
  return plans;
}

// Stand-ins for the operands as the graph sees them (a staged operand is the compact copy),
// filled with small non-zero values, to time candidates on. Stream-ordered allocations, from
// the caller's allocator when it gave one (the array library's pool), else cudaMallocAsync:
// no device-wide synchronisation, and a refusal is an error code.
struct Scratch {
  DeviceBuffer x, w, y, bias, workspace;
  Scratch(const ConvProblem& p, size_t ws, cudaStream_t s, const FDNN_Device_Allocator* a)
      : x(p.x.seen().span_bytes, s, a), w(p.w.seen().span_bytes, s, a),
        y(p.y.seen().span_bytes, s, a),
        bias(p.bias_span_bytes(), s, a),
        workspace(ws, s, a) {}
  Operands operands(bool binds_bias) const {
    return {x.get(), w.get(), y.get(), binds_bias ? bias.get() : nullptr, workspace.get()};
  }
  static size_t operand_bytes(const ConvProblem& p) {
    return p.x.seen().span_bytes + p.w.seen().span_bytes + p.y.seen().span_bytes +
           p.bias_span_bytes();
  }
};

// Median of `reps` timed runs in milliseconds, or a negative value when the plan fails.
float time_plan(cudnnHandle_t handle, const Built& b, const Scratch& s, bool binds_bias,
                const EngineRequest& r) {
  Operands operands = s.operands(binds_bias);
  auto run = [&] {
    cudnnStatus_t status = run_plan(handle, *b.plan, operands);
    if (status != CUDNN_STATUS_SUCCESS) return false;
    if (!r.after_each) return true;
    Operands all = operands;
    all.bias = s.bias.get();
    return r.after_each(all, r.stream) == cudaSuccess;
  };
  if (!run()) return -1.f;  // warm-up; also loads the kernels
  constexpr int kReps = 3;
  std::vector<float> ms;
  Event start, stop;
  for (int i = 0; i < kReps; ++i) {
    check_cuda(cudaEventRecord(start.get(), r.stream), "cudaEventRecord");
    if (!run()) return -1.f;
    check_cuda(cudaEventRecord(stop.get(), r.stream), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(stop.get()), "cudaEventSynchronize");
    float t = 0.f;
    check_cuda(cudaEventElapsedTime(&t, start.get(), stop.get()), "cudaEventElapsedTime");
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return ms[kReps / 2];
}

// Bytes the benchmark may hold for a candidate's workspace: the caller's budget, and no
// more than three quarters of the device memory free besides the operands' stand-ins.
size_t benchmark_workspace_cap(const ConvProblem& p, size_t budget) {
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
    cudaGetLastError();  // not sticky; clear it
    return 0;
  }
  size_t operands = Scratch::operand_bytes(p);
  size_t usable = free_bytes > operands ? (free_bytes - operands) / 4 * 3 : 0;
  return std::min(budget, usable);
}

Selected pick_heuristic(const std::vector<Candidate>& all, const ConvProblem& p,
                        const ConvGraph& g, const EngineRequest& r, cudnnHandle_t handle,
                        const char* how = "heuristic") {
  std::string last;
  std::vector<Built> plans = usable_plans(all, p, r, handle, 1, SIZE_MAX, &last);
  if (plans.empty()) no_engine(p, all.size(), last);
  return to_selected(all, plans[0], how, g.fused);
}

// What torch.backends.cudnn.benchmark does: time cuDNN's best few and keep the fastest.
// Candidates whose workspace the device cannot spare now are not timed; when the scratch
// cannot be had at all, the heuristic's choice is kept and the name says why.
Selected pick_benchmark(const std::vector<Candidate>& all, const ConvProblem& p,
                        const ConvGraph& g, const EngineRequest& r, cudnnHandle_t handle) {
  constexpr size_t kMaxTimed = 8, kMaxCompiled = 2;
  EngineRequest capped = r;
  capped.workspace_budget = benchmark_workspace_cap(p, r.workspace_budget);
  std::string last;
  std::vector<Built> plans =
      usable_plans(all, p, capped, handle, kMaxTimed, kMaxCompiled, &last);
  if (plans.empty())
    return pick_heuristic(all, p, g, r, handle,
                          "heuristic: no candidate's workspace fits free device memory");
  size_t ws = 0;
  for (const Built& b : plans) ws = std::max(ws, b.workspace);
  std::unique_ptr<Scratch> scratch;
  try {
    scratch = std::make_unique<Scratch>(p, ws, r.stream, r.allocator);
  } catch (const fdnn_shim::Failure& f) {
    if (f.code() != FDNN_ERROR_OUT_OF_MEMORY) throw;
    cudaGetLastError();  // an allocation failure is not sticky; clear it
    return pick_heuristic(all, p, g, r, handle,
                          "heuristic: out of device memory for the benchmark");
  }
  int best = -1;
  float best_ms = 0.f;
  for (size_t i = 0; i < plans.size(); ++i) {
    float ms = time_plan(handle, plans[i], *scratch, g.binds_bias, r);
    if (ms >= 0.f && (best < 0 || ms < best_ms)) {
      best = static_cast<int>(i);
      best_ms = ms;
    }
  }
  scratch.reset();  // freed in stream order
  check_cuda(cudaStreamSynchronize(r.stream), "cudaStreamSynchronize");
  if (best < 0) no_engine(p, all.size(), "every timed engine failed to execute");
  Selected s = to_selected(all, plans[static_cast<size_t>(best)], "benchmark", g.fused);
  s.benchmark_ms = best_ms;
  return s;
}

Selected pick_given(const std::vector<Candidate>& all, const ConvProblem& p,
                    const ConvGraph& g, const EngineRequest& r, cudnnHandle_t handle) {
  int64_t index = r.given_id & 0xffff;
  int64_t engine = (r.given_id >> 16) & 0xffffff;
  if (r.given_id < 0 || algo_id_is_fused(r.given_id) != g.fused ||
      index >= static_cast<int64_t>(all.size()) ||
      all[static_cast<size_t>(index)].global_index != engine)
    fail(FDNN_ERROR_INVALID_ARGUMENT,
         "cudnn: algo id %lld does not name an engine cuDNN offers for this problem here "
         "(stale autotune entry from another cuDNN or device?) [%s]",
         static_cast<long long>(r.given_id), p.description.c_str());
  const Candidate& c = all[static_cast<size_t>(index)];
  std::string why = excluded_by_flags(c, p);
  if (!why.empty())
    fail(FDNN_ERROR_INVALID_ARGUMENT, "cudnn: algo id %lld (%s) is %s, which the flags "
         "exclude [%s]", static_cast<long long>(r.given_id), c.label.c_str(), why.c_str(),
         p.description.c_str());
  Built b;
  b.index = static_cast<size_t>(index);
  if (!build_plan(c, handle, r.workspace_budget, &b, &why))
    fail(FDNN_ERROR_UNSUPPORTED, "cudnn: algo id %lld cannot be used: %s [%s]",
         static_cast<long long>(r.given_id), why.c_str(), p.description.c_str());
  return to_selected(all, b, "given", g.fused);
}

}  // namespace

Selected select_engine(const ConvProblem& p, const ConvGraph& g, const EngineRequest& r,
                       cudnnHandle_t handle) {
  std::vector<Candidate> all = engine_candidates(g);
  switch (r.policy) {
    case FDNN_ALGO_BENCHMARK: return pick_benchmark(all, p, g, r, handle);
    case FDNN_ALGO_GIVEN: return pick_given(all, p, g, r, handle);
    case FDNN_ALGO_HEURISTIC: break;
    default:
      fail(FDNN_ERROR_INVALID_ARGUMENT, "cudnn: unknown algo_policy %d",
           static_cast<int>(r.policy));
  }
  return pick_heuristic(all, p, g, r, handle);
}

DescPtr plan_for_handle(const Desc& config, cudnnHandle_t handle) {
  DescPtr plan;
  cudnnStatus_t status = finalize_plan(config, handle, &plan);
  if (status != CUDNN_STATUS_SUCCESS)
    fail_cudnn(status, "cudnnBackendFinalize(execution plan for another thread)");
  return plan;
}

cudnnStatus_t run_plan(cudnnHandle_t handle, const Desc& plan, const Operands& o) {
  // A variant pack binds this call's pointers; the plan itself is reused untouched.
  const CudnnLib& lib = cudnn();
  cudnnBackendDescriptor_t pack = nullptr;
  cudnnStatus_t status = lib.BackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR,
                                                     &pack);
  if (status != CUDNN_STATUS_SUCCESS) return status;
  int64_t uids[] = {kUidX, kUidW, kUidY, kUidBias};
  void* pointers[] = {o.x, o.w, o.y, o.bias};
  int64_t count = o.bias != nullptr ? 4 : 3;
  void* workspace = o.workspace;
  status = lib.BackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
                                   count, uids);
  if (status == CUDNN_STATUS_SUCCESS)
    status = lib.BackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                     CUDNN_TYPE_VOID_PTR, count, pointers);
  if (status == CUDNN_STATUS_SUCCESS)
    status = lib.BackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
                                     CUDNN_TYPE_VOID_PTR, 1, &workspace);
  if (status == CUDNN_STATUS_SUCCESS) status = lib.BackendFinalize(pack);
  if (status == CUDNN_STATUS_SUCCESS) status = lib.BackendExecute(handle, plan.get(), pack);
  lib.BackendDestroyDescriptor(pack);
  return status;
}

}  // namespace fdnn_cudnn
