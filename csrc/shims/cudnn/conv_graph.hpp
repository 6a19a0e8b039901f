// The cuDNN operation graph of one convolution (graph API): tensors x, w, y with their
// real strides (or the compact copies of staged ones), each with its own alignment, a
// convolution descriptor with pre- and post-paddings (asymmetric padding can be expressed
// here, which the legacy cudnnConvolution* API cannot, though cuDNN may have no engine for
// it: the plan then pads a copy), and one forward / backward-data / backward-filter
// operation. cuDNN refusing a part of the graph (NOT_SUPPORTED, BAD_PARAM) is
// Failure(UNSUPPORTED) with cuDNN's text; other failures are Failure(VENDOR).
#pragma once

#include <vector>

#include "backend.hpp"
#include "problem.hpp"

namespace fdnn_cudnn {

// Unique ids of the graph's tensors, the keys of a variant pack; virtual (intermediate)
// tensors of a fused graph count up from kUidVirtual.
enum : int64_t { kUidX = 1, kUidW = 2, kUidY = 3, kUidBias = 4, kUidVirtual = 100 };

struct ConvGraph {
  DescPtr graph;
  std::vector<DescPtr> parts;  // tensors, conv and op descriptors the graph refers to
  bool fused = false;          // bias and activation are inside the graph
  bool binds_bias = false;     // the bias tensor is an operand (variant pack entry)
};

// Scales baked into the cuDNN operation: the epilogue may take alpha/beta over instead.
struct ConvScales {
  double alpha = 1.0;
  double beta = 0.0;
};

ConvGraph build_conv_graph(const ConvProblem& p, ConvScales scales, cudnnHandle_t handle);

// Whether the forward epilogue can go into cuDNN's graph: conv -> + bias -> activation,
// with alpha 1 and beta 0 (the shapes cuDNN's fusion engines take; anything else uses our
// epilogue kernel after an unfused convolution).
bool can_fuse_epilogue(const ConvProblem& p);

// conv -> (add bias) -> (activation) -> y, intermediates virtual in float32. Throws when
// cuDNN refuses the graph.
ConvGraph build_fused_graph(const ConvProblem& p, cudnnHandle_t handle);

}  // namespace fdnn_cudnn
