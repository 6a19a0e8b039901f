// Finding libMIOpen.so.1 and the HIP runtime at run time.
//
// MIOpen, in this order: the path in FLUX_DNN_MIOPEN_LIBRARY (the Python package sets it to
// the copy inside an installed PyTorch ROCm wheel); a libMIOpen.so.1 already loaded in the
// process; $ROCM_PATH/lib; /opt/rocm/lib; the dynamic linker's search path. The HIP runtime:
// one already loaded in the process (PyTorch and CuPy load their own, and the shim must
// share the runtime of the arrays it is given), else the one MIOpen itself was linked to.
#include "miopen_lib.hpp"

#include <dlfcn.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <mutex>
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

// The already-loaded copy first, then the candidates, then the search path.
void* open_miopen(std::string* path, std::string* tried) {
  if (void* h = ::dlopen(kSoname, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD)) {
    *path = std::string(kSoname) + " (already loaded)";
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
    *path = kSoname;
    return h;
  }
  *tried += std::string("\n  ") + kSoname + " on the library path: " + ::dlerror();
  return nullptr;
}

void* open_hip(void* miopen) {
  for (const char* name : {"libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5",
                           "libamdhip64.so"})
    if (void* h = ::dlopen(name, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD)) return h;
  return miopen;  // dlsym on MIOpen's handle searches its dependencies: its HIP runtime
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

void make_dirs(const std::string& path) {
  for (size_t at = 1; at <= path.size(); ++at)
    if (at == path.size() || path[at] == '/') ::mkdir(path.substr(0, at).c_str(), 0700);
}

// MIOpen keeps its tuning database and compiled kernels in files it locks for concurrent
// processes. Its defaults (~/.config/miopen, ~/.cache/miopen) are per user already; the
// shim only fills in a per-user folder of its own when the caller set neither, and never
// overrides a caller's choice.
void set_database_directory() {
  const char* user_db = std::getenv("MIOPEN_USER_DB_PATH");
  if (user_db && *user_db) return;
  std::string base;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg)
    base = xdg;
  else if (const char* home = std::getenv("HOME"); home && *home)
    base = std::string(home) + "/.cache";
  else
    return;  // no home: MIOpen's own defaults
  std::string root = base + "/flux_dnn/miopen";
  make_dirs(root + "/db");
  make_dirs(root + "/kernels");
  ::setenv("MIOPEN_USER_DB_PATH", (root + "/db").c_str(), 0);
  ::setenv("MIOPEN_CUSTOM_CACHE_DIR", (root + "/kernels").c_str(), 0);
}

std::string hip_error_text(const Hip& hip, hipError_t e) {
  const char* s = hip.GetErrorString ? hip.GetErrorString(e) : nullptr;
  return std::string(s ? s : "unknown HIP error") + " (" + std::to_string(e) + ")";
}

Libraries load() {
  Libraries L;
  set_database_directory();
  std::string tried;
  void* miopen = open_miopen(&L.miopen_path, &tried);
  if (miopen == nullptr) {
    L.why_not = "MIOpen not found (libMIOpen.so.1: install ROCm's MIOpen, set ROCM_PATH, or "
                "install PyTorch for ROCm); tried:" + tried;
    return L;
  }
  std::string missing;
  bind_miopen(miopen, &L.miopen, &missing);
  bind_hip(open_hip(miopen), &L.hip, &missing);
  if (!missing.empty()) {
    L.why_not = L.miopen_path + " lacks functions the shim needs (MIOpen 2.x or later with "
                "its HIP runtime):" + missing;
    return L;
  }
  size_t major = 0, minor = 0, patch = 0;
  if (L.miopen.GetVersion(&major, &minor, &patch) == miopenStatusSuccess)
    L.version = std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
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
