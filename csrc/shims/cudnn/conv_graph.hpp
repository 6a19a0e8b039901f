// The cuDNN operation graph of one convolution (graph API): tensors x, w, y with their
// real strides, a convolution descriptor with pre- and post-paddings (asymmetric padding
// is native here, which the legacy cudnnConvolution* API cannot express), and one
// forward / backward-data / backward-filter operation.
#pragma once

#include <vector>

#include "backend.hpp"
#include "problem.hpp"

namespace fdnn_cudnn {

// Unique ids of the graph's tensors, the keys of a variant pack.
enum : int64_t { kUidX = 1, kUidW = 2, kUidY = 3 };

struct ConvGraph {
  DescPtr graph;
  std::vector<DescPtr> parts;  // tensors, conv and op descriptors the graph refers to
};

// Scales baked into the cuDNN operation: the epilogue may take alpha/beta over instead.
struct ConvScales {
  double alpha = 1.0;
  double beta = 0.0;
};

ConvGraph build_conv_graph(const ConvProblem& p, ConvScales scales, cudnnHandle_t handle);

}  // namespace fdnn_cudnn
