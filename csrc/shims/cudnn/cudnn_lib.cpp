#include "cudnn_lib.hpp"

#include <cuda_runtime_api.h>  // CUDART_VERSION: the CUDA major of the companions
#include <dlfcn.h>

#include <mutex>
#include <string>
#include <vector>

#include "shim_common.hpp"

namespace fdnn_cudnn {
namespace {

// The cuDNN 9 soname. There is no unversioned libcudnn.so in NVIDIA's wheels, and a
// different major would be a different ABI.
constexpr const char* kCudnnSoname = "libcudnn.so.9";

// Directory of this shim library, to find the nvidia-cudnn-cu* wheel installed beside it.
std::string shim_directory() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&shim_directory), &info) == 0 || !info.dli_fname)
    return {};
  std::string path = info.dli_fname;
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string(".") : path.substr(0, slash);
}

// Where libcudnn.so.9 may be, best first:
//  1. by soname: already loaded by the Python package's preload, or on the system path;
//  2. the nvidia-cudnn-cu* wheel in the same site-packages as this shim
//     (site-packages/flux_dnn_cuda13/ -> site-packages/nvidia/cudnn/lib/).
void* open_cudnn(std::string* tried) {
  if (void* h = dlopen(kCudnnSoname, RTLD_NOW | RTLD_GLOBAL)) return h;
  *tried = dlerror();
  std::string beside = shim_directory() + "/../nvidia/cudnn/lib/" + kCudnnSoname;
  if (void* h = dlopen(beside.c_str(), RTLD_NOW | RTLD_GLOBAL)) return h;
  *tried += "; " + std::string(dlerror());
  return nullptr;
}

// cuDNN dlopens cuBLASLt and NVRTC by soname when an engine needs them (matmul-based and
// runtime-compiled engines); without them those engines are silently missing. NVIDIA's
// wheels (dependencies of nvidia-cudnn-cu*) put them beside cuDNN's own, off the library
// path: loaded here globally first, cuDNN's dlopen finds them. Absent wheels are fine
// (a system CUDA on the library path serves, or those engines stay unavailable).
void preload_companions() {
  const std::string major = std::to_string(CUDART_VERSION / 1000);
  const std::string site = shim_directory() + "/../nvidia/";
  struct Companion {
    std::string soname;
    std::vector<std::string> dirs;  // under site-packages/nvidia/: CUDA 13 wheels, then 12's
  };
  const Companion companions[] = {
      {"libcublasLt.so." + major, {"cu" + major + "/lib/", "cublas/lib/"}},
      {"libnvrtc.so." + major, {"cu" + major + "/lib/", "cuda_nvrtc/lib/"}},
  };
  for (const Companion& c : companions) {
    if (void* h = dlopen(c.soname.c_str(), RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD)) {
      dlclose(h);  // already loaded (the Python package's preload, or the array library)
      continue;
    }
    for (const std::string& dir : c.dirs)
      if (dlopen((site + dir + c.soname).c_str(), RTLD_NOW | RTLD_GLOBAL) != nullptr) break;
  }
  dlerror();  // a missing companion is not an error of ours
}

template <class Fn>
bool bind(void* lib, const char* name, Fn* slot, std::string* missing) {
  *slot = reinterpret_cast<Fn>(dlsym(lib, name));
  if (*slot == nullptr) *missing += std::string(missing->empty() ? "" : ", ") + name;
  return *slot != nullptr;
}

bool bind_all(void* lib, CudnnLib* t, std::string* missing) {
  bool ok = true;
  ok &= bind(lib, "cudnnGetVersion", &t->GetVersion, missing);
  ok &= bind(lib, "cudnnGetErrorString", &t->GetErrorString, missing);
  ok &= bind(lib, "cudnnGetLastErrorString", &t->GetLastErrorString, missing);
  ok &= bind(lib, "cudnnCreate", &t->Create, missing);
  ok &= bind(lib, "cudnnDestroy", &t->Destroy, missing);
  ok &= bind(lib, "cudnnSetStream", &t->SetStream, missing);
  ok &= bind(lib, "cudnnBackendCreateDescriptor", &t->BackendCreateDescriptor, missing);
  ok &= bind(lib, "cudnnBackendDestroyDescriptor", &t->BackendDestroyDescriptor, missing);
  ok &= bind(lib, "cudnnBackendSetAttribute", &t->BackendSetAttribute, missing);
  ok &= bind(lib, "cudnnBackendGetAttribute", &t->BackendGetAttribute, missing);
  ok &= bind(lib, "cudnnBackendFinalize", &t->BackendFinalize, missing);
  ok &= bind(lib, "cudnnBackendExecute", &t->BackendExecute, missing);
  return ok;
}

struct Loaded {
  CudnnLib table{};
  bool ok = false;
  std::string why_not;
};

const Loaded& loaded() {
  static Loaded state;
  static std::once_flag once;
  std::call_once(once, [] {
    std::string tried;
    void* lib = open_cudnn(&tried);
    if (lib == nullptr) {
      state.why_not = "cuDNN 9 not found (install nvidia-cudnn-cu13, or put libcudnn.so.9 on "
                      "the library path); tried " + tried;
      return;
    }
    preload_companions();
    // The library stays loaded for the life of the process: plans and handles refer to it.
    std::string missing;
    if (!bind_all(lib, &state.table, &missing)) {
      state.why_not = "libcudnn.so.9 lacks " + missing + " (cuDNN older than 9.0?)";
      return;
    }
    state.ok = true;
  });
  return state;
}

}  // namespace

const CudnnLib* load_cudnn(std::string* why_not) {
  const Loaded& s = loaded();
  if (!s.ok && why_not) *why_not = s.why_not;
  return s.ok ? &s.table : nullptr;
}

const CudnnLib& cudnn() {
  const Loaded& s = loaded();
  if (!s.ok) fdnn_shim::fail(FDNN_ERROR_UNAVAILABLE, "%s", s.why_not.c_str());
  return s.table;
}

std::string cudnn_version_text(size_t v) {
  // cuDNN 9 encodes MAJOR*10000 + MINOR*100 + PATCH.
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100);
}

std::string cudnn_status_text(cudnnStatus_t status) {
  const CudnnLib& lib = cudnn();
  std::string text = lib.GetErrorString(status);
  text += " (" + std::to_string(static_cast<int>(status)) + ")";
  char last[512] = {0};
  lib.GetLastErrorString(last, sizeof last);
  if (last[0] != '\0') text += ": " + std::string(last);
  return text;
}

void fail_cudnn(cudnnStatus_t status, const char* call) {
  int32_t code = FDNN_ERROR_VENDOR;
  if (status == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED ||
      status == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED)
    code = FDNN_ERROR_OUT_OF_MEMORY;
  fdnn_shim::fail(code, "cuDNN %s failed: %s", call, cudnn_status_text(status).c_str());
}

}  // namespace fdnn_cudnn
