// A loaded shim: the library's ABI table, checked once at load, and the calls every client
// makes through it (info, device description, capabilities, error conversion). Vendor-free
// and Python-free: _core and the XLA FFI handler both use it.
#pragma once

#include <atomic>
#include <string>
#include <string_view>

#include "client/error.hpp"
#include "flux_dnn/flux_dnn.h"

namespace fdnn_client {

class Shim {
 public:
  // Loads the library at `path` once per process (per binary linking this library) and
  // checks it: it exports fdnn_get_api, its table speaks this ABI major, is at least as large
  // as this header's, and has every function the header requires. Throws Error(kShimLoad)
  // saying why not. Shims are never unloaded: cached plans point into them.
  static const Shim& load(std::string_view path);  // a hit allocates nothing

  Shim(const Shim&) = delete;
  Shim& operator=(const Shim&) = delete;

  const FDNN_Api& api() const { return *api_; }
  const std::string& path() const { return path_; }
  const std::string& name() const { return name_; }
  int32_t device_type() const { return device_type_; }
  // NULL when the shim cannot pack weights (the header allows it).
  FDNN_Conv_Plan_Pack_Weights* pack_weights_fn() const { return api_->Conv_Plan_Pack_Weights; }

  // The Shim_Info, Device_Describe and Conv_Capabilities answers (strings are the shim's
  // static storage). Throw Error on failure.
  FDNN_Shim_Info_Args info() const;
  FDNN_Device_Describe_Args describe_device(int32_t device_id) const;
  FDNN_Conv_Capabilities_Args capabilities(int32_t device_id, int32_t op, FDNN_DLDataType dtype) const;
  // Device_Describe's default_flags, asked once per device (for the first few devices).
  uint32_t default_flags(int32_t device_id) const;

  // Throws the Error that `error` describes: its kind from the code, its message
  // "[shim] context: the shim's words". Frees `error` first.
  [[noreturn]] void raise(FDNN_Error* error, const char* context) const;
  // raise() when `error` is not NULL. Costs nothing on success: `context` is a literal.
  void check(FDNN_Error* error, const char* context) const {
    if (error != nullptr) raise(error, context);
  }
  // Frees an error the caller handles itself.
  void discard(FDNN_Error* error) const;

 private:
  Shim(const FDNN_Api* api, std::string path);
  const FDNN_Api* api_;
  std::string path_;
  std::string name_;
  int32_t device_type_ = 0;
  // default_flags per device id, -1 until asked.
  static constexpr int kRememberedDevices = 16;
  mutable std::atomic<int64_t> default_flags_[kRememberedDevices];
};

}  // namespace fdnn_client
