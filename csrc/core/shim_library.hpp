// A loaded shim: the dlopen handle, its ABI table, and its FDNN_Error conversion.
#pragma once

#include <string>
#include <utility>

#include "flux_dnn/flux_dnn.h"

namespace fdnn_core {

class ShimLibrary {
 public:
  // Loads the library at `path` and checks its ABI version. Throws ShimLoadError (a Python
  // exception) with the reason. Shims are never unloaded: cached plans point into them.
  static ShimLibrary* load(const std::string& path);

  const FDNN_Api& api() const { return *api_; }
  // Conv_Plan_Pack_Weights when the shim has it (ABI >= 1.1 and not NULL), else NULL.
  FDNN_Conv_Plan_Pack_Weights* pack_weights_fn() const {
    bool present = api_->abi_minor >= 1 &&
                   api_->struct_size >= FDNN_STRUCT_SIZE(FDNN_Api, Conv_Plan_Pack_Weights);
    return present ? api_->Conv_Plan_Pack_Weights : nullptr;
  }
  // Conv_Dtype_Support when the shim has it (ABI >= 1.2), else NULL.
  FDNN_Conv_Dtype_Support* dtype_support_fn() const {
    bool present = api_->abi_minor >= 2 &&
                   api_->struct_size >= FDNN_STRUCT_SIZE(FDNN_Api, Conv_Dtype_Support);
    return present ? api_->Conv_Dtype_Support : nullptr;
  }
  // How the shim computes `dtype` on device_id: (FDNN_DTYPE_SUPPORT_*, detail). A shim older
  // than ABI 1.2 does not say: (-1, "").
  std::pair<int, std::string> dtype_support(int32_t device_id, FDNN_DLDataType dtype) const;
  const std::string& path() const { return path_; }
  const std::string& name() const { return name_; }
  int32_t device_type() const { return device_type_; }

  // Raises the Python exception that matches `error`'s code, adding `context`; frees error.
  [[noreturn]] void raise_error(FDNN_Error* error, const std::string& context) const;
  // Frees `error` if not NULL, raising it as above.
  void check(FDNN_Error* error, const std::string& context) const {
    if (error != nullptr) raise_error(error, context);
  }

  // Frees an error that the caller handles itself.
  void discard(FDNN_Error* error) const {
    FDNN_Error_Destroy_Args args{FDNN_Error_Destroy_Args_STRUCT_SIZE, error};
    api_->Error_Destroy(&args);
  }

  FDNN_Shim_Info_Args info() const;
  std::string device_name(int32_t device_id) const;

 private:
  ShimLibrary(void* handle, const FDNN_Api* api, std::string path);
  void* handle_;
  const FDNN_Api* api_;
  std::string path_;
  std::string name_;
  int32_t device_type_ = 0;
};

}  // namespace fdnn_core
