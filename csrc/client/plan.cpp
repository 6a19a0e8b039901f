#include "client/plan.hpp"

#include <algorithm>
#include <cstdlib>
#include <new>

#include "client/autotune.hpp"
#include "client/error.hpp"
#include "client/shim.hpp"

namespace fdnn_client {

namespace {

template <class T>
void append(std::string& key, const T& value) {
  key.append(reinterpret_cast<const char*>(&value), sizeof value);
}

}  // namespace

uint8_t data_alignment(const FDNN_DLTensor& t) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(t.data) + t.byte_offset;
  uint8_t alignment = 16;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

void append_params(std::string& key, const ConvParams& p) {
  append(key, p.op);
  append(key, p.spatial_rank);
  append(key, p.stride);
  append(key, p.dilation);
  append(key, p.padding_lo);
  append(key, p.padding_hi);
  append(key, p.groups);
  append(key, p.alpha);
  append(key, p.beta);
  append(key, p.activation);
  append(key, p.activation_alpha);
  append(key, p.activation_beta);
  append(key, p.flags);
  append(key, p.algo_policy);
  append(key, p.algo_id);
  append(key, p.workspace_limit);
}

void append_tensor(std::string& key, const FDNN_DLTensor& t) {
  const size_t dims_bytes = sizeof(int64_t) * static_cast<size_t>(std::max(t.ndim, 0));
  append(key, t.ndim);
  append(key, t.dtype);
  key.append(reinterpret_cast<const char*>(t.shape), dims_bytes);
  key.append(reinterpret_cast<const char*>(t.strides), dims_bytes);
  append(key, data_alignment(t));
}

void write_plan_key(std::string& key, const Shim& shim, int32_t device_id,
                    std::string_view params_key, const FDNN_DLTensor& x, const FDNN_DLTensor& w,
                    const FDNN_DLTensor& y, const FDNN_DLTensor* bias) {
  key.clear();
  append(key, &shim);
  append(key, device_id);
  key.append(params_key);
  append_tensor(key, x);
  append_tensor(key, w);
  append_tensor(key, y);
  if (bias != nullptr) append_tensor(key, *bias);
}

FDNN_Conv_Plan_Create_Args plan_create_args(const ConvParams& p, const FDNN_DLTensor& x,
                                            const FDNN_DLTensor& w, const FDNN_DLTensor& y,
                                            const FDNN_DLTensor* bias, void* stream) {
  static const FDNN_DLTensor no_tensor{};  // ndim 0: no bias
  FDNN_Conv_Plan_Create_Args a{};
  a.struct_size = FDNN_Conv_Plan_Create_Args_STRUCT_SIZE;
  a.op = p.op;
  a.spatial_rank = p.spatial_rank;
  a.x = &x;
  a.w = &w;
  a.y = &y;
  a.bias = bias != nullptr ? bias : &no_tensor;
  for (int i = 0; i < FDNN_MAX_SPATIAL_DIMS; ++i) {
    a.stride[i] = p.stride[i];
    a.dilation[i] = p.dilation[i];
    a.padding_lo[i] = p.padding_lo[i];
    a.padding_hi[i] = p.padding_hi[i];
  }
  a.groups = p.groups;
  a.alpha = p.alpha;
  a.beta = p.beta;
  a.activation = p.activation;
  a.activation_alpha = p.activation_alpha;
  a.activation_beta = p.activation_beta;
  a.flags = p.flags;
  a.algo_policy = p.algo_policy;
  a.algo_id = p.algo_id;
  a.workspace_limit = p.workspace_limit;
  a.stream = stream;
  return a;
}

// --- Plans --------------------------------------------------------------------------------

Plan::Plan(const Shim& owner, FDNN_Plan* plan, size_t workspace, int64_t algo, std::string name)
    : shim(owner), handle(plan), workspace_size(workspace), algo_id(algo), algo_name(std::move(name)) {}

Plan::~Plan() {
  FDNN_Plan_Destroy_Args args{};
  args.struct_size = FDNN_Plan_Destroy_Args_STRUCT_SIZE;
  args.plan = handle;
  shim.api().Plan_Destroy(&args);
}

namespace {

// The part of a plan key that names the same problem in another process (no pointer), with
// what makes an algorithm id meaningful: shim, vendor version, device.
std::string autotune_key(const Shim& shim, std::string_view key, int32_t device_id) {
  const FDNN_Shim_Info_Args info = shim.info();
  const FDNN_Device_Describe_Args device = shim.describe_device(device_id);
  std::string tune_key = shim.name() + '|' +
                         (info.vendor_version_runtime ? info.vendor_version_runtime : "") + '|' +
                         (device.name ? device.name : "") + '|';
  tune_key.append(key.substr(std::min(key.size(), sizeof(const Shim*))));
  return tune_key;
}

}  // namespace

std::shared_ptr<Plan> create_plan(const Shim& shim, FDNN_Conv_Plan_Create_Args& a,
                                  std::string_view key) {
  const int32_t asked_policy = a.algo_policy;
  const int64_t asked_id = a.algo_id;
  std::string tune_key;
  if (asked_policy == FDNN_ALGO_BENCHMARK) {
    tune_key = autotune_key(shim, key, a.x->device.device_id);
    if (auto known = autotune_store().lookup(tune_key)) {
      a.algo_policy = FDNN_ALGO_GIVEN;
      a.algo_id = *known;
    }
  }
  FDNN_Error* error = shim.api().Conv_Plan_Create(&a);
  if (error != nullptr && !tune_key.empty() && a.algo_policy == FDNN_ALGO_GIVEN) {
    // A remembered choice this shim no longer accepts (another vendor build, say): search again.
    shim.discard(error);
    warn("flux_dnn: an autotune entry no longer fits shim '" + shim.name() +
         "'; benchmarking this convolution again");
    a.algo_policy = asked_policy;
    a.algo_id = asked_id;
    error = shim.api().Conv_Plan_Create(&a);
  }
  shim.check(error, "creating a plan");
  auto plan = std::make_shared<Plan>(shim, a.plan, a.workspace_size, a.chosen_algo_id,
                                     a.algo_name ? a.algo_name : "");
  if (!tune_key.empty() && a.algo_policy == FDNN_ALGO_BENCHMARK)
    autotune_store().record(tune_key, plan->algo_id);
  return plan;
}

void execute_plan(const Plan& plan, FDNN_Conv_Plan_Execute_Args& args) {
  args.struct_size = FDNN_Conv_Plan_Execute_Args_STRUCT_SIZE;
  args.plan = plan.handle;
  if (FDNN_Error* error = plan.shim.api().Conv_Plan_Execute(&args)) {
    const std::string context = "executing " + plan.algo_name;
    plan.shim.raise(error, context.c_str());
  }
}

void* host_workspace(size_t bytes) {
  struct Buffer {
    void* data = nullptr;
    size_t size = 0;
    ~Buffer() { std::free(data); }
  };
  thread_local Buffer buffer;
  if (bytes > buffer.size) {
    const size_t rounded = (bytes + 63) / 64 * 64;  // aligned_alloc wants a multiple
    void* fresh = std::aligned_alloc(64, rounded);
    if (fresh == nullptr) throw std::bad_alloc();
    std::free(buffer.data);
    buffer.data = fresh;
    buffer.size = rounded;
  }
  return buffer.data;
}

// --- The cache ----------------------------------------------------------------------------

std::shared_ptr<Plan> PlanCache::find(std::string_view key) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = index_.find(key);
  if (it == index_.end()) {
    ++counts_.misses;
    return nullptr;
  }
  ++counts_.hits;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->plan;
}

