// The per-call path of a convolution: arrays in through DLPack, a cached plan, execute.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <string>

#include "client/plan.hpp"
#include "client/shim.hpp"
#include "dlpack_intake.hpp"

namespace fdnn_core {

using fdnn_client::Shim;

// Everything about a convolution except its arrays, fixed once per distinct call pattern by
// the Python layer (which has validated it) and reused; `key` is its part of the plan key.
struct ConvSpec {
  fdnn_client::ConvParams params;
  std::string key;

  void finish();  // computes `key`; call after setting params
};

// The stream of a call, as the Python layer hands it over (a provider's streams(), see
// python/flux_dnn/providers.py). Two things that coincide on CUDA and ROCm but not on SYCL:
// the opaque pointer the shim enqueues on (FDNN's `stream`: a cudaStream_t, a sycl::queue*)
// and what the producers' __dlpack__(stream=...) takes (DLPack's stream int, a dpctl queue,
// None). Given as None (no stream: CPU), an int (both at once), or a pair
// (shim pointer int or None, __dlpack__'s stream argument or None).
struct CallStream {
  void* shim = nullptr;
  pybind11::handle dlpack;  // borrowed from the caller's argument, which outlives the call

  static CallStream of(pybind11::handle stream);  // TypeError naming `stream` when malformed
};

// Runs spec on the arrays (x, w, y as in the ABI; bias may be None). The written array(s)
// must already exist. `stream` as CallStream::of reads it. `workspace_alloc` is
// called with a byte count for GPU workspace and returns an array (None on the CPU, where
// the core keeps a per-thread buffer). Once its plan is cached, a call allocates nothing.
void run_conv(const Shim& shim, const ConvSpec& spec, pybind11::handle x, pybind11::handle w,
              pybind11::handle y, pybind11::handle bias, pybind11::handle stream,
              pybind11::handle workspace_alloc);

// The plan run_conv would run for these arguments (made and cached if needed, not executed):
// {"workspace_size", "algo_id", "algo_name"}. For tests and benchmarks.
pybind11::dict plan_info(const Shim& shim, const ConvSpec& spec, pybind11::handle x,
                         pybind11::handle w, pybind11::handle y, pybind11::handle bias,
                         pybind11::handle stream);

// What of an array a PackedConv holds later arrays to: shape, layout (the strides of dims
// longer than 1), dtype, data alignment and device; or that there is no array.
struct TensorSignature {
  bool present = false;
  int32_t ndim = 0;
  FDNN_DLDataType dtype{};
  int64_t shape[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};
  uint8_t alignment = 0;
  FDNN_DLDevice device{};

  static TensorSignature of(const BorrowedTensor& t);
  std::string mismatch(const TensorSignature& planned) const;  // "" when it fits
  bool fits(const BorrowedTensor& t) const;  // mismatch() would be "" (and nothing allocated)

 private:
  bool same_strides(const TensorSignature& planned) const;
};

// A forward convolution fixed for one set of shapes, strides, dtypes and device, whose
// weights the shim has packed into its own layout once (when it can: Conv_Plan_Pack_Weights
// is not NULL). Calls skip the plan cache and the weight reorder; the arrays are only
// compared with what was planned.
class PackedConv {
 public:
  PackedConv(const Shim& shim, const ConvSpec& spec, pybind11::handle x, pybind11::handle w,
             pybind11::handle y, pybind11::handle bias, pybind11::handle stream);
  // Runs the plan on x into y and returns y; y None (NumPy x only): into a new array with the
  // planned output's shape and layout. w: the weights again, for a plan that could not pack
  // them and was given them as a capsule (None: the array kept at planning).
  pybind11::object run(pybind11::handle x, pybind11::handle y, pybind11::handle bias,
                       pybind11::handle stream, pybind11::handle workspace_alloc,
                       pybind11::handle w) const;
  bool packed() const { return keep_w_.is_none(); }
  std::string algo_name() const { return plan_->algo_name; }

 private:
  pybind11::object allocated_output(pybind11::handle x, pybind11::handle y) const;
  pybind11::handle unpacked_weights(pybind11::handle w) const;

  std::shared_ptr<fdnn_client::Plan> plan_;
  // the caller's weights when the shim cannot pack (else None; a str when they came as a
  // capsule, which planning consumed)
  pybind11::object keep_w_;
  TensorSignature x_signature_, y_signature_, bias_signature_;
  bool keep_gil_ = false;  // small CPU work runs with the GIL held
};

}  // namespace fdnn_core
