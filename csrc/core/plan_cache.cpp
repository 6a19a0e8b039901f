#include "plan_cache.hpp"

#include "shim_library.hpp"

namespace fdnn_core {

Plan::Plan(const ShimLibrary* owner, const FDNN_Conv_Plan_Create_Args& created)
    : shim(owner),
      handle(created.plan),
      workspace_size(created.workspace_size),
      algo_id(created.chosen_algo_id),
      algo_name(created.algo_name ? created.algo_name : "") {}

Plan::~Plan() {
  FDNN_Plan_Destroy_Args args{FDNN_Plan_Destroy_Args_STRUCT_SIZE, handle};
  shim->api().Plan_Destroy(&args);
}

std::shared_ptr<Plan> PlanCache::find(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = index_.find(key);
  if (it == index_.end()) {
    ++counts_.misses;
    return nullptr;
  }
  ++counts_.hits;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->second;
}

std::shared_ptr<Plan> PlanCache::insert(const std::string& key, std::shared_ptr<Plan> plan) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = index_.find(key);
  if (it != index_.end()) return it->second->second;
  if (capacity_ == 0) return plan;  // caching off: the caller's copy is the only one
  lru_.emplace_front(key, plan);
  index_[key] = lru_.begin();
  evict_to(capacity_);
  return plan;
}

void PlanCache::evict_to(size_t size) {
  while (lru_.size() > size) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
    ++counts_.evictions;
  }
}

void PlanCache::set_capacity(size_t capacity) {
  std::lock_guard<std::mutex> lock(mutex_);
  capacity_ = capacity;
  evict_to(capacity_);
}

void PlanCache::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  lru_.clear();
  index_.clear();
}

PlanCacheStats PlanCache::stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  PlanCacheStats s = counts_;
  s.size = lru_.size();
  s.capacity = capacity_;
  return s;
}

PlanCache& plan_cache() {
  static auto* cache = new PlanCache(512);  // never destroyed: shims outlive interpreter exit
  return *cache;
}

}  // namespace fdnn_core
