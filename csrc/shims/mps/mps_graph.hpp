// The MPS shim's Objective-C++ side: one plan is one compiled MPSGraphExecutable, with the
// plan's own MPSNDArrays for tensors that are staged (see fdnn_mps::Binding). Declared here
// for mps_shim.mm; built only on Apple platforms (and syntax-checked on Linux, .ci/mps.sh).
#pragma once

#import <Foundation/Foundation.h>
#import <Metal/Metal.h>
#import <MetalPerformanceShaders/MetalPerformanceShaders.h>
#import <MetalPerformanceShadersGraph/MetalPerformanceShadersGraph.h>

#include <mutex>
#include <string>
#include <vector>

#include "mps_problem.hpp"

namespace fdnn_mps {

// What each tensor the executable reads or writes stands for, in the executable's order.
enum class Role : int {
  kX,         // x (input of FORWARD and BACKWARD_WEIGHT; read as the old dx when beta != 0)
  kW,         // w
  kY,         // y: dy on the backwards, the old y on FORWARD
  kBias,      // bias (FORWARD), the old db (BACKWARD_WEIGHT)
  kNumRoles,
};

struct GraphTensorRole {
  MPSGraphTensor* tensor;
  Role role;
};

// The Metal device and the shim's own command queue (used when the caller passes none).
struct MetalEnv {
  id<MTLDevice> device = nil;
  id<MTLCommandQueue> queue = nil;
  OsVersion os;
  std::string device_name;      // "Apple M2 Pro"
  std::string os_text;          // "macOS 15.1"
  std::string unavailable;      // why the shim cannot run here; empty when it can
  const char* reason() const { return unavailable.empty() ? nullptr : unavailable.c_str(); }
};

// Initialised on first use, thread-safe; never fails (unavailable says why not).
const MetalEnv& metal_env();

struct MpsPlan {
  ProblemPlan problem;
  MPSGraph* graph = nil;
  // (macOS 12+ in Apple's header: set and used only by build_plan and run_plan, macOS 13+)
  MPSGraphExecutable* executable API_AVAILABLE(macos(12.0)) = nil;
  std::vector<GraphTensorRole> feeds;    // in executable.feedTensors order
  std::vector<GraphTensorRole> results;  // in executable.targetTensors order
  std::string algo_name;
  // Staged tensors go through these MPSNDArrays, one per role and direction, made on first
  // need. `staging_mutex` makes executes of one plan take turns with them (each call waits
  // for its command buffer, so a turn is one call).
  std::mutex staging_mutex;
  MPSNDArray* staged_in[static_cast<int>(Role::kNumRoles)] = {};
  MPSNDArray* staged_out[static_cast<int>(Role::kNumRoles)] = {};
};

// Builds and compiles the graph of `problem` (macOS 13+).
void build_plan(MpsPlan& plan) API_AVAILABLE(macos(13.0));

// Runs a plan on the caller's buffers with their byte offsets; returns when the GPU is done.
struct Buffers {
  id<MTLBuffer> buffer[static_cast<int>(Role::kNumRoles)];
  uint64_t offset[static_cast<int>(Role::kNumRoles)];
};
void run_plan(MpsPlan& plan, const Buffers& buffers, id<MTLCommandQueue> queue)
    API_AVAILABLE(macos(13.0));

}  // namespace fdnn_mps
