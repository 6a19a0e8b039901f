// Convolution plans: what a plan depends on (ConvParams and the tensors' descriptors) written
// as a key, the vendor plan itself, and one bounded LRU cache of them per binary. A cache hit
// costs a hash and a list splice under a lock, never a vendor call and never an allocation.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "flux_dnn/flux_dnn.h"

namespace fdnn_client {

class Shim;

// Everything about a convolution but its tensors: the Conv_Plan_Create fields a caller sets.
struct ConvParams {
  int32_t op = FDNN_CONV_FORWARD;
  int32_t spatial_rank = 2;
  int64_t stride[FDNN_MAX_SPATIAL_DIMS] = {1, 1, 1};
  int64_t dilation[FDNN_MAX_SPATIAL_DIMS] = {1, 1, 1};
  int64_t padding_lo[FDNN_MAX_SPATIAL_DIMS] = {};
  int64_t padding_hi[FDNN_MAX_SPATIAL_DIMS] = {};
  int64_t groups = 1;
  float alpha = 1.f, beta = 0.f;
  int32_t activation = FDNN_ACTIVATION_NONE;
  float activation_alpha = 0.f, activation_beta = 0.f;
  uint32_t flags = 0;
  int32_t algo_policy = FDNN_ALGO_HEURISTIC;
  int64_t algo_id = 0;
  size_t workspace_limit = SIZE_MAX;
};

// --- Keys ---------------------------------------------------------------------------------
// A key is the bytes of everything a plan depends on, appended field by field (no padding
// bytes): shim, device id, params, then x, w, y and (when present) bias.

// The alignment of a tensor's first element (data + byte_offset), a power of two up to 16
// bytes: the header tells callers to key plans on it (shims may pick vectorised kernels).
uint8_t data_alignment(const FDNN_DLTensor& t);

void append_params(std::string& key, const ConvParams& p);
// ndim (int32), dtype (4 bytes), shape and strides (int64 each), data_alignment (1 byte).
void append_tensor(std::string& key, const FDNN_DLTensor& t);

// The plan key, written into `key` (cleared first; a caller keeps one per thread, so that a
// warm call allocates nothing). `params_key` is append_params' output for the call's params,
// which callers with fixed params compute once.
void write_plan_key(std::string& key, const Shim& shim, int32_t device_id,
                    std::string_view params_key, const FDNN_DLTensor& x, const FDNN_DLTensor& w,
                    const FDNN_DLTensor& y, const FDNN_DLTensor* bias);

// The Conv_Plan_Create arguments for params and descriptors (bias NULL: none).
FDNN_Conv_Plan_Create_Args plan_create_args(const ConvParams& p, const FDNN_DLTensor& x,
                                            const FDNN_DLTensor& w, const FDNN_DLTensor& y,
                                            const FDNN_DLTensor* bias, void* stream);

// --- Plans --------------------------------------------------------------------------------

// A vendor plan and what its creation reported. Destroyed (through its shim) when the last
// holder lets go, so eviction never pulls a plan from under a call that is executing it.
struct Plan {
  Plan(const Shim& shim, FDNN_Plan* handle, size_t workspace_size, int64_t algo_id,
       std::string algo_name);
  ~Plan();
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;

  const Shim& shim;
  FDNN_Plan* const handle;
  const size_t workspace_size;
  const int64_t algo_id;
  std::string algo_name;
};

// Creates a plan from `args` (every input field set). With FDNN_ALGO_BENCHMARK the autotune
// store is asked first for what an earlier benchmark of this problem chose (by `key` without
// its shim pointer, with the shim's name, vendor version and device name), and the choice
// of a new benchmark is recorded. Throws Error; may call warn().
std::shared_ptr<Plan> create_plan(const Shim& shim, FDNN_Conv_Plan_Create_Args& args,
                                  std::string_view key);

// Executes `plan`; throws Error naming the plan's algorithm.
void execute_plan(const Plan& plan, FDNN_Conv_Plan_Execute_Args& args);

// A host workspace of at least `bytes`, 64-byte aligned: this thread's grow-only buffer, so
// that a warm call allocates nothing. Valid until this thread's next call. Throws bad_alloc.
void* host_workspace(size_t bytes);

// --- The cache ----------------------------------------------------------------------------

struct PlanCacheStats {
  uint64_t hits = 0, misses = 0, evictions = 0;
  size_t size = 0, capacity = 0;
};

class PlanCache {
 public:
  explicit PlanCache(size_t capacity) : capacity_(capacity) {}

  std::shared_ptr<Plan> find(std::string_view key);  // counts a hit or a miss
  // Inserts `plan` unless another thread got there first; returns the plan to use.
  std::shared_ptr<Plan> insert(std::string_view key, std::shared_ptr<Plan> plan);
  void set_capacity(size_t capacity);
  void clear();
  PlanCacheStats stats();

 private:
  struct Entry {
    std::string key;
    std::shared_ptr<Plan> plan;
  };
  using List = std::list<Entry>;
  // Moves the least recent entries beyond `size` into `evicted`, whose plans the caller lets
  // go of after unlocking: a vendor Plan_Destroy never runs under the cache's lock.
  void evict_to(size_t size, List& evicted);  // caller holds mutex_

  std::mutex mutex_;
  List lru_;  // most recent first
  std::unordered_map<std::string_view, List::iterator> index_;  // views of the entries' keys
  size_t capacity_;
  PlanCacheStats counts_;
};

// The cache of this binary (_core and the XLA FFI handler each have one).
PlanCache& plan_cache();

}  // namespace fdnn_client
