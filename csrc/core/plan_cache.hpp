// One bounded LRU of vendor plans for all shims. A key is the bytes of everything a plan
// depends on (shim, device, op, shapes, strides, dtypes, parameters, flags); a hit costs a
// hash and a list splice, never a vendor call.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "flux_dnn/flux_dnn.h"

namespace fdnn_core {

class ShimLibrary;

// A vendor plan and what its creation reported. Destroyed (through its shim) when the last
// holder lets go, so eviction never pulls a plan from under a call that is executing it.
struct Plan {
  Plan(const ShimLibrary* shim, const FDNN_Conv_Plan_Create_Args& created);
  ~Plan();
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;

  const ShimLibrary* shim;
  FDNN_Plan* handle;
  size_t workspace_size;
  int64_t algo_id;
  std::string algo_name;
};

struct PlanCacheStats {
  uint64_t hits = 0, misses = 0, evictions = 0;
  size_t size = 0, capacity = 0;
};

class PlanCache {
 public:
  explicit PlanCache(size_t capacity) : capacity_(capacity) {}

  std::shared_ptr<Plan> find(const std::string& key);  // counts a hit or a miss
  // Inserts `plan` unless another thread got there first; returns the plan to use.
  std::shared_ptr<Plan> insert(const std::string& key, std::shared_ptr<Plan> plan);
  void set_capacity(size_t capacity);
  void clear();
  PlanCacheStats stats();

 private:
  void evict_to(size_t size);  // caller holds mutex_
  using Entry = std::pair<std::string, std::shared_ptr<Plan>>;
  std::mutex mutex_;
  std::list<Entry> lru_;  // most recent first
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
  size_t capacity_;
  PlanCacheStats counts_;
};

PlanCache& plan_cache();

}  // namespace fdnn_core
