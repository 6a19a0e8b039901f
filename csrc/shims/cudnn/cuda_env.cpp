#include "cuda_env.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <utility>

#include "epilogue.hpp"
#include "shim_common.hpp"

namespace fdnn_cudnn {
namespace {

bool driver_library_present() {
  // Asking the runtime would say "insufficient driver" for a missing driver too; looking
  // for the library first lets the message say what is actually wrong.
  void* h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (h != nullptr) dlclose(h);
  return h != nullptr;
}

std::string cuda_version_text(int v) {  // 13000 -> "13.0"
  return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

std::string no_device_reason() {
  std::string why = "NVIDIA driver found but no CUDA device is visible";
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES"))
    why += std::string(" (CUDA_VISIBLE_DEVICES=\"") + visible + "\")";
  return why;
}

std::string runtime_failure_reason(cudaError_t status) {
  if (status == cudaErrorNoDevice) return no_device_reason();
  if (status == cudaErrorInsufficientDriver) {
    int driver = 0;
    cudaDriverGetVersion(&driver);
    return "the NVIDIA driver is too old: it supports CUDA " + cuda_version_text(driver) +
           ", this shim needs CUDA " + cuda_version_text(CUDART_VERSION) +
           " or newer (update the driver, or install the flux-dnn wheel for the older CUDA)";
  }
  return std::string("the CUDA runtime cannot start: ") + cudaGetErrorName(status) + ": " +
         cudaGetErrorString(status);
}

// The device's name ("NVIDIA H200 (sm_90)") and compute capability (90); 0 when unknown.
std::pair<std::string, int> device_identity(int device) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) return {"CUDA device", 0};
  return {std::string(prop.name) + " (sm_" + std::to_string(prop.major) +
              std::to_string(prop.minor) + ")",
          prop.major * 10 + prop.minor};
}

CudaDevices probe() {
  CudaDevices d;
  if (!driver_library_present()) {
    d.why_not = "no NVIDIA driver found (libcuda.so.1 missing)";
    return d;
  }
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    d.why_not = runtime_failure_reason(status);
    return d;
  }
  if (count == 0) {
    d.why_not = no_device_reason();
    return d;
  }
  d.count = count;
  for (int i = 0; i < count; ++i) {
    auto [name, cc] = device_identity(i);
    d.names.push_back(name);
    d.compute_capability.push_back(cc);
  }
  return d;
}

}  // namespace

const CudaDevices& cuda_devices() {
  static CudaDevices devices;
  static std::once_flag once;
  std::call_once(once, [] { devices = probe(); });
  return devices;
}

void check_cuda(cudaError_t status, const char* call) {
  if (status == cudaSuccess) return;
  int32_t code =
      status == cudaErrorMemoryAllocation ? FDNN_ERROR_OUT_OF_MEMORY : FDNN_ERROR_VENDOR;
  fdnn_shim::fail(code, "CUDA %s failed: %s: %s", call, cudaGetErrorName(status),
                  cudaGetErrorString(status));
}

namespace {

// Two driver functions, looked up in the driver the runtime has loaded already.
struct DriverContextApi {
  using GetCurrent = int (*)(void** context);
  using SetCurrent = int (*)(void* context);
  GetCurrent get_current = nullptr;
  SetCurrent set_current = nullptr;
};

const DriverContextApi& driver_context_api() {
  static const DriverContextApi api = [] {
    DriverContextApi a;
    if (void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL)) {  // kept open
      a.get_current = reinterpret_cast<DriverContextApi::GetCurrent>(dlsym(lib, "cuCtxGetCurrent"));
      a.set_current = reinterpret_cast<DriverContextApi::SetCurrent>(dlsym(lib, "cuCtxSetCurrent"));
    }
    return a;
  }();
  return api;
}

}  // namespace

DeviceGuard::DeviceGuard(int device) {
  const DriverContextApi& driver = driver_context_api();
  if (driver.get_current == nullptr || driver.get_current(&saved_context_) != 0)
    saved_context_ = nullptr;
  int current = -1;
  check_cuda(cudaGetDevice(&current), "cudaGetDevice");
  if (saved_context_ != nullptr && current == device) return;  // already there
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  restore_ = driver.set_current != nullptr;
}

DeviceGuard::~DeviceGuard() {
  if (restore_) driver_context_api().set_current(saved_context_);
}

DeviceBuffer::DeviceBuffer(size_t bytes, cudaStream_t stream, const FDNN_Device_Allocator* from)
    : stream_(stream), from_(from) {
  if (bytes == 0) return;
  if (from_ != nullptr) {
    ptr_ = from_->allocate(from_->context, bytes, stream);
    if (ptr_ == nullptr)
      fdnn_shim::fail(FDNN_ERROR_OUT_OF_MEMORY,
                      "cudnn: the caller's allocator refused %zu bytes of benchmark scratch",
                      bytes);
  } else {
    check_cuda(cudaMallocAsync(&ptr_, bytes, stream), "cudaMallocAsync (benchmark scratch)");
  }
  cudaError_t status = launch_fill_pattern(ptr_, bytes, stream);
  if (status != cudaSuccess) {
    release();
    check_cuda(status, "launch of the benchmark scratch fill");
  }
}

void DeviceBuffer::release() {
  if (ptr_ == nullptr) return;
  if (from_ != nullptr)
    from_->release(from_->context, ptr_, stream_);
  else
    cudaFreeAsync(ptr_, stream_);
  ptr_ = nullptr;
}

DeviceBuffer::~DeviceBuffer() { release(); }

Event::Event() { check_cuda(cudaEventCreate(&event_), "cudaEventCreate"); }

Event::~Event() {
  if (event_ != nullptr) cudaEventDestroy(event_);
}

}  // namespace fdnn_cudnn
