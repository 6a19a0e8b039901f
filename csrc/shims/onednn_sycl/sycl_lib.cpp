// Loading oneDNN's SYCL build and the SYCL runtime (see sycl_lib.hpp for why by path).
//
// The SYCL runtime without its headers. libsycl.so.8 (intel-sycl-rt 2025.x) exports its
// classes' member functions under their Itanium C++ names; the shim calls the few it needs
// through dlsym'd pointers, with the calling convention the C++ ABI gives them:
//   - sycl::device, sycl::context and sycl::platform hold exactly one
//     std::shared_ptr<detail::*_impl> (intel/llvm sycl/include/sycl/device.hpp, context.hpp,
//     platform.hpp, ABI 8), so each is 16 bytes laid out as a std::shared_ptr, which is what
//     SyclObject is; a sycl::queue is only ever passed by pointer (the caller's).
//   - A member function is a function whose first parameter is `this`; one returning such an
//     object by value (not trivially copyable) returns it through a hidden pointer to the
//     result, passed before `this`: `device queue::get_device() const` is called as
//     void(SyclObject* result, const queue* this). sycl::detail::string (a char* freed by
//     delete[] in its destructor) comes back the same way.
//   - intel/llvm PR #20821 turned device's member into a plain device_impl* (8 bytes) for the
//     next ABI, with a new soname: the shim opens libsycl.so.8 only and says so otherwise.
// The facts are checked at run time too: the device of a dpctl queue found this way is the
// device dpctl reports (tests/test_onednn_sycl.py).
#include "sycl_lib.hpp"

#include <dirent.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace fdnn_sycl {
namespace {

constexpr const char* kSyclSoname = "libsycl.so.8";

// The mangled names (libsycl.so.8, namespace sycl::_V1).
constexpr const char* kQueueGetDevice = "_ZNK4sycl3_V15queue10get_deviceEv";
constexpr const char* kQueueGetContext = "_ZNK4sycl3_V15queue11get_contextEv";
constexpr const char* kQueueIsInOrder = "_ZNK4sycl3_V15queue11is_in_orderEv";
constexpr const char* kQueueWait = "_ZN4sycl3_V15queue10wait_proxyERKNS0_6detail13code_locationE";
constexpr const char* kQueueBarrier =
    "_ZN4sycl3_V15queue25ext_oneapi_submit_barrierERKNS0_6detail13code_locationE";
constexpr const char* kQueueBarrierAfter =
    "_ZN4sycl3_V15queue25ext_oneapi_submit_barrierERKSt6vectorINS0_5eventESaIS3_EERKNS0_6detail13code_"
    "locationE";
constexpr const char* kEventWait = "_ZN4sycl3_V15event4waitEv";
constexpr const char* kEventStatus =
    "_ZNK4sycl3_V15event8get_infoINS0_4info5event24command_execution_statusEEENS0_6detail18is_event_"
    "info_descIT_E11return_typeEv";
constexpr const char* kGetDevices = "_ZN4sycl3_V16device11get_devicesENS0_4info11device_typeE";
constexpr const char* kDeviceGetPlatform = "_ZNK4sycl3_V16device12get_platformEv";
constexpr const char* kPlatformDefaultContext =
    "_ZNK4sycl3_V18platform30ext_oneapi_get_default_contextEv";
constexpr const char* kDeviceIsGpu = "_ZNK4sycl3_V16device6is_gpuEv";
constexpr const char* kDeviceIsCpu = "_ZNK4sycl3_V16device6is_cpuEv";
constexpr const char* kDeviceName =
    "_ZNK4sycl3_V16device13get_info_implINS0_4info6device4nameEEENS0_6detail11ABINeutralTINS6_"
    "19is_device_info_descIT_E11return_typeEE4typeEv";
// info::device_type::all = UR_DEVICE_TYPE_ALL (ur_api.h: DEFAULT 1, ALL 2, GPU 3, CPU 4).
constexpr uint32_t kDeviceTypeAll = 2;

std::string dl_error() {
  const char* e = dlerror();
  return e ? e : "unknown dlerror";
}

// This library's own folder (dladdr of a function in it).
std::string own_dir() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&own_dir), &info) == 0 || info.dli_fname == nullptr) return "";
  std::string path = info.dli_fname;
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

// libdnnl.so.3.N files in `dir`, the highest N first (the versioned file of a wheel, never the
// libdnnl.so.3 alias, which another oneDNN wheel in the same prefix may have overwritten).
std::vector<std::string> versioned_dnnl_in(const std::string& dir) {
  std::vector<std::pair<int, std::string>> found;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      const char* prefix = "libdnnl.so.3.";
      if (std::strncmp(e->d_name, prefix, std::strlen(prefix)) != 0) continue;
      const char* minor = e->d_name + std::strlen(prefix);
      if (*minor < '0' || *minor > '9') continue;
      found.emplace_back(std::atoi(minor), dir + "/" + e->d_name);
    }
    closedir(d);
  }
  std::sort(found.rbegin(), found.rend());
  std::vector<std::string> paths;
  for (auto& f : found) paths.push_back(f.second);
  return paths;
}

// Where the SYCL oneDNN may lie: FLUX_DNN_ONEDNN_SYCL_LIBDNNL (set by the plug-in's Python
// preload from the `onednn` wheel's file list), else the prefix's lib folder three levels
// above this shim (<prefix>/lib/pythonX.Y/site-packages/flux_dnn_sycl), then this folder.
std::vector<std::string> dnnl_candidates() {
  std::vector<std::string> c;
  if (const char* env = std::getenv("FLUX_DNN_ONEDNN_SYCL_LIBDNNL"); env && *env) c.push_back(env);
  const std::string dir = own_dir();
  for (const std::string& d : {dir + "/../../..", dir})
    for (std::string& p : versioned_dnnl_in(d)) c.push_back(std::move(p));
  return c;
}

