// The CUDA side of the shim: is there a driver and a device, what is each device called,
// and small RAII helpers (current device, device memory, events). Uses the CUDA runtime,
// linked statically, so the wheel needs no CUDA runtime wheel; the runtime loads the driver
// (libcuda.so.1) lazily and reports a missing one as an error code, never an abort.
#pragma once

#include <cuda_runtime_api.h>

#include "flux_dnn/flux_dnn.h"

#include <cstddef>
#include <string>
#include <vector>

namespace fdnn_cudnn {

struct CudaDevices {
  int count = 0;
  std::string why_not;             // empty when count > 0
  std::vector<std::string> names;  // "NVIDIA H200 (sm_90)", one per device
  std::vector<int> compute_capability;  // 90 for sm_90, one per device
};

// Probed once (thread-safe): driver present, runtime usable, devices and their names.
const CudaDevices& cuda_devices();

// Throws Failure(VENDOR, or OUT_OF_MEMORY) naming `call` and the CUDA error text.
void check_cuda(cudaError_t status, const char* call);

// Makes `device` current for this thread for the guard's life, then puts back exactly the
// context that was current before (the array libraries keep their own notion of the current
// device). Restoring through the driver, not cudaSetDevice, never creates a context on a
// device the caller did not use (e.g. device 0 of a multi-GPU node).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  bool restore_ = false;
  void* saved_context_ = nullptr;  // CUcontext
};

// Device memory owned for a scope (benchmark scratch), filled with small finite non-zero
// values (launch_fill_pattern: zeros flatter some engines' timings), allocated and freed in
// `stream`'s order: from the caller's allocator when it chained one (ABI 2.2, the array
// library's pool), else cudaMallocAsync (no device-wide synchronisation as cudaMalloc/cudaFree
// have). Throws Failure(OUT_OF_MEMORY) when the allocator or the device refuses.
class DeviceBuffer {
 public:
  DeviceBuffer(size_t bytes, cudaStream_t stream, const FDNN_Device_Allocator* from = nullptr);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }

 private:
  void release();
  void* ptr_ = nullptr;
  cudaStream_t stream_ = nullptr;
  const FDNN_Device_Allocator* from_ = nullptr;
};

class Event {
 public:
  Event();
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

}  // namespace fdnn_cudnn
