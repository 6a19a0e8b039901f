// MIOpen and the HIP runtime, loaded at run time: the function table the shim calls through,
// found once per process.
#pragma once

#include <string>

#include "miopen_api.hpp"

namespace fdnn_miopen {

struct Hip {
  hipGetDeviceCount_fn GetDeviceCount;
  hipGetDevice_fn GetDevice;
  hipSetDevice_fn SetDevice;
  hipDeviceGetName_fn DeviceGetName;
  hipGetErrorString_fn GetErrorString;
  hipMalloc_fn Malloc;
  hipFree_fn Free;
  hipMemsetAsync_fn MemsetAsync;
  hipEventCreate_fn EventCreate;
  hipEventRecord_fn EventRecord;
  hipEventSynchronize_fn EventSynchronize;
  hipEventElapsedTime_fn EventElapsedTime;
  hipEventDestroy_fn EventDestroy;
  hipStreamSynchronize_fn StreamSynchronize;
};

// One direction of immediate mode (forward, backward-data, backward-weights).
struct Direction {
  miopenGetSolutionCount_fn GetSolutionCount;
  miopenGetSolution_fn GetSolution;
  miopenGetSolutionWorkspaceSize_fn GetSolutionWorkspaceSize;
  miopenCompileSolution_fn CompileSolution;
  miopenImmediate_fn Immediate;
};

struct MIOpen {
  miopenGetVersion_fn GetVersion;
  miopenGetErrorString_fn GetErrorString;
  miopenCreate_fn Create;
  miopenDestroy_fn Destroy;
  miopenSetStream_fn SetStream;
  miopenCreateTensorDescriptor_fn CreateTensorDescriptor;
  miopenSetTensorDescriptor_fn SetTensorDescriptor;
  miopenDestroyTensorDescriptor_fn DestroyTensorDescriptor;
  miopenCreateConvolutionDescriptor_fn CreateConvolutionDescriptor;
  miopenInitConvolutionNdDescriptor_fn InitConvolutionNdDescriptor;
  miopenSetConvolutionGroupCount_fn SetConvolutionGroupCount;
  miopenSetConvolutionAttribute_fn SetConvolutionAttribute;  // NULL before MIOpen 2.16
  miopenDestroyConvolutionDescriptor_fn DestroyConvolutionDescriptor;
  Direction direction[3];  // indexed by FDNN_CONV_* (forward, backward-data, backward-weight)
  miopenConvolutionBackwardBias_fn ConvolutionBackwardBias;
  miopenOpTensor_fn OpTensor;
  miopenSetTensor_fn SetTensor;
  miopenScaleTensor_fn ScaleTensor;
  miopenCreateActivationDescriptor_fn CreateActivationDescriptor;
  miopenSetActivationDescriptor_fn SetActivationDescriptor;
  miopenDestroyActivationDescriptor_fn DestroyActivationDescriptor;
  miopenActivationForward_fn ActivationForward;
};

struct Libraries {
  MIOpen miopen{};
  Hip hip{};
  std::string miopen_path;   // the file of the libMIOpen in use
  std::string version;       // "3.1.0"; "" when MIOpen is missing
  size_t major = 0, minor = 0;
  std::string why_not;       // "" when usable; else in words for a user
  int num_devices = 0;
  bool version_at_least(size_t want_major, size_t want_minor) const {
    return major > want_major || (major == want_major && minor >= want_minor);
  }
};

// Loads both once (thread-safe) and reports what it found; never throws.
const Libraries& libraries();

}  // namespace fdnn_miopen
