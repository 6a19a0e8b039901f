// Test double of the HIP runtime (libamdhip64.so.6) for the MIOpen shim: "device" memory is
// host memory, streams are NULL or opaque values never dereferenced, work runs at once.
// FLUX_DNN_HIP_DOUBLE_DEVICES=0 makes it report no device (the shim's "no AMD GPU" path).
// It checks the shim's plumbing; it says nothing about AMD GPUs.
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "miopen_api.hpp"

#define EXPORT extern "C" __attribute__((visibility("default")))

namespace {
thread_local int current_device = 0;
int device_count() {
  const char* v = std::getenv("FLUX_DNN_HIP_DOUBLE_DEVICES");
  return v && *v ? std::atoi(v) : 1;
}
struct Event {
  std::chrono::steady_clock::time_point at;
};
}  // namespace

EXPORT hipError_t hipGetDeviceCount(int* count) {
  *count = device_count();
  return *count == 0 ? hipErrorNoDevice : hipSuccess;
}
EXPORT hipError_t hipGetDevice(int* device) {
  *device = current_device;
  return hipSuccess;
}
EXPORT hipError_t hipSetDevice(int device) {
  if (device < 0 || device >= device_count()) return 101;  // hipErrorInvalidDevice
  current_device = device;
  return hipSuccess;
}
EXPORT hipError_t hipDeviceGetName(char* name, int len, int device) {
  if (device < 0 || device >= device_count() || len <= 0) return 101;
  std::strncpy(name, "flux_dnn MIOpen test double (host memory)", static_cast<size_t>(len) - 1);
  name[len - 1] = 0;
  return hipSuccess;
}
EXPORT const char* hipGetErrorString(hipError_t e) {
  return e == hipSuccess ? "hipSuccess" : e == hipErrorNoDevice ? "hipErrorNoDevice" : "hipError";
}
EXPORT hipError_t hipMalloc(void** ptr, size_t size) {
  *ptr = std::aligned_alloc(256, (size + 255) / 256 * 256);
  return *ptr ? hipSuccess : 2;  // hipErrorOutOfMemory
}
EXPORT hipError_t hipFree(void* ptr) {
  std::free(ptr);
  return hipSuccess;
}
EXPORT hipError_t hipMemsetAsync(void* dst, int value, size_t size, hipStream_t) {
  std::memset(dst, value, size);
  return hipSuccess;
}
EXPORT hipError_t hipEventCreate(hipEvent_t* event) {
  *event = reinterpret_cast<hipEvent_t>(new Event());
  return hipSuccess;
}
EXPORT hipError_t hipEventRecord(hipEvent_t event, hipStream_t) {
  reinterpret_cast<Event*>(event)->at = std::chrono::steady_clock::now();
  return hipSuccess;
}
EXPORT hipError_t hipEventSynchronize(hipEvent_t) { return hipSuccess; }
EXPORT hipError_t hipEventElapsedTime(float* ms, hipEvent_t start, hipEvent_t stop) {
  auto d = reinterpret_cast<Event*>(stop)->at - reinterpret_cast<Event*>(start)->at;
  *ms = std::chrono::duration<float, std::milli>(d).count();
  return hipSuccess;
}
EXPORT hipError_t hipEventDestroy(hipEvent_t event) {
  delete reinterpret_cast<Event*>(event);
  return hipSuccess;
}
EXPORT hipError_t hipStreamSynchronize(hipStream_t) { return hipSuccess; }
