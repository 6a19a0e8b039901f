// One convolution as the shim sees it: the ABI's arguments, checked by the rules every shim
// shares (shim_common), translated into cuDNN's terms (data types, at least 2 spatial dims,
// positive strides), plus what the epilogue (bias, activation, beta) and the bias gradient
// need. Built once per plan.
#pragma once

#include <string>
#include <vector>

#include "cudnn_lib.hpp"
#include "shim_common.hpp"

namespace fdnn_cudnn {

// A tensor in cuDNN's view: N, C, *spatial with at least 2 spatial dims.
struct Geometry {
  std::vector<int64_t> dims;
  std::vector<int64_t> strides;  // elements
};

// A tensor in the ABI's view (1 to 3 spatial dims), for the epilogue kernels.
struct LogicalTensor {
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  size_t span_bytes = 0;  // bytes from the first element to one past the last
};

struct ConvProblem {
  int32_t op = FDNN_CONV_FORWARD;  // FDNN_CONV_*
  int device = 0;
  FDNN_DLDataType abi_dtype{};
  cudnnDataType_t dtype = CUDNN_DATA_FLOAT;
  cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  size_t element_size = 4;
  Geometry x, w, y, bias;  // bias: 1, K, 1, ... (only when has_bias)
  LogicalTensor x_logical, w_logical, y_logical;
  std::vector<int64_t> stride, dilation, pad_lo, pad_hi;  // cuDNN spatial dims
  bool has_bias = false;
  int64_t bias_stride = 1;  // elements between consecutive bias values; 0: one repeated
  double alpha = 1.0;
  double beta = 0.0;
  int32_t activation = FDNN_ACTIVATION_NONE;  // FDNN_ACTIVATION_*
  float activation_alpha = 0.f;
  float activation_beta = 0.f;
  uint32_t flags = 0;
  // cuDNN's convolution kernels want w in x's memory order (KCRS with NCHW, KRSC with
  // NHWC). A w in another order is copied into the workspace in x's order (w_staged).
  bool stage_w = false;
  LogicalTensor w_staged;
  bool x_channels_last = false;  // the memory order of x (its own, or the problem's)
  bool w_channels_last = false;  // the memory order of the caller's w
  int64_t alignment = 16;    // bytes cuDNN may assume for every data pointer
  std::string description;  // the conv parameters, for error messages

  bool deterministic() const { return flags & FDNN_CONV_DETERMINISTIC; }
  bool reduced_precision_allowed() const { return flags & FDNN_CONV_ALLOW_REDUCED_PRECISION; }
  bool is_double() const { return dtype == CUDNN_DATA_DOUBLE; }
  // Bytes from the bias's first element to one past its last (one element when repeated).
  size_t bias_span_bytes() const {
    if (!has_bias) return 0;
    int64_t k = w_logical.shape[0];
    int64_t step = bias_stride < 0 ? -bias_stride : bias_stride;
    return static_cast<size_t>((k - 1) * step + 1) * element_size;
  }
  bool has_epilogue() const {
    return op == FDNN_CONV_FORWARD && (has_bias || activation != FDNN_ACTIVATION_NONE);
  }
  // The epilogue needs the conv result apart from y when y's old value is still needed
  // under an activation. Without one, y = alpha * conv + beta * y_old is cuDNN's own
  // scaling, and the bias is added in place afterwards (no scratch).
  bool needs_conv_scratch() const {
    return has_epilogue() && beta != 0.0 && activation != FDNN_ACTIVATION_NONE;
  }
};

// Translates arguments that passed fdnn_shim::check_conv_problem and check_covered into
// cuDNN's terms; throws Failure(UNSUPPORTED) for what cuDNN itself cannot take (an
// accumulation type it does not offer, a non-positive stride in a dim of size > 1).
ConvProblem read_problem(const FDNN_Conv_Plan_Create_Args& args);

// The no-scratch variant: cuDNN is given the caller's w in its own memory order instead of a
// copy in x's (fewer engines take mixed orders, but it needs no workspace of ours).
void use_w_unstaged(ConvProblem* p);

}  // namespace fdnn_cudnn
