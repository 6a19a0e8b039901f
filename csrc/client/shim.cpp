#include "client/shim.hpp"

#include <dlfcn.h>

#include <map>
#include <memory>
#include <mutex>

namespace fdnn_client {

ErrorKind kind_of_code(int32_t code) {
  switch (code) {
    case FDNN_ERROR_INVALID_ARGUMENT: return ErrorKind::kInvalidArgument;
    case FDNN_ERROR_UNSUPPORTED: return ErrorKind::kUnsupported;
    case FDNN_ERROR_UNAVAILABLE: return ErrorKind::kUnavailable;
    case FDNN_ERROR_OUT_OF_MEMORY: return ErrorKind::kOutOfMemory;
    case FDNN_ERROR_VENDOR: return ErrorKind::kVendor;
    default: return ErrorKind::kInternal;
  }
}

namespace {

[[noreturn]] void load_error(const std::string& message) { throw Error(ErrorKind::kShimLoad, message); }

std::string version_text(int32_t major, int32_t minor) {
  return std::to_string(major) + "." + std::to_string(minor);
}

// The functions this header requires of a table, by name; a table missing one is broken.
// Conv_Plan_Pack_Weights is the one the header allows to be NULL.
std::string missing_functions(const FDNN_Api& api) {
  const std::pair<const char*, const void*> required[] = {
      {"Error_Destroy", reinterpret_cast<const void*>(api.Error_Destroy)},
      {"Error_Describe", reinterpret_cast<const void*>(api.Error_Describe)},
      {"Shim_Info", reinterpret_cast<const void*>(api.Shim_Info)},
      {"Device_Describe", reinterpret_cast<const void*>(api.Device_Describe)},
      {"Conv_Capabilities", reinterpret_cast<const void*>(api.Conv_Capabilities)},
      {"Conv_Plan_Create", reinterpret_cast<const void*>(api.Conv_Plan_Create)},
      {"Conv_Plan_Execute", reinterpret_cast<const void*>(api.Conv_Plan_Execute)},
      {"Plan_Destroy", reinterpret_cast<const void*>(api.Plan_Destroy)},
  };
  std::string missing;
  for (const auto& [name, fn] : required)
    if (fn == nullptr) missing += (missing.empty() ? "" : ", ") + std::string(name);
  return missing;
}

// The library's table, checked; throws Error(kShimLoad). The library stays loaded whatever
// happens: a foreign library may not survive dlclose, and a failed load is rare.
const FDNN_Api* open_table(const std::string& path) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    load_error("cannot load shim library " + path + ": " + (why ? why : "unknown dlopen error"));
  }
  auto get_api = reinterpret_cast<FDNN_GetApiFn*>(dlsym(handle, FDNN_GET_API_SYMBOL));
  if (get_api == nullptr)
    load_error(path + " is not a flux_dnn shim: it does not export " FDNN_GET_API_SYMBOL);
  const FDNN_Api* api = get_api();
  if (api == nullptr || api->struct_size < FDNN_STRUCT_SIZE(FDNN_Api, abi_minor))
    load_error(path + " returned no valid API table");
  const std::string version = version_text(api->abi_major, api->abi_minor);
  if (api->abi_major != FDNN_ABI_MAJOR)
    load_error("shim " + path + " was built for flux_dnn ABI " + version +
               ", but this flux_dnn core speaks ABI " + version_text(FDNN_ABI_MAJOR, FDNN_ABI_MINOR) +
               "; install the shim package that matches this flux_dnn release");
  if (api->struct_size < FDNN_Api_STRUCT_SIZE)
    load_error("shim " + path + " (ABI " + version + ") has a function table of " +
               std::to_string(api->struct_size) + " bytes, smaller than the " +
               std::to_string(static_cast<size_t>(FDNN_Api_STRUCT_SIZE)) + " of ABI " +
               version_text(FDNN_ABI_MAJOR, 0));
  const std::string missing = missing_functions(*api);
  if (!missing.empty())
    load_error("shim " + path + " (ABI " + version + ") has an incomplete function table: " +
               missing + " NULL");
  return api;
}

}  // namespace

Shim::Shim(const FDNN_Api* api, std::string path) : api_(api), path_(std::move(path)) {
  for (auto& flags : default_flags_) flags.store(-1, std::memory_order_relaxed);
  name_ = path_;  // until the shim says its name: Shim_Info's errors need one
  FDNN_Shim_Info_Args args;
  try {
    args = info();
  } catch (const Error& e) {
    load_error("shim " + path_ + " failed to describe itself: " + e.what());
  }
  name_ = args.shim_name ? args.shim_name : "?";
  device_type_ = args.device_type;
}

const Shim& Shim::load(std::string_view path_view) {
  static std::mutex mutex;
  // By path; std::less<> finds a string_view without making a string. Outlives exit.
  static auto* loaded = new std::map<std::string, std::unique_ptr<Shim>, std::less<>>();
  std::lock_guard<std::mutex> lock(mutex);
  auto it = loaded->find(path_view);
  if (it != loaded->end()) return *it->second;
  const std::string path(path_view);
  std::unique_ptr<Shim> shim(new Shim(open_table(path), path));  // throws before any insert
  const Shim& result = *shim;
  loaded->emplace(path, std::move(shim));
  return result;
}

FDNN_Shim_Info_Args Shim::info() const {
  FDNN_Shim_Info_Args args{};
  args.struct_size = FDNN_Shim_Info_Args_STRUCT_SIZE;
  check(api_->Shim_Info(&args), "Shim_Info");
  return args;
}

FDNN_Device_Describe_Args Shim::describe_device(int32_t device_id) const {
  FDNN_Device_Describe_Args args{};
  args.struct_size = FDNN_Device_Describe_Args_STRUCT_SIZE;
  args.device_id = device_id;
  check(api_->Device_Describe(&args), "Device_Describe");
  return args;
}

FDNN_Conv_Capabilities_Args Shim::capabilities(int32_t device_id, int32_t op,
                                               FDNN_DLDataType dtype) const {
  FDNN_Conv_Capabilities_Args args{};
  args.struct_size = FDNN_Conv_Capabilities_Args_STRUCT_SIZE;
  args.device_id = device_id;
  args.op = op;
  args.dtype = dtype;
  check(api_->Conv_Capabilities(&args), "Conv_Capabilities");
  return args;
}

uint32_t Shim::default_flags(int32_t device_id) const {
  const bool remembered = device_id >= 0 && device_id < kRememberedDevices;
  if (remembered) {
    const int64_t known = default_flags_[device_id].load(std::memory_order_relaxed);
    if (known >= 0) return static_cast<uint32_t>(known);
  }
  const uint32_t flags = describe_device(device_id).default_flags;
  if (remembered) default_flags_[device_id].store(flags, std::memory_order_relaxed);
  return flags;
}

void Shim::raise(FDNN_Error* error, const char* context) const {
  FDNN_Error_Describe_Args d{};
  d.struct_size = FDNN_Error_Describe_Args_STRUCT_SIZE;
  d.error = error;
  api_->Error_Describe(&d);
  std::string message = "[" + name_ + "] " + context + ": ";
  if (d.message != nullptr) message.append(d.message, d.message_size);
  const ErrorKind kind = kind_of_code(d.code);
  discard(error);
  throw Error(kind, message);
}

void Shim::discard(FDNN_Error* error) const {
  FDNN_Error_Destroy_Args args{};
  args.struct_size = FDNN_Error_Destroy_Args_STRUCT_SIZE;
  args.error = error;
  api_->Error_Destroy(&args);
}

}  // namespace fdnn_client
