// Choosing how cuDNN runs a graph: the candidate engine configurations (cuDNN's heuristic
// list, then its fallback list), filtered by the caller's flags (deterministic, reduced
// precision) and workspace budget, picked by heuristic order, by timing (benchmark), or by
// an id returned earlier (given). The id is stable for one cuDNN version, device and
// problem: (fused graph << 40) | (engine global index << 16) | position in the candidate
// list (| 1 << 41 for the staged problem, set by the plan), so a stale id from another cuDNN
// is recognised instead of silently running something else.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "conv_graph.hpp"

namespace fdnn_cudnn {

// The device pointers of one execution, in the graph's x, w, y roles; bias only for a
// graph that binds it.
struct Operands {
  void* x = nullptr;
  void* w = nullptr;
  void* y = nullptr;
  void* bias = nullptr;
  void* workspace = nullptr;
};

struct EngineRequest {
  int32_t policy = FDNN_ALGO_HEURISTIC;  // FDNN_ALGO_*
  int64_t given_id = 0;
  size_t workspace_budget = SIZE_MAX;  // bytes cuDNN may use
  cudaStream_t stream = nullptr;       // benchmark timing stream
  // Benchmark buffers from the caller's allocator (ABI 2.2); NULL: cudaMallocAsync.
  const FDNN_Device_Allocator* allocator = nullptr;
  // Benchmark: what runs after the convolution in each timed run (our epilogue kernel
  // behind an unfused graph), so that fused and unfused graphs are timed alike. Its
  // operands have a bias buffer whenever the problem has a bias.
  std::function<cudaError_t(const Operands&, cudaStream_t)> after_each;
};

struct Selected {
  DescPtr config;                // the engine configuration chosen
  DescPtr plan;                  // finalized execution plan (on the planning thread's handle)
  std::vector<DescPtr> keep;     // engine config, engine and knobs the plan came from
  size_t workspace = 0;
  int64_t algo_id = 0;
  std::string name;
  float benchmark_ms = -1.f;  // the median time of the chosen plan; < 0 when not timed
};

Selected select_engine(const ConvProblem& p, const ConvGraph& g, const EngineRequest& request,
                       cudnnHandle_t handle);

// Another execution plan of the same engine configuration, on another handle: cuDNN's
// execution plans are not to be shared between threads (PyTorch keeps them thread-local
// for this reason), so each handle gets its own. A runtime-compiled engine compiles its
// kernels again here: cuDNN's kernel cache serves only graphs with dynamic shapes
// (cudnn_graph.h, CUDNN_BACKEND_KERNEL_CACHE_DESCRIPTOR), which ours are not.
DescPtr plan_for_handle(const Desc& config, cudnnHandle_t handle);

// Whether an algo id came from a fused graph (see select_engine).
inline bool algo_id_is_fused(int64_t id) { return id >= 0 && ((id >> 40) & 1) != 0; }

// Bit 41 of an algo id: the engine runs the staged problem (stage_for_fallback), which the
// plan then builds first.
constexpr int64_t kAlgoIdStaged = int64_t(1) << 41;
inline bool algo_id_is_staged(int64_t id) { return id >= 0 && (id & kAlgoIdStaged) != 0; }

// Runs a finalized plan.
cudnnStatus_t run_plan(cudnnHandle_t handle, const Desc& plan, const Operands& operands);

}  // namespace fdnn_cudnn