std::shared_ptr<Plan> PlanCache::insert(std::string_view key, std::shared_ptr<Plan> plan) {
  List evicted;                    // let go of after the lock (declared first, destroyed last)
  std::shared_ptr<Plan> loser;     // our plan when another thread inserted first
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = index_.find(key);
  if (it != index_.end()) {
    loser = std::move(plan);
    return it->second->plan;
  }
  if (capacity_ == 0) return plan;  // caching off: the caller's copy is the only one
  lru_.push_front(Entry{std::string(key), plan});
  index_.emplace(lru_.front().key, lru_.begin());
  evict_to(capacity_, evicted);
  return plan;
}

void PlanCache::evict_to(size_t size, List& evicted) {
  while (lru_.size() > size) {
    index_.erase(lru_.back().key);
    evicted.splice(evicted.begin(), lru_, std::prev(lru_.end()));
    ++counts_.evictions;
  }
}

void PlanCache::set_capacity(size_t capacity) {
  List evicted;
  std::lock_guard<std::mutex> lock(mutex_);
  capacity_ = capacity;
  evict_to(capacity_, evicted);
}

void PlanCache::clear() {
  List evicted;
  std::lock_guard<std::mutex> lock(mutex_);
  index_.clear();
  evicted.splice(evicted.begin(), lru_);
}

PlanCacheStats PlanCache::stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  PlanCacheStats s = counts_;
  s.size = lru_.size();
  s.capacity = capacity_;
  return s;
}

PlanCache& plan_cache() {
  static auto* cache = new PlanCache(512);  // never destroyed: shims outlive exit
  return *cache;
}

}  // namespace fdnn_client
