// Choosing how cuDNN runs a graph: the candidate engine configurations (cuDNN's heuristic
// list, then its fallback list), filtered by the caller's flags (deterministic, reduced
// precision) and workspace budget, picked by heuristic order, by timing (benchmark), or by
// an id returned earlier (given). The id is stable for one cuDNN version, device and
// problem: (engine global index << 16) | position in the candidate list, so a stale id from
// another cuDNN is recognised instead of silently running something else.
#pragma once

#include <string>

#include "conv_graph.hpp"

namespace fdnn_cudnn {

struct EngineRequest {
  FDNN_AlgoPolicy policy = FDNN_ALGO_HEURISTIC;
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

// Runs a finalized plan; pointers in x, w, y role order (see conv_graph.hpp).
cudnnStatus_t run_plan(cudnnHandle_t handle, const Desc& plan, void* x, void* w, void* y,
                       void* workspace);

}  // namespace fdnn_cudnn
