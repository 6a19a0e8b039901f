#include "handle_pool.hpp"

#include <map>
#include <mutex>
#include <vector>

namespace fdnn_cudnn {
namespace {

class HandlePool {
 public:
  cudnnHandle_t acquire(int device) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      std::vector<cudnnHandle_t>& spare = spare_[device];
      if (!spare.empty()) {
        cudnnHandle_t h = spare.back();
        spare.pop_back();
        return h;
      }
    }
    cudnnHandle_t h = nullptr;
    check_cudnn(cudnn().Create(&h), "cudnnCreate");
    return h;
  }

  void release(int device, cudnnHandle_t h) {
    std::lock_guard<std::mutex> lock(mutex_);
    spare_[device].push_back(h);
  }

 private:
  std::mutex mutex_;
  std::map<int, std::vector<cudnnHandle_t>> spare_;
};

// Never destroyed: thread exits during static destruction still find it.
HandlePool& pool() {
  static HandlePool* p = new HandlePool;
  return *p;
}

struct Leased {
  cudnnHandle_t handle = nullptr;
  cudaStream_t stream = nullptr;  // what cudnnSetStream was last told
};

// This thread's handles; returned to the pool when the thread ends.
class ThreadHandles {
 public:
  ~ThreadHandles() {
    for (auto& [device, leased] : by_device_) pool().release(device, leased.handle);
  }

  cudnnHandle_t get(int device, cudaStream_t stream) {
    auto it = by_device_.find(device);
    if (it == by_device_.end()) {
      Leased fresh;
      fresh.handle = pool().acquire(device);
      check_cudnn(cudnn().SetStream(fresh.handle, stream), "cudnnSetStream");
      fresh.stream = stream;
      by_device_.emplace(device, fresh);
      return fresh.handle;
    }
    Leased& leased = it->second;
    if (leased.stream != stream) {  // skip the call when the stream is unchanged
      check_cudnn(cudnn().SetStream(leased.handle, stream), "cudnnSetStream");
      leased.stream = stream;
    }
    return leased.handle;
  }

 private:
  std::map<int, Leased> by_device_;
};

}  // namespace

cudnnHandle_t thread_handle(int device, cudaStream_t stream) {
  thread_local ThreadHandles handles;
  return handles.get(device, stream);
}

}  // namespace fdnn_cudnn
