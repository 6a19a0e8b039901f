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
  int64_t alignment = 16;        // bytes cuDNN may assume of its data pointer
};

// A tensor in the ABI's view (1 to 3 spatial dims), for the epilogue kernels.
struct LogicalTensor {
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  size_t span_bytes = 0;  // bytes from the first element to one past the last
};

// One of the graph's x, w, y (in backward-data x is dx, in backward-weight w is dw, and y is
// dy in both) as it reaches cuDNN: the caller's memory, or a compact copy in the workspace,
// copied in before the convolution (an operand it reads) or out after it (the one it writes).
struct Operand {
  LogicalTensor user;          // the caller's tensor (size-1 strides canonical)
  bool channels_last = false;  // its memory order (its own, or the problem's)
  int64_t user_alignment = 16;  // of the caller's data pointer, as seen at plan time
  bool staged = false;
  LogicalTensor compact;       // staged: the copy, compact (x: with the padding copied in)
  std::vector<int64_t> lead;   // staged: elements of zero padding before the caller's, per dim
  Geometry cudnn;              // what the graph describes: the caller's tensor or the copy
  const LogicalTensor& seen() const { return staged ? compact : user; }
  bool padded() const { return staged && compact.shape != user.shape; }
};

enum class Role { kX = 0, kW = 1, kY = 2 };

struct ConvProblem {
  int32_t op = FDNN_CONV_FORWARD;  // FDNN_CONV_*
  int device = 0;
  FDNN_DLDataType abi_dtype{};
  cudnnDataType_t dtype = CUDNN_DATA_FLOAT;
  cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  size_t element_size = 4;
  // cuDNN's convolution kernels want w in x's memory order (KCRS with NCHW, KRSC with NHWC):
  // a w in another order is staged in x's order.
  Operand x, w, y;
  Geometry bias;  // 1, K, 1, ... (only when has_bias with a positive stride)
  std::vector<int64_t> stride, dilation, pad_lo, pad_hi;  // cuDNN spatial dims
  // The padding copied into staged x (or cropped off a staged dx): cuDNN then pads
  // min(lo, hi) on both sides.
  bool padded_copy = false;
  bool has_bias = false;
  int64_t bias_stride = 1;  // elements between consecutive bias values; 0: one repeated
  double alpha = 1.0;
  double beta = 0.0;
  int32_t activation = FDNN_ACTIVATION_NONE;  // FDNN_ACTIVATION_*
  float activation_alpha = 0.f;
  float activation_beta = 0.f;
  uint32_t flags = 0;
  bool fallback = false;    // the staged problem, planned because cuDNN refused the given one
  std::string description;  // the conv parameters, for error messages

  bool deterministic() const { return flags & FDNN_CONV_DETERMINISTIC; }
  bool reduced_precision_allowed() const { return flags & FDNN_CONV_ALLOW_REDUCED_PRECISION; }
  bool is_double() const { return dtype == CUDNN_DATA_DOUBLE; }
  const Operand& operand(Role r) const { return r == Role::kX ? x : r == Role::kW ? w : y; }
  // The operand the op writes: y, dx or dw.
  Role output_role() const {
    return op == FDNN_CONV_FORWARD ? Role::kY
                                   : op == FDNN_CONV_BACKWARD_DATA ? Role::kX : Role::kW;
  }
  const Operand& output() const { return operand(output_role()); }
  // Bytes from the bias's first element to one past its last (one element when repeated).
  size_t bias_span_bytes() const {
    if (!has_bias) return 0;
    int64_t k = w.user.shape[0];
    int64_t step = bias_stride < 0 ? -bias_stride : bias_stride;
    return static_cast<size_t>((k - 1) * step + 1) * element_size;
  }
  bool has_epilogue() const {
    return op == FDNN_CONV_FORWARD && (has_bias || activation != FDNN_ACTIVATION_NONE);
  }
  // The epilogue needs the conv result apart from y when y's old value is still needed
  // under an activation. Without one, y = alpha * conv + beta * y_old is cuDNN's own
  // scaling, and the bias is added in place afterwards (no scratch). A staged y is that
  // scratch already: beta is applied when it is copied out.
  bool needs_conv_scratch() const {
    return has_epilogue() && beta != 0.0 && activation != FDNN_ACTIVATION_NONE && !y.staged;
  }
};

// Translates arguments that passed fdnn_shim::check_conv_problem and check_covered into
// cuDNN's terms: the problem as given (x and y as they are, w in x's memory order); throws
// Failure(UNSUPPORTED) for an accumulation type cuDNN does not offer.
ConvProblem read_problem(const FDNN_Conv_Plan_Create_Args& args);

// Whether cuDNN can be given the problem: no operand it reads in place repeats an element
// (stride 0, which the ABI allows on what the op only reads; cuDNN takes positive strides),
// and it is not a weight gradient with asymmetric padding (computed wrongly by cuDNN 9.19).
bool cudnn_can_take(const ConvProblem& p);

// The fallback for a problem cuDNN refuses: every operand that is not compact in its own
// memory order (gaps, repeated elements, odd orders) staged compactly in that order, and,
// for padding that differs before and after, x staged with the difference zero-padded in
// (forward, backward-weight) or dx computed into such a buffer and cropped out
// (backward-data), cuDNN padding min(lo, hi) on both sides. False when nothing would change.
bool stage_for_fallback(ConvProblem* p);

// The no-scratch variant: cuDNN is given the caller's w in its own memory order instead of a
// copy in x's (fewer engines take mixed orders, but it needs no workspace of ours). False
// when cuDNN cannot take the caller's w (a repeated element).
bool use_w_unstaged(ConvProblem* p);

// What is staged, in words, for the algorithm name ("dx (padded copy), w (compact copy)").
std::string staging_text(const ConvProblem& p);

}  // namespace fdnn_cudnn
