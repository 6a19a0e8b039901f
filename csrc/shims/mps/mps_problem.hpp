// The MPS shim's decisions that need no Apple SDK: what this macOS version lets MPSGraph do
// (capabilities, with the reasons for what it does not), the refusals of problems MPSGraph
// is known to get wrong, and how each tensor of a problem reaches the graph (its logical
// shape, the order of its dims in memory, whether its strides leave gaps, which element of
// the bound buffer range each logical element is). Plain C++, compiled and unit-tested on
// Linux (tests/mps_logic/); mps_shim.mm only turns a ProblemPlan into MPSGraph calls.
//
// How a tensor reaches the graph: every tensor is bound as a 1-D buffer range of `span`
// elements starting at its first element (data + byte_offset), and the graph turns that
// range into the logical tensor itself: a reshape and a transpose when the strides are a
// dense layout in some dim order (NCHW, channels-last, any permutation), a gather with
// constant indices when they leave gaps. So the graph, compiled once per plan, is the same
// whatever the byte offset at execute; only the binding of the range differs (see Binding).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "flux_dnn/flux_dnn.h"
#include "shim_common.hpp"

namespace fdnn_mps {

// The macOS version the shim runs on (NSProcessInfo's operatingSystemVersion).
struct OsVersion {
  int major = 0;
  int minor = 0;
  bool at_least(int want_major, int want_minor) const {
    return major > want_major || (major == want_major && minor >= want_minor);
  }
};

// What MPSGraph offers by OS version, from Apple's documentation and PyTorch's guards.
inline bool has_graph_executables(OsVersion os) { return os.at_least(13, 0); }  // our floor
inline bool has_conv3d(OsVersion os) { return os.at_least(13, 2); }
inline bool has_bfloat16(OsVersion os) { return os.at_least(14, 0); }
// MPSNDArray initWithBuffer:offset:descriptor: (a view of a buffer at an offset).
inline bool has_ndarray_views(OsVersion os) { return os.at_least(15, 0); }
// Convolution in NHWC without a transpose of its own (PyTorch keeps channels-last from 15.0).
inline bool has_native_nhwc(OsVersion os) { return os.at_least(15, 0); }
// Before 15.1 the convolution kernels mishandle output dims above 65536 (PyTorch refuses them).
inline bool has_large_outputs(OsVersion os) { return os.at_least(15, 1); }

constexpr int64_t kMaxOutputDimBefore15_1 = 65536;
// MPSGraph's 2-D forward convolution miscomputes filter dims >= 256 (PyTorch's Convolution.mm
// routes exactly those, 4-D input with a 2-D filter dim >= 256, to a Metal kernel of its own;
// its backward ops and 3-D keep MPSGraph).
constexpr int64_t kMaxFilterDim2dForward = 255;
constexpr int64_t kMaxElements = INT32_MAX;     // MPSGraph indexes tensors with int32
// MPS aborts the process ("total bytes of NDArray > 2**32") when an MPSNDArray of more bytes
// is made; the shim makes one for every staged range and every view (see Binding).
constexpr uint64_t kMaxNDArrayBytes = uint64_t{1} << 32;

// ------------------------------------------------------------------------------------------
// The Metal device: PyTorch's rule (aten/src/ATen/mps/MPSDevice.mm) over MTLCopyAllDevices():
// skip low-power GPUs and those without MTLGPUFamilyMac2, which a virtual machine's device
// fails; also skip the virtual machines' "Apple Paravirtual device" by name, since GitHub's
// hosted macOS runners expose one and MPS is not supported there.
struct DeviceTraits {
  std::string name;
  bool low_power = false;
  bool supports_mac2 = false;
};
struct DeviceChoice {
  int index = -1;      // into the devices given; -1: none is usable
  std::string reason;  // when none: why, naming each device skipped
};
DeviceChoice choose_device(const std::vector<DeviceTraits>& devices);

// Conv_Capabilities for this OS: float32 and float16 always, bfloat16 on macOS >= 14,
// spatial ranks 1 and 2 (1-D as 2-D), 3 on macOS >= 13.2, every activation on FORWARD,
// groups, dilation, alpha/beta, bias gradient, asymmetric padding (the descriptor's own
// left/right/top/bottom/front/back fields). Nothing below macOS 13.
fdnn_shim::Capabilities capabilities(OsVersion os, int32_t op, FDNN_DLDataType dtype);

// Why the shim cannot run on this OS, or nullptr (static storage).
const char* os_unavailable_reason(OsVersion os);

// MPSGraph's data types (MPSDataType), by the values Apple documents.
enum class GraphDtype : uint32_t {
  kFloat32 = 0x10000020u,
  kFloat16 = 0x10000010u,
  kBFloat16 = 0x90000010u,  // MPSDataTypeAlternateEncodingBit | MPSDataTypeFloat16
  kInt32 = 0x20000020u,
};

// How one tensor's buffer range is bound at execute, decided per call from its byte offset.
enum class Binding {
  kDirect,  // offset 0: the caller's MTLBuffer, from its start
  kView,    // an MPSNDArray view at the offset (macOS >= 15, never for weights)
  kStaged,  // a blit copy through one of the plan's own buffers (inputs before the graph,
            // outputs after it)
};

// One tensor of the problem, as the graph sees it.
struct TensorPlan {
  bool present = false;
  std::vector<int64_t> shape;   // logical: N, C, *spatial (or K, C/g, *kernel); 1-D as 2-D
  std::vector<int> memory_order;  // logical dims, outermost first (largest stride first)
  bool dense = true;              // strides are a dense layout in memory_order: no gaps
  int64_t count = 0;              // elements of the tensor
  int64_t span = 0;               // elements of the buffer range: 1 + sum (shape-1)*stride
  // When !dense: for each element in logical row-major order, its index in the range.
  std::vector<int32_t> gather_index;
  // The shape in memory order (memory_order applied), what the range reshapes to when dense.
  std::vector<int64_t> memory_shape() const;
  // The permutation that takes the memory-order tensor to the logical one (MPSGraph's
  // transposeTensor:permutation: semantics: result dim i is input dim perm[i]).
  std::vector<int> memory_to_logical() const;
  bool is_identity_order() const;
};

// Whether a (logical N, C, *spatial) tensor is channels-last in memory: C innermost and the
// others in order.
bool is_channels_last(const TensorPlan& t);

// The layout the convolution is given (MPSGraphTensorNamedDataLayout values, Apple's
// numbering): data NCHW 0 / NHWC 1 / NCDHW 7 / NDHWC 8; weights OIHW 2 / OIDHW 9.
enum class GraphLayout : int {
  kNCHW = 0,
  kNHWC = 1,
  kOIHW = 2,
  kNCDHW = 7,
  kNDHWC = 8,
  kOIDHW = 9,
};

// Everything the .mm needs to build and bind one plan's graph.
struct ProblemPlan {
  int32_t op = FDNN_CONV_FORWARD;
  int graph_rank = 2;  // 2 or 3: the MPSGraph convolution used (1-D problems run as 2-D)
  GraphDtype dtype = GraphDtype::kFloat32;
  size_t element_size = 4;
  // 16-bit inputs cast to float32 inside the graph: compute_type float32 was asked for, or an
  // epilogue follows the convolution (see conv_in_float32).
  bool compute_in_float32 = false;
  // x, w, y (dy for the backwards) and bias, logical shapes in graph rank.
  TensorPlan x, w, y, bias;
  // The data layout the convolution is given; NHWC/NDHWC only where the OS runs it natively
  // and the activation tensor is channels-last.
  GraphLayout data_layout = GraphLayout::kNCHW;
  GraphLayout weights_layout = GraphLayout::kOIHW;
  // Per graph spatial dim, outermost first (D, H, W or H, W).
  int64_t stride[3] = {1, 1, 1};
  int64_t dilation[3] = {1, 1, 1};
  int64_t pad_lo[3] = {0, 0, 0};  // top/front/left by dim
  int64_t pad_hi[3] = {0, 0, 0};  // bottom/back/right by dim
  int64_t groups = 1;
  float alpha = 1.f, beta = 0.f;
  int32_t activation = FDNN_ACTIVATION_NONE;
  float activation_alpha = 0.f, activation_beta = 0.f;
  // The tensor the op writes (y, x or w) and, on BACKWARD_WEIGHT, the bias gradient.
  const TensorPlan& written() const;
  bool writes_bias_gradient() const { return op == FDNN_CONV_BACKWARD_WEIGHT && bias.present; }
  // Whether the graph reads the old contents of a written tensor: beta != 0, or gaps that
  // the write-back must keep.
  bool reads_old(const TensorPlan& out) const { return beta != 0.f || !out.dense; }
  std::string name;  // for the plan's algo_name
};

// Whether the convolution of a 16-bit problem must run in float32: when compute_type asks,
// or when anything follows it (bias, an activation, alpha != 1, beta != 0). MPSGraph's
// convolution returns its source's type, so a float16 result would be rounded there and again
// after the float32 epilogue: two roundings where the ABI promises one.
bool conv_in_float32(const FDNN_Conv_Plan_Create_Args& a);

// Checks a problem (already through fdnn_shim::check_conv_problem) against this OS and
// MPSGraph's limits and describes it for the graph; FDNN_ERROR_UNSUPPORTED with the reason
// for anything capabilities do not cover or MPSGraph is known to get wrong.
ProblemPlan plan_problem(const FDNN_Conv_Plan_Create_Args& a, OsVersion os);

// Bytes of the range a TensorPlan is bound as.
inline size_t span_bytes(const TensorPlan& t, size_t element_size) {
  return static_cast<size_t>(t.span) * element_size;
}

// How a tensor is bound this call. Weights are never viewed: MPSGraph miscomputes
// convolutions on weight views (PyTorch copies them dense for the same reason), and a written
// dw is staged too until a Mac shows that writing a weight view is right.
Binding binding_for(uint64_t byte_offset, bool is_weight, OsVersion os);

// How a written tensor is bound this call: staged whenever the graph also reads it (beta,
// gaps to keep), else as binding_for says.
Binding output_binding(const ProblemPlan& p, const TensorPlan& out, uint64_t byte_offset, OsVersion os);

// Refuses (FDNN_ERROR_UNSUPPORTED, naming the size) a range that would be bound through an
// MPSNDArray (a view or a staged copy) of more than kMaxNDArrayBytes: MPS aborts on those.
void check_ndarray_size(const char* name, const TensorPlan& t, size_t element_size, Binding binding);

// Bytes of the plan's own buffers a call can need at most on this OS (every input staged
// where the OS has no views, every written tensor staged), for the plan's description.
size_t max_staging_bytes(const ProblemPlan& p, OsVersion os);

}  // namespace fdnn_mps
