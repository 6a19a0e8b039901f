// Choosing how cuDNN runs a graph: the candidate engine configurations (cuDNN's heuristic
// list, then its fallback list), filtered by the caller's flags (deterministic, reduced
// precision) and workspace budget, picked by heuristic order, by timing (benchmark), or by
// an id returned earlier (given). The id is stable for one cuDNN version, device and
// problem: (fused graph << 40) | (engine global index << 16) | position in the candidate
// list, so a stale id from another cuDNN is recognised instead of silently running
// something else.
#pragma once

#include <string>

#include "conv_graph.hpp"

namespace fdnn_cudnn {

struct EngineRequest {
  int32_t policy = FDNN_ALGO_HEURISTIC;  // FDNN_ALGO_*
  int64_t given_id = 0;
  size_t workspace_budget = SIZE_MAX;  // bytes cuDNN may use
  cudaStream_t stream = nullptr;       // benchmark timing stream
};

struct Selected {
  DescPtr config;                // the engine configuration chosen
  DescPtr plan;                  // finalized execution plan (on the planning thread's handle)
  std::vector<DescPtr> keep;     // engine config, engine and knobs the plan came from
  size_t workspace = 0;
  int64_t algo_id = 0;
  std::string name;
};

Selected select_engine(const ConvProblem& p, const ConvGraph& g, const EngineRequest& request,
                       cudnnHandle_t handle);

// Another execution plan of the same engine configuration, on another handle: cuDNN's
// execution plans are not to be shared between threads (PyTorch keeps them thread-local
// for this reason), so each handle gets its own.
DescPtr plan_for_handle(const Desc& config, cudnnHandle_t handle);

// The device pointers of one execution, in the graph's x, w, y roles; bias only for a
// graph that binds it.
struct Operands {
  void* x = nullptr;
  void* w = nullptr;
  void* y = nullptr;
  void* bias = nullptr;
  void* workspace = nullptr;
};

// Whether an algo id came from a fused graph (see select_engine).
inline bool algo_id_is_fused(int64_t id) { return id >= 0 && ((id >> 40) & 1) != 0; }

// Runs a finalized plan.
cudnnStatus_t run_plan(cudnnHandle_t handle, const Desc& plan, const Operands& operands);

}  // namespace fdnn_cudnn
