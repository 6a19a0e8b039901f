// Element-wise work next to cuDNN's convolution, as small CUDA kernels of our own:
//  - the forward epilogue, the header's y = alpha * act(conv + bias) + beta * y_old, used
//    when the convolution engine itself takes no bias/activation (alpha_in_conv below);
//  - the bias gradient db = alpha * sum(dy over N and spatial) + beta * db_old.
// Strided over the ABI's logical tensors, so every layout works: the dims are visited in
// memory order (outermost first, merged where contiguous), so consecutive threads touch
// consecutive addresses in NCHW and NHWC alike, with 32-bit index math where the extents
// allow. Plain C++ interface: the rest of the shim needs no CUDA compiler.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace fdnn_cudnn {

enum class ElementType { kHalf, kBFloat16, kFloat, kDouble };

constexpr int kMaxEpilogueDims = 5;

struct StridedTensor {
  int ndim = 0;  // N, K, *spatial
  int64_t shape[kMaxEpilogueDims] = {};
  int64_t strides[kMaxEpilogueDims] = {};
};

struct EpilogueParams {
  ElementType type = ElementType::kFloat;
  StridedTensor y;
  int64_t bias_stride = 1;
  double alpha = 1.0;
  double beta = 0.0;
  // Whether cuDNN's convolution applied alpha already (its scale; then the epilogue scales
  // only the bias: alpha * conv + alpha * bias). Only without an activation: alpha scales
  // the activated value, so with one the convolution runs with scale 1 and alpha comes here,
  // after the activation.
  bool alpha_in_conv = true;
  int32_t activation = 0;  // FDNN_ACTIVATION_*
  float activation_alpha = 0.f;
  float activation_beta = 0.f;
};

// y = alpha * act(src + bias) + beta * y, alpha applied where alpha_in_conv says; src is the
// conv result (y itself when beta == 0). bias may be NULL.
cudaError_t launch_bias_activation(const EpilogueParams& p, void* y, const void* src,
                                   const void* bias, cudaStream_t stream);

// A copy between the caller's tensor and a compact one in the workspace, over dst's shape:
// dst's element at index i (per dim) is src's at i - lead, zero where that falls outside
// src (a zero-padded copy: lead >= 0), src's at i + |lead| for a crop (lead < 0). With beta
// != 0, dst = src + beta * dst_old (an output copied out after cuDNN wrote it with beta 0);
// with beta 0 the old dst is never read (it may hold NaN).
struct StridedCopy {
  ElementType type = ElementType::kFloat;
  StridedTensor dst;  // the shape walked, dst's strides
  StridedTensor src;  // src's shape (bounds) and strides
  int64_t lead[kMaxEpilogueDims] = {};
  double beta = 0.0;
};
cudaError_t launch_strided_copy(const StridedCopy& c, const void* src, void* dst,
                                cudaStream_t stream);

// Fills `bytes` of device memory with small finite values of both signs in every float type
// (every 16-bit word 0x3C00..0x3FFF or 0xBC00..0xBFFF, whatever the word's place in an
// element): stand-ins for benchmark operands that, unlike zeros, do not flatter engines
// whose speed depends on the data (power-limited tensor cores).
cudaError_t launch_fill_pattern(void* dst, size_t bytes, cudaStream_t stream);

// Bytes of scratch the bias gradient's first pass would use to fill the GPU (partial sums
// per chunk of rows and channel); with less, it uses fewer chunks, down to one block per
// channel with none.
size_t bias_gradient_scratch_bytes(const EpilogueParams& p);

// db = alpha * sum over all but dim 1 of dy + beta * db (p.y describes dy). Deterministic:
// a fixed split of the rows (decided by the shape and scratch_bytes alone) and a fixed
// reduction order, no atomics. scratch: scratch_bytes of device memory (may be 0).
cudaError_t launch_bias_gradient(const EpilogueParams& p, const void* dy, void* db,
                                 void* scratch, size_t scratch_bytes, cudaStream_t stream);

}  // namespace fdnn_cudnn
