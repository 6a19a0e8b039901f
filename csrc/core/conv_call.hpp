// The per-call path of a convolution: arrays in through DLPack, a cached plan, execute.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <string>

#include "flux_dnn/flux_dnn.h"

namespace fdnn_core {

class ShimLibrary;

// Everything about a convolution except its arrays, fixed once per distinct call pattern by
// the Python layer (which has validated it) and reused; `key` is its part of the plan key.
struct ConvSpec {
  FDNN_ConvOp op = FDNN_CONV_FORWARD;
  int32_t spatial_rank = 2;
  int64_t stride[FDNN_MAX_SPATIAL_DIMS] = {1, 1, 1};
  int64_t dilation[FDNN_MAX_SPATIAL_DIMS] = {1, 1, 1};
  int64_t padding_lo[FDNN_MAX_SPATIAL_DIMS] = {};
  int64_t padding_hi[FDNN_MAX_SPATIAL_DIMS] = {};
  int64_t groups = 1;
  float alpha = 1.f, beta = 0.f;
  FDNN_Activation activation = FDNN_ACTIVATION_NONE;
  float activation_alpha = 0.f, activation_beta = 0.f;
  uint32_t flags = 0;
  FDNN_AlgoPolicy algo_policy = FDNN_ALGO_HEURISTIC;
  int64_t algo_id = 0;
  size_t workspace_limit = SIZE_MAX;
  std::string key;  // filled by finish()

  void finish();  // computes `key`; call after setting the fields
};

struct ConvResult {
  size_t workspace_size;
  int64_t algo_id;
  std::string algo_name;
};

// Runs spec on the arrays (x, w, y as in the ABI; bias may be None). The written array(s)
// must already exist. `stream` is an int (GPU stream handle) or None. `workspace_alloc` is
// called with a byte count for GPU workspace and returns an array (None on the CPU, where
// the core keeps a per-thread buffer).
ConvResult run_conv(const ShimLibrary& shim, const ConvSpec& spec, pybind11::handle x,
                    pybind11::handle w, pybind11::handle y, pybind11::handle bias,
                    pybind11::handle stream, pybind11::handle workspace_alloc);

struct Plan;

// A forward convolution fixed for one set of shapes, strides, dtypes and device, whose
// weights the shim has packed into its own layout once (when it can: ABI >= 1.1). Calls skip
// the plan cache and the weight reorder; the arrays are only compared with what was planned.
class PackedConv {
 public:
  PackedConv(const ShimLibrary& shim, const ConvSpec& spec, pybind11::handle x,
             pybind11::handle w, pybind11::handle y, pybind11::handle bias,
             pybind11::handle stream);
  ConvResult run(pybind11::handle x, pybind11::handle y, pybind11::handle bias,
                 pybind11::handle stream, pybind11::handle workspace_alloc) const;
  bool packed() const { return keep_w_.is_none(); }
  std::string algo_name() const;

 private:
  std::shared_ptr<Plan> plan_;
  pybind11::object keep_w_;  // the caller's weights when the shim cannot pack (else None)
  std::string x_signature_, y_signature_, bias_signature_;
};

}  // namespace fdnn_core
