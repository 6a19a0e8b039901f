#include "shim_library.hpp"

#include <dlfcn.h>

#include <map>
#include <memory>
#include <mutex>

#include "errors.hpp"

namespace py = pybind11;

namespace fdnn_core {

namespace {

std::string version_text(int32_t major, int32_t minor) {
  return std::to_string(major) + "." + std::to_string(minor);
}

// Every function of ABI 1.0 must be present; a table that lacks one is broken. Later
// (minor) functions are optional: see ShimLibrary::pack_weights_fn.
bool table_complete(const FDNN_Api* api) {
  return api->struct_size >= FDNN_Api_STRUCT_SIZE_1_0 && api->Error_Destroy && api->Error_Describe &&
         api->Shim_Info && api->Device_Describe && api->Conv_Plan_Create &&
         api->Conv_Plan_Execute && api->Plan_Destroy;
}

const FDNN_Api* open_table(const std::string& path, void** handle) {
  *handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (*handle == nullptr) {
    const char* why = dlerror();
    raise(exception_types().shim_load_error,
          "cannot load shim library " + path + ": " + (why ? why : "unknown dlopen error"));
  }
  auto get_api = reinterpret_cast<FDNN_GetApiFn*>(dlsym(*handle, FDNN_GET_API_SYMBOL));
  if (get_api == nullptr)
    raise(exception_types().shim_load_error,
          path + " is not a flux_dnn shim: it does not export " FDNN_GET_API_SYMBOL);
  const FDNN_Api* api = get_api();
  if (api == nullptr || api->struct_size < FDNN_STRUCT_SIZE(FDNN_Api, abi_minor))
    raise(exception_types().shim_load_error, path + " returned no valid API table");
  if (api->abi_major != FDNN_ABI_MAJOR)
    raise(exception_types().shim_load_error,
          "shim " + path + " was built for flux_dnn ABI " +
              version_text(api->abi_major, api->abi_minor) + ", but this flux_dnn core speaks ABI " +
              version_text(FDNN_ABI_MAJOR, FDNN_ABI_MINOR) +
              "; install the shim package that matches this flux_dnn release");
  if (!table_complete(api))
    raise(exception_types().shim_load_error,
          "shim " + path + " (ABI " + version_text(api->abi_major, api->abi_minor) +
              ") has an incomplete function table");
  return api;
}

}  // namespace

ShimLibrary::ShimLibrary(void* handle, const FDNN_Api* api, std::string path)
    : handle_(handle), api_(api), path_(std::move(path)) {
  FDNN_Shim_Info_Args args = info();
  name_ = args.shim_name ? args.shim_name : "?";
  device_type_ = args.device_type;
}

ShimLibrary* ShimLibrary::load(const std::string& path) {
  static std::mutex mutex;
  static std::map<std::string, std::unique_ptr<ShimLibrary>> loaded;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = loaded.find(path);
  if (it != loaded.end()) return it->second.get();
  void* handle = nullptr;
  const FDNN_Api* api = nullptr;
  try {
    api = open_table(path, &handle);
  } catch (...) {
    if (handle != nullptr) dlclose(handle);
    throw;
  }
  auto shim = std::unique_ptr<ShimLibrary>(new ShimLibrary(handle, api, path));
  return (loaded[path] = std::move(shim)).get();
}

FDNN_Shim_Info_Args ShimLibrary::info() const {
  FDNN_Shim_Info_Args args{};
  args.struct_size = FDNN_Shim_Info_Args_STRUCT_SIZE;
  check(api_->Shim_Info(&args), "Shim_Info");
  return args;
}

std::string ShimLibrary::device_name(int32_t device_id) const {
  FDNN_Device_Describe_Args args{};
  args.struct_size = FDNN_Device_Describe_Args_STRUCT_SIZE;
  args.device_id = device_id;
  check(api_->Device_Describe(&args), "Device_Describe");
  return args.name ? args.name : "";
}

std::pair<int, std::string> ShimLibrary::dtype_support(int32_t device_id,
                                                        FDNN_DLDataType dtype) const {
  FDNN_Conv_Dtype_Support* fn = dtype_support_fn();
  if (fn == nullptr) return {-1, ""};
  FDNN_Conv_Dtype_Support_Args args{};
  args.struct_size = FDNN_Conv_Dtype_Support_Args_STRUCT_SIZE;
  args.device_id = device_id;
  args.dtype = dtype;
  check(fn(&args), "Conv_Dtype_Support");
  return {args.support, args.detail ? args.detail : ""};
}

void ShimLibrary::raise_error(FDNN_Error* error, const std::string& context) const {
  FDNN_Error_Describe_Args d{};
  d.struct_size = FDNN_Error_Describe_Args_STRUCT_SIZE;
  d.error = error;
  api_->Error_Describe(&d);
  std::string message = "[" + name_ + "] " + context + ": " + std::string(d.message, d.message_size);
  FDNN_ErrorCode code = d.code;
  FDNN_Error_Destroy_Args destroy{FDNN_Error_Destroy_Args_STRUCT_SIZE, error};
  api_->Error_Destroy(&destroy);

  const ExceptionTypes& types = exception_types();
  switch (code) {
    case FDNN_ERROR_INVALID_ARGUMENT: raise(py::reinterpret_borrow<py::object>(PyExc_ValueError), message);
    case FDNN_ERROR_UNSUPPORTED: raise(types.unsupported_error, message);
    case FDNN_ERROR_UNAVAILABLE: raise(types.unavailable_error, message);
    case FDNN_ERROR_OUT_OF_MEMORY: raise(py::reinterpret_borrow<py::object>(PyExc_MemoryError), message);
    case FDNN_ERROR_VENDOR: raise(types.vendor_error, message);
    default: raise(py::reinterpret_borrow<py::object>(PyExc_RuntimeError), message);
  }
}

}  // namespace fdnn_core
