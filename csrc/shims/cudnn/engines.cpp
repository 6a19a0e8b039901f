#include "engines.hpp"

#include <algorithm>
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

// Why the caller's flags exclude this engine; empty when they do not.
std::string excluded_by_flags(const Candidate& c, const ConvProblem& p) {
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

// Finalizes an execution plan for a candidate; on refusal returns nothing and says why.
bool build_plan(const Candidate& c, cudnnHandle_t handle, size_t budget, Built* out,
                std::string* why_not) {
  DescPtr plan = make_desc(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
  plan->set_handle(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, handle);
  plan->set_desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, *c.cfg);
  cudnnStatus_t status = plan->try_finalize();
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
                                size_t compiled_limit, std::string* last_refusal) {
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
    if (build_plan(all[i], handle, r.workspace_budget, &b, last_refusal)) plans.push_back(b);
  }
  return plans;
}

// Zeroed stand-ins for the operands, to time candidates on.
struct Scratch {
  DeviceBuffer x, w, y, bias, workspace;
  Scratch(const ConvProblem& p, const ConvGraph& g, size_t ws, cudaStream_t s)
      : x(p.x_logical.span_bytes, s), w(p.w_logical.span_bytes, s),
        y(p.y_logical.span_bytes, s),
        bias(g.binds_bias ? static_cast<size_t>(p.bias.dims[1] * p.bias_stride) *
                                p.element_size
                          : 0,
             s),
        workspace(ws, s) {}
  Operands operands() const { return {x.get(), w.get(), y.get(), bias.get(), workspace.get()}; }
};

// Median of `reps` timed runs in milliseconds, or a negative value when the plan fails.
float time_plan(cudnnHandle_t handle, const Built& b, Scratch& s, cudaStream_t stream) {
  auto run = [&] { return run_plan(handle, *b.plan, s.operands()); };
  if (run() != CUDNN_STATUS_SUCCESS) return -1.f;  // warm-up; also loads the kernels
  constexpr int kReps = 3;
  std::vector<float> ms;
  Event start, stop;
  for (int i = 0; i < kReps; ++i) {
    check_cuda(cudaEventRecord(start.get(), stream), "cudaEventRecord");
    if (run() != CUDNN_STATUS_SUCCESS) return -1.f;
    check_cuda(cudaEventRecord(stop.get(), stream), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(stop.get()), "cudaEventSynchronize");
    float t = 0.f;
    check_cuda(cudaEventElapsedTime(&t, start.get(), stop.get()), "cudaEventElapsedTime");
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return ms[kReps / 2];
}

Selected pick_heuristic(const std::vector<Candidate>& all, const ConvProblem& p,
                        const ConvGraph& g, const EngineRequest& r, cudnnHandle_t handle) {
  std::string last;
  std::vector<Built> plans = usable_plans(all, p, r, handle, 1, SIZE_MAX, &last);
  if (plans.empty()) no_engine(p, all.size(), last);
  return to_selected(all, plans[0], "heuristic", g.fused);
}

// What torch.backends.cudnn.benchmark does: time cuDNN's best few and keep the fastest.
Selected pick_benchmark(const std::vector<Candidate>& all, const ConvProblem& p,
                        const ConvGraph& g, const EngineRequest& r, cudnnHandle_t handle) {
  constexpr size_t kMaxTimed = 8, kMaxCompiled = 2;
  std::string last;
  std::vector<Built> plans = usable_plans(all, p, r, handle, kMaxTimed, kMaxCompiled, &last);
  if (plans.empty()) no_engine(p, all.size(), last);
  size_t ws = 0;
  for (const Built& b : plans) ws = std::max(ws, b.workspace);
  Scratch scratch(p, g, ws, r.stream);
  int best = -1;
  float best_ms = 0.f;
  for (size_t i = 0; i < plans.size(); ++i) {
    float ms = time_plan(handle, plans[i], scratch, r.stream);
    if (ms >= 0.f && (best < 0 || ms < best_ms)) {
      best = static_cast<int>(i);
      best_ms = ms;
    }
  }
  check_cuda(cudaStreamSynchronize(r.stream), "cudaStreamSynchronize");
  if (best < 0) no_engine(p, all.size(), "every timed engine failed to execute");
  return to_selected(all, plans[static_cast<size_t>(best)], "benchmark", g.fused);
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
  DescPtr plan = make_desc(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
  plan->set_handle(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, handle);
  plan->set_desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config);
  plan->finalize("execution plan for another thread");
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
