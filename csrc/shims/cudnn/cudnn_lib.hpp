// cuDNN, loaded at run time. The shim compiles against cuDNN's headers for types and enums
// only; every cuDNN function is called through the table below, filled by dlopen of
// libcudnn.so.9. So the shim itself loads on a machine without cuDNN (or without a driver)
// and can say why it cannot run, instead of failing to load with a linker message.
#pragma once

#include <cudnn_graph.h>

#include <string>

namespace fdnn_cudnn {

struct CudnnLib {
  decltype(&::cudnnGetVersion) GetVersion;
  decltype(&::cudnnGetErrorString) GetErrorString;
  decltype(&::cudnnGetLastErrorString) GetLastErrorString;
  decltype(&::cudnnCreate) Create;
  decltype(&::cudnnDestroy) Destroy;
  decltype(&::cudnnSetStream) SetStream;
  decltype(&::cudnnBackendCreateDescriptor) BackendCreateDescriptor;
  decltype(&::cudnnBackendDestroyDescriptor) BackendDestroyDescriptor;
  decltype(&::cudnnBackendSetAttribute) BackendSetAttribute;
  decltype(&::cudnnBackendGetAttribute) BackendGetAttribute;
  decltype(&::cudnnBackendFinalize) BackendFinalize;
  decltype(&::cudnnBackendExecute) BackendExecute;
};

// Loads libcudnn.so.9 once (thread-safe). Returns nullptr when it cannot, with the reason
// in words for a user in *why_not.
const CudnnLib* load_cudnn(std::string* why_not);

// The loaded table; throws Failure(UNAVAILABLE) when cuDNN could not be loaded.
const CudnnLib& cudnn();

// "9.28.1" for cudnnGetVersion() == 92801.
std::string cudnn_version_text(size_t version);

// Throws Failure(VENDOR) with cuDNN's status name, its last error text and `call`.
[[noreturn]] void fail_cudnn(cudnnStatus_t status, const char* call);

inline void check_cudnn(cudnnStatus_t status, const char* call) {
  if (status != CUDNN_STATUS_SUCCESS) fail_cudnn(status, call);
}

// cuDNN's status name plus its last error message, for messages and skip notes.
std::string cudnn_status_text(cudnnStatus_t status);

}  // namespace fdnn_cudnn
