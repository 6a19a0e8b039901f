// Finding libMIOpen.so.1 and the HIP runtime at run time.
//
// MIOpen, in this order: a libMIOpen.so.1 already loaded in the process (PyTorch's: a second
// MIOpen would bring a second HIP runtime); the path in FLUX_DNN_MIOPEN_LIBRARY (the Python
// package sets it to the copy inside an installed PyTorch ROCm wheel); $ROCM_PATH/lib;
// /opt/rocm/lib; the dynamic linker's search path. The HIP runtime: the one MIOpen itself is
// linked to (symbols looked up through MIOpen's handle), so the shim and MIOpen share one.
// More than one libamdhip64 mapped in the process (two runtimes: arrays of one handed to the
// other) makes the shim unavailable, with the paths.
#include "miopen_lib.hpp"

#include <dlfcn.h>
#include <link.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <set>
#include <vector>

namespace fdnn_miopen {
namespace {

constexpr const char* kSoname = "libMIOpen.so.1";

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::vector<std::string> miopen_candidates() {
  std::vector<std::string> paths;
  if (const char* given = std::getenv("FLUX_DNN_MIOPEN_LIBRARY"); given && *given)
    paths.emplace_back(given);
  if (const char* rocm = std::getenv("ROCM_PATH"); rocm && *rocm)
    paths.push_back(std::string(rocm) + "/lib/" + kSoname);
  paths.push_back(std::string("/opt/rocm/lib/") + kSoname);
  return paths;
}

// The file a loaded library came from (dladdr on one of its functions).
std::string file_of(void* lib, const char* symbol) {
  Dl_info info{};
  void* fn = ::dlsym(lib, symbol);
  if (fn != nullptr && ::dladdr(fn, &info) != 0 && info.dli_fname != nullptr) return info.dli_fname;
  return "";
}

// The already-loaded copy first, then the candidates, then the search path.
void* open_miopen(std::string* path, std::string* tried) {
  if (void* h = ::dlopen(kSoname, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD)) {
    *path = file_of(h, "miopenGetVersion") + " (already loaded)";
    return h;
  }
  std::vector<std::string> paths = miopen_candidates();
  for (const std::string& p : paths) {
    if (!exists(p)) {
      *tried += "\n  " + p + ": not there";
      continue;
    }
    if (void* h = ::dlopen(p.c_str(), RTLD_NOW | RTLD_GLOBAL)) {
      *path = p;
      return h;
    }
    *tried += "\n  " + p + ": " + ::dlerror();
  }
  if (void* h = ::dlopen(kSoname, RTLD_NOW | RTLD_GLOBAL)) {
    *path = file_of(h, "miopenGetVersion");
    return h;
  }
  *tried += std::string("\n  ") + kSoname + " on the library path: " + ::dlerror();
  return nullptr;
}

// Every libamdhip64 mapped in the process, by file.
std::set<std::string> hip_runtimes() {
  std::set<std::string> found;
  ::dl_iterate_phdr(
      [](struct dl_phdr_info* info, size_t, void* out) {
        const std::string name = info->dlpi_name ? info->dlpi_name : "";
        const size_t slash = name.rfind('/');
        if (name.compare(slash == std::string::npos ? 0 : slash + 1, 11, "libamdhip64") == 0)
          static_cast<std::set<std::string>*>(out)->insert(name);
        return 0;
      },
      &found);
  return found;
}

template <class Fn>
void bind(void* lib, const char* name, Fn* slot, std::string* missing) {
  *slot = reinterpret_cast<Fn>(::dlsym(lib, name));
  if (*slot == nullptr) *missing += std::string(" ") + name;
}

void bind_hip(void* lib, Hip* h, std::string* missing) {
  bind(lib, "hipGetDeviceCount", &h->GetDeviceCount, missing);
  bind(lib, "hipGetDevice", &h->GetDevice, missing);
  bind(lib, "hipSetDevice", &h->SetDevice, missing);
  bind(lib, "hipDeviceGetName", &h->DeviceGetName, missing);
  bind(lib, "hipGetErrorString", &h->GetErrorString, missing);
  bind(lib, "hipMalloc", &h->Malloc, missing);
  bind(lib, "hipFree", &h->Free, missing);
  bind(lib, "hipMemsetAsync", &h->MemsetAsync, missing);
  bind(lib, "hipEventCreate", &h->EventCreate, missing);
  bind(lib, "hipEventRecord", &h->EventRecord, missing);
  bind(lib, "hipEventSynchronize", &h->EventSynchronize, missing);
  bind(lib, "hipEventElapsedTime", &h->EventElapsedTime, missing);
  bind(lib, "hipEventDestroy", &h->EventDestroy, missing);
  bind(lib, "hipStreamSynchronize", &h->StreamSynchronize, missing);
}

void bind_direction(void* lib, const char* prefix, Direction* d, std::string* missing) {
  std::string p = prefix;
  bind(lib, (p + "GetSolutionCount").c_str(), &d->GetSolutionCount, missing);
  bind(lib, (p + "GetSolution").c_str(), &d->GetSolution, missing);
  bind(lib, (p + "GetSolutionWorkspaceSize").c_str(), &d->GetSolutionWorkspaceSize, missing);
  bind(lib, (p + "CompileSolution").c_str(), &d->CompileSolution, missing);
  bind(lib, (p + "Immediate").c_str(), &d->Immediate, missing);
}

void bind_miopen(void* lib, MIOpen* m, std::string* missing) {
  bind(lib, "miopenGetVersion", &m->GetVersion, missing);
  bind(lib, "miopenGetErrorString", &m->GetErrorString, missing);
  bind(lib, "miopenCreate", &m->Create, missing);
  bind(lib, "miopenDestroy", &m->Destroy, missing);
  bind(lib, "miopenSetStream", &m->SetStream, missing);
  bind(lib, "miopenCreateTensorDescriptor", &m->CreateTensorDescriptor, missing);
  bind(lib, "miopenSetTensorDescriptor", &m->SetTensorDescriptor, missing);
  bind(lib, "miopenDestroyTensorDescriptor", &m->DestroyTensorDescriptor, missing);
  bind(lib, "miopenCreateConvolutionDescriptor", &m->CreateConvolutionDescriptor, missing);
  bind(lib, "miopenInitConvolutionNdDescriptor", &m->InitConvolutionNdDescriptor, missing);
  bind(lib, "miopenSetConvolutionGroupCount", &m->SetConvolutionGroupCount, missing);
  bind(lib, "miopenDestroyConvolutionDescriptor", &m->DestroyConvolutionDescriptor, missing);
  bind_direction(lib, "miopenConvolutionForward", &m->direction[0], missing);
  bind_direction(lib, "miopenConvolutionBackwardData", &m->direction[1], missing);
  bind_direction(lib, "miopenConvolutionBackwardWeights", &m->direction[2], missing);
  bind(lib, "miopenConvolutionBackwardBias", &m->ConvolutionBackwardBias, missing);
  bind(lib, "miopenOpTensor", &m->OpTensor, missing);
  bind(lib, "miopenSetTensor", &m->SetTensor, missing);
  bind(lib, "miopenScaleTensor", &m->ScaleTensor, missing);
  bind(lib, "miopenCreateActivationDescriptor", &m->CreateActivationDescriptor, missing);
  bind(lib, "miopenSetActivationDescriptor", &m->SetActivationDescriptor, missing);
  bind(lib, "miopenDestroyActivationDescriptor", &m->DestroyActivationDescriptor, missing);
  bind(lib, "miopenActivationForward", &m->ActivationForward, missing);
  // Optional (MIOpen 2.16 on): FDNN_CONV_DETERMINISTIC is honoured only where it is there.
  m->SetConvolutionAttribute = reinterpret_cast<miopenSetConvolutionAttribute_fn>(
      ::dlsym(lib, "miopenSetConvolutionAttribute"));
}

std::string hip_error_text(const Hip& hip, hipError_t e) {
  const char* s = hip.GetErrorString ? hip.GetErrorString(e) : nullptr;
  return std::string(s ? s : "unknown HIP error") + " (" + std::to_string(e) + ")";
}

Libraries load() {
  Libraries L;
  // MIOpen's databases and kernel cache stay where MIOpen puts them (per user already): in a
  // PyTorch process they are PyTorch's too, and setenv would race with other threads.
  std::string tried;
  void* miopen = open_miopen(&L.miopen_path, &tried);
  if (miopen == nullptr) {
    L.why_not = "MIOpen not found (libMIOpen.so.1: install ROCm's MIOpen, set ROCM_PATH, or "
                "install PyTorch for ROCm); tried:" + tried;
    return L;
  }
  std::string missing;
  bind_miopen(miopen, &L.miopen, &missing);
  // dlsym on MIOpen's handle searches its dependencies: its own HIP runtime.
  bind_hip(miopen, &L.hip, &missing);
  if (!missing.empty()) {
    L.why_not = L.miopen_path + " lacks functions the shim needs (MIOpen 2.x or later with "
                "its HIP runtime):" + missing;
    return L;
  }
  size_t patch = 0;
  if (L.miopen.GetVersion(&L.major, &L.minor, &patch) == miopenStatusSuccess)
    L.version = std::to_string(L.major) + "." + std::to_string(L.minor) + "." + std::to_string(patch);
  const std::set<std::string> runtimes = hip_runtimes();
  if (runtimes.size() > 1) {
    L.why_not = "more than one HIP runtime is loaded in this process (";
    for (const std::string& r : runtimes) L.why_not += (r == *runtimes.begin() ? "" : ", ") + r;
    L.why_not += "): arrays of one would reach MIOpen on the other. Load flux_dnn's MIOpen "
                 "from the same ROCm as the array library (FLUX_DNN_MIOPEN_LIBRARY)";
    return L;
  }
  int count = 0;
  hipError_t e = L.hip.GetDeviceCount(&count);
  if (e == hipErrorNoDevice || (e == hipSuccess && count == 0)) {
    L.why_not = "no AMD GPU found (the HIP runtime reports no device; MIOpen " + L.version +
                " is installed)";
    return L;
  }
  if (e != hipSuccess) {
    L.why_not = "the HIP runtime cannot list AMD GPUs: " + hip_error_text(L.hip, e);
    return L;
  }
  L.num_devices = count;
  return L;
}

}  // namespace

const Libraries& libraries() {
  static const Libraries loaded = load();
  return loaded;
}

}  // namespace fdnn_miopen
