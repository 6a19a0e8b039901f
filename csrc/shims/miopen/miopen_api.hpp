// The subset of MIOpen's C API (include/miopen/miopen.h, MIOpen 2.x/3.x) and of the HIP
// runtime API that the shim calls, declared here so that no vendor header is needed to build:
// the types are opaque handles, the enum values and signatures are those of the published
// headers. Both libraries are dlopened at run time (miopen_lib.cpp); nothing links them.
// tests/doubles/miopen implements exactly these declarations (it includes this file), so a
// signature written wrong here is one the double would not catch: each was checked against
// miopen.h and hip_runtime_api.h.
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {

// ---- HIP ----------------------------------------------------------------------------------
typedef int hipError_t;  // hipSuccess = 0; hipErrorNoDevice = 100; hipErrorInvalidDevice = 101
typedef struct ihipStream_t* hipStream_t;
typedef struct ihipEvent_t* hipEvent_t;
enum { hipSuccess = 0, hipErrorNoDevice = 100 };

typedef hipError_t (*hipGetDeviceCount_fn)(int* count);
typedef hipError_t (*hipGetDevice_fn)(int* device);
typedef hipError_t (*hipSetDevice_fn)(int device);
typedef hipError_t (*hipDeviceGetName_fn)(char* name, int len, int device);
typedef const char* (*hipGetErrorString_fn)(hipError_t error);
typedef hipError_t (*hipMalloc_fn)(void** ptr, size_t size);
typedef hipError_t (*hipFree_fn)(void* ptr);
typedef hipError_t (*hipMemsetAsync_fn)(void* dst, int value, size_t size, hipStream_t stream);
typedef hipError_t (*hipEventCreate_fn)(hipEvent_t* event);
typedef hipError_t (*hipEventRecord_fn)(hipEvent_t event, hipStream_t stream);
typedef hipError_t (*hipEventSynchronize_fn)(hipEvent_t event);
typedef hipError_t (*hipEventElapsedTime_fn)(float* ms, hipEvent_t start, hipEvent_t stop);
typedef hipError_t (*hipEventDestroy_fn)(hipEvent_t event);
typedef hipError_t (*hipStreamSynchronize_fn)(hipStream_t stream);

// ---- MIOpen -------------------------------------------------------------------------------
typedef struct miopenHandle* miopenHandle_t;
typedef struct miopenTensorDescriptor* miopenTensorDescriptor_t;
typedef struct miopenConvolutionDescriptor* miopenConvolutionDescriptor_t;
typedef struct miopenActivationDescriptor* miopenActivationDescriptor_t;
typedef hipStream_t miopenAcceleratorQueue_t;

// The enums are int-sized C enums in miopen.h; int here, with the published values.
typedef int miopenStatus_t;
enum {
  miopenStatusSuccess = 0,
  miopenStatusNotInitialized = 1,
  miopenStatusInvalidValue = 2,
  miopenStatusBadParm = 3,
  miopenStatusAllocFailed = 4,
  miopenStatusInternalError = 5,
  miopenStatusNotImplemented = 6,
  miopenStatusUnknownError = 7,
  miopenStatusUnsupportedOp = 8,
};
typedef int miopenDataType_t;
enum { miopenHalf = 0, miopenFloat = 1, miopenInt32 = 2, miopenInt8 = 3, miopenBFloat16 = 5,
       miopenDouble = 6 };
typedef int miopenTensorOp_t;
enum { miopenTensorOpAdd = 0, miopenTensorOpMul = 1, miopenTensorOpMin = 2, miopenTensorOpMax = 3 };
typedef int miopenConvolutionMode_t;
enum { miopenConvolution = 0, miopenTranspose = 1 };
typedef int miopenActivationMode_t;
enum {
  miopenActivationPASTHRU = 0,
  miopenActivationLOGISTIC = 1,  // 1 / (1 + e^-x)
  miopenActivationTANH = 2,      // beta * tanh(alpha * x)
  miopenActivationRELU = 3,
  miopenActivationSOFTRELU = 4,
  miopenActivationABS = 5,
  miopenActivationPOWER = 6,        // (alpha + beta * x)^gamma
  miopenActivationCLIPPEDRELU = 7,  // min(alpha, max(0, x))
  miopenActivationLEAKYRELU = 8,    // alpha * x for x <= 0, x otherwise
  miopenActivationELU = 9,
};
typedef int miopenConvAlgorithm_t;
enum { miopenConvolutionAlgoGEMM = 0, miopenConvolutionAlgoDirect = 1,
       miopenConvolutionAlgoFFT = 2, miopenConvolutionAlgoWinograd = 3,
       miopenConvolutionAlgoImplicitGEMM = 5 };
typedef int miopenConvolutionAttrib_t;
enum { MIOPEN_CONVOLUTION_ATTRIB_FP16_ALT_IMPL = 0, MIOPEN_CONVOLUTION_ATTRIB_DETERMINISTIC = 1 };

typedef struct {
  float time;
  size_t workspace_size;
  uint64_t solution_id;
  miopenConvAlgorithm_t algorithm;
} miopenConvSolution_t;

typedef miopenStatus_t (*miopenGetVersion_fn)(size_t* major, size_t* minor, size_t* patch);
typedef const char* (*miopenGetErrorString_fn)(miopenStatus_t error);
typedef miopenStatus_t (*miopenCreate_fn)(miopenHandle_t* handle);
typedef miopenStatus_t (*miopenDestroy_fn)(miopenHandle_t handle);
typedef miopenStatus_t (*miopenSetStream_fn)(miopenHandle_t handle, miopenAcceleratorQueue_t q);

typedef miopenStatus_t (*miopenCreateTensorDescriptor_fn)(miopenTensorDescriptor_t* desc);
typedef miopenStatus_t (*miopenSetTensorDescriptor_fn)(miopenTensorDescriptor_t desc,
                                                       miopenDataType_t type, int nbDims,
                                                       const int* dims, const int* strides);
typedef miopenStatus_t (*miopenDestroyTensorDescriptor_fn)(miopenTensorDescriptor_t desc);

typedef miopenStatus_t (*miopenCreateConvolutionDescriptor_fn)(miopenConvolutionDescriptor_t* d);
typedef miopenStatus_t (*miopenInitConvolutionNdDescriptor_fn)(
    miopenConvolutionDescriptor_t d, int spatialDim, const int* pads, const int* strides,
    const int* dilations, miopenConvolutionMode_t mode);
typedef miopenStatus_t (*miopenSetConvolutionGroupCount_fn)(miopenConvolutionDescriptor_t d,
                                                            int groupCount);
typedef miopenStatus_t (*miopenSetConvolutionAttribute_fn)(miopenConvolutionDescriptor_t d,
                                                           miopenConvolutionAttrib_t attr,
                                                           int value);
typedef miopenStatus_t (*miopenDestroyConvolutionDescriptor_fn)(miopenConvolutionDescriptor_t d);

// The three directions share one shape of signature per step: (handle, a, b, conv, c, ...)
// with (a, b, c) = (w, x, y) forward, (dy, w, dx) backward-data, (dy, x, dw) backward-weights.
typedef miopenStatus_t (*miopenGetSolutionCount_fn)(miopenHandle_t h,
                                                    miopenTensorDescriptor_t a,
                                                    miopenTensorDescriptor_t b,
                                                    miopenConvolutionDescriptor_t conv,
                                                    miopenTensorDescriptor_t c, size_t* count);
typedef miopenStatus_t (*miopenGetSolution_fn)(miopenHandle_t h, miopenTensorDescriptor_t a,
                                               miopenTensorDescriptor_t b,
                                               miopenConvolutionDescriptor_t conv,
                                               miopenTensorDescriptor_t c, size_t maxCount,
                                               size_t* count, miopenConvSolution_t* solutions);
typedef miopenStatus_t (*miopenGetSolutionWorkspaceSize_fn)(miopenHandle_t h,
                                                            miopenTensorDescriptor_t a,
                                                            miopenTensorDescriptor_t b,
                                                            miopenConvolutionDescriptor_t conv,
                                                            miopenTensorDescriptor_t c,
                                                            uint64_t solution_id, size_t* bytes);
typedef miopenStatus_t (*miopenCompileSolution_fn)(miopenHandle_t h, miopenTensorDescriptor_t a,
                                                   miopenTensorDescriptor_t b,
                                                   miopenConvolutionDescriptor_t conv,
                                                   miopenTensorDescriptor_t c,
                                                   uint64_t solution_id);
// (handle, aDesc, a, bDesc, b, conv, cDesc, c, workspace, workspaceSize, solution_id)
typedef miopenStatus_t (*miopenImmediate_fn)(miopenHandle_t h, miopenTensorDescriptor_t aDesc,
                                             const void* a, miopenTensorDescriptor_t bDesc,
                                             const void* b, miopenConvolutionDescriptor_t conv,
                                             miopenTensorDescriptor_t cDesc, void* c,
                                             void* workspace, size_t workspaceSize,
                                             uint64_t solution_id);

typedef miopenStatus_t (*miopenConvolutionBackwardBias_fn)(miopenHandle_t h, const void* alpha,
                                                           miopenTensorDescriptor_t dyDesc,
                                                           const void* dy, const void* beta,
                                                           miopenTensorDescriptor_t dbDesc,
                                                           void* db);
// C = op(alpha1 * A, alpha2 * B) + beta * C, B broadcast over C
typedef miopenStatus_t (*miopenOpTensor_fn)(miopenHandle_t h, miopenTensorOp_t op,
                                            const void* alpha1, miopenTensorDescriptor_t aDesc,
                                            const void* A, const void* alpha2,
                                            miopenTensorDescriptor_t bDesc, const void* B,
                                            const void* beta, miopenTensorDescriptor_t cDesc,
                                            void* C);
typedef miopenStatus_t (*miopenSetTensor_fn)(miopenHandle_t h, miopenTensorDescriptor_t yDesc,
                                             void* y, const void* alpha);
typedef miopenStatus_t (*miopenScaleTensor_fn)(miopenHandle_t h, miopenTensorDescriptor_t yDesc,
                                               void* y, const void* alpha);
typedef miopenStatus_t (*miopenCreateActivationDescriptor_fn)(miopenActivationDescriptor_t* d);
typedef miopenStatus_t (*miopenSetActivationDescriptor_fn)(miopenActivationDescriptor_t d,
                                                           miopenActivationMode_t mode,
                                                           double alpha, double beta,
                                                           double gamma);
typedef miopenStatus_t (*miopenDestroyActivationDescriptor_fn)(miopenActivationDescriptor_t d);
// y = alpha * act(x) + beta * y
typedef miopenStatus_t (*miopenActivationForward_fn)(miopenHandle_t h,
                                                     miopenActivationDescriptor_t d,
                                                     const void* alpha,
                                                     miopenTensorDescriptor_t xDesc,
                                                     const void* x, const void* beta,
                                                     miopenTensorDescriptor_t yDesc, void* y);

}  // extern "C"