template <class F>
bool bind(void* lib, const char* name, F& out) {
  out = reinterpret_cast<F>(dlsym(lib, name));
  return out != nullptr;
}

void load_sycl(Libraries& l) {
  // RTLD_GLOBAL like the array libraries' own loads of it: one SYCL runtime per process.
  void* lib = dlopen(kSyclSoname, RTLD_NOW | RTLD_GLOBAL);
  if (lib == nullptr) {
    l.error = std::string("the SYCL runtime (") + kSyclSoname +
              ") is not loadable: " + dl_error() + "; pip install intel-sycl-rt";
    return;
  }
  Sycl& s = l.sycl;
  s.abi = 8;
  const bool ok = bind(lib, kQueueGetDevice, s.queue_get_device) &&
                  bind(lib, kQueueGetContext, s.queue_get_context) &&
                  bind(lib, kQueueIsInOrder, s.queue_is_in_order) &&
                  bind(lib, kQueueWait, s.queue_wait) && bind(lib, kQueueBarrier, s.queue_barrier) &&
                  bind(lib, kQueueBarrierAfter, s.queue_barrier_after) &&
                  bind(lib, kEventWait, s.event_wait) && bind(lib, kEventStatus, s.event_status) &&
                  bind(lib, kGetDevices, s.get_devices) &&
                  bind(lib, kDeviceGetPlatform, s.device_get_platform) &&
                  bind(lib, kPlatformDefaultContext, s.platform_default_context) &&
                  bind(lib, kDeviceIsGpu, s.device_is_gpu) &&
                  bind(lib, kDeviceIsCpu, s.device_is_cpu) &&
                  bind(lib, kDeviceName, s.device_name);
  if (!ok)
    l.error = std::string("the SYCL runtime ") + kSyclSoname +
              " lacks a function this shim calls: " + dl_error();
}

void load_dnnl(Libraries& l) {
  std::string tried;
  for (const std::string& path : dnnl_candidates()) {
    // Full path: never matched by soname to the CPU shim's oneDNN 3.2. RTLD_LOCAL: its
    // symbols stay out of the global scope. RTLD_DEEPBIND: its references to its own
    // dnnl_* symbols bind to itself, not to a global oneDNN loaded before it.
    void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (lib == nullptr) {
      tried += "\n  " + path + ": " + dl_error();
      continue;
    }
    if (dlsym(lib, "dnnl_sycl_interop_engine_create") == nullptr) {
      tried += "\n  " + path + ": a oneDNN without the SYCL runtime";
      dlclose(lib);
      continue;
    }
    Dnnl& d = l.dnnl;
    std::string missing;
#define FDNN_SYCL_BIND(name) \
  if (!bind(lib, #name, d.name)) missing += " " #name;
    FDNN_SYCL_DNNL_FUNCTIONS(FDNN_SYCL_BIND)
#undef FDNN_SYCL_BIND
    if (!missing.empty()) {
      l.error = "oneDNN at " + path + " lacks:" + missing;
      return;
    }
    const dnnl_version_t* v = d.dnnl_version();
    if (v->major != 3 || v->minor < 9 || (v->gpu_runtime != DNNL_RUNTIME_SYCL &&
                                          v->cpu_runtime != DNNL_RUNTIME_SYCL)) {
      tried += "\n  " + path + ": oneDNN " + std::to_string(v->major) + "." +
               std::to_string(v->minor) + " without a SYCL runtime (3.9 or later wanted)";
      l.dnnl = Dnnl{};
      continue;
    }
    l.dnnl_path = path;
    return;
  }
  l.error = "oneDNN with the SYCL runtime not found (pip install onednn==2025.3.0; or set "
            "FLUX_DNN_ONEDNN_SYCL_LIBDNNL to its libdnnl.so.3.N)";
  if (!tried.empty()) l.error += "; tried:" + tried;
}

}  // namespace

const Libraries& libraries() {
  static const Libraries* l = [] {
    auto* out = new Libraries;  // never freed: outlives every plan and engine
    load_sycl(*out);
    if (out->usable()) load_dnnl(*out);
    return out;
  }();
  return *l;
}

const std::vector<DeviceEntry>& devices() {
  static const std::vector<DeviceEntry>* list = [] {
    auto* out = new std::vector<DeviceEntry>;
    const Libraries& l = libraries();
    if (!l.usable()) return out;
    std::vector<SyclObject> found;
    try {
      l.sycl.get_devices(&found, kDeviceTypeAll);
    } catch (...) {
      return out;  // the runtime threw (no adapter): no device
    }
    for (const SyclObject& d : found) {
      DeviceEntry e;
      e.device = d;
      SyclObject platform;
      try {
        l.sycl.device_get_platform(&platform, &d);
        l.sycl.platform_default_context(&e.context, &platform);
        char* name = nullptr;
        l.sycl.device_name(&name, &d);
        e.name = name ? name : "SYCL device";
        delete[] name;
        e.gpu = l.sycl.device_is_gpu(&d);
      } catch (...) {
        continue;
      }
      out->push_back(std::move(e));
    }
    return out;
  }();
  return *list;
}

}  // namespace fdnn_sycl
